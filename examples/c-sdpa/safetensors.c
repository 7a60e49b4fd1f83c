/* Reading and writing safetensors files: see safetensors.h. */
#include "safetensors.h"
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[ST_NDTYPES] = {"F64", "F32", "F16", "BF16", "I64", "I32", "U8", "BOOL"};
static const size_t SIZES[ST_NDTYPES] = {8, 4, 2, 2, 8, 4, 1, 1};

const char *st_dtype_name(st_dtype d) { return d < ST_NDTYPES ? NAMES[d] : "?"; }
size_t st_itemsize(st_dtype d) { return d < ST_NDTYPES ? SIZES[d] : 0; }
int st_is_float(st_dtype d) { return d == ST_F64 || d == ST_F32 || d == ST_F16 || d == ST_BF16; }
int st_is_int(st_dtype d) { return d == ST_I64 || d == ST_I32 || d == ST_U8; }

int st_dtype_parse(const char *name, st_dtype *out)
{
    int i;
    for (i = 0; i < ST_NDTYPES; i++)
        if (strcmp(name, NAMES[i]) == 0) {
            *out = (st_dtype)i;
            return 0;
        }
    return -1;
}

static int say(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- little-endian decoding and float conversions ---- */

static uint64_t le(const unsigned char *p, size_t n)
{
    uint64_t x = 0;
    while (n--) x = (x << 8) | p[n];
    return x;
}

static void put_le(unsigned char *p, uint64_t x, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++, x >>= 8) p[i] = (unsigned char)(x & 0xFF);
}

double st_from_f32(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return (double)f;
}

double st_from_bf16(uint16_t h) { return st_from_f32((uint32_t)h << 16); }

double st_from_f16(uint16_t h)
{
    int e = (h >> 10) & 0x1F;
    unsigned mant = h & 0x3FFu;
    double x;
    if (e == 0x1F) x = mant ? NAN : INFINITY;
    else if (e == 0) x = ldexp((double)mant, -24);
    else x = ldexp((double)(mant | 0x400u), e - 25);
    return (h & 0x8000u) ? -x : x;
}

/* The bits of the binary float with `mbits` stored mantissa bits and `ebits` exponent bits
 * nearest to x (ties to even), from x's own bits in one rounding. */
static uint64_t to_binary(double x, int mbits, int ebits)
{
    uint64_t b, sign_bit, mant, sig, q, rem, half, r;
    const uint64_t inf = (((uint64_t)1 << ebits) - 1) << mbits;
    const int bias = (1 << (ebits - 1)) - 1, emin = 1 - bias;
    int e, shift;
    memcpy(&b, &x, sizeof b);
    sign_bit = (b >> 63) << (mbits + ebits);
    e = (int)((b >> 52) & 0x7FF);
    mant = b & (((uint64_t)1 << 52) - 1);
    if (e == 0x7FF) return sign_bit | inf | (mant ? (uint64_t)1 << (mbits - 1) : 0); /* NaN is quiet */
    if (e == 0) return sign_bit; /* zero, or a double subnormal: far below half the smallest subnormal */
    e -= 1023;
    if (e > bias) return sign_bit | inf;
    sig = mant | ((uint64_t)1 << 52);
    shift = 52 - mbits + (e < emin ? emin - e : 0);
    if (shift > 53) return sign_bit; /* below half the smallest subnormal */
    q = sig >> shift;
    rem = sig & (((uint64_t)1 << shift) - 1);
    half = (uint64_t)1 << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) q++;
    /* a normal result stores the exponent and drops the implicit bit; a carry out of the
     * mantissa moves into the exponent (and past the largest finite value into infinity) */
    r = e >= emin ? ((uint64_t)(e + bias) << mbits) + (q - ((uint64_t)1 << mbits)) : q;
    return sign_bit | (r >= inf ? inf : r);
}

uint16_t st_to_f16(double x) { return (uint16_t)to_binary(x, 10, 5); }
uint16_t st_to_bf16(double x) { return (uint16_t)to_binary(x, 7, 8); }
uint32_t st_to_f32(double x) { return (uint32_t)to_binary(x, 23, 8); }

double st_get_f64(const st_tensor *t, size_t i)
{
    const unsigned char *p = t->data + i * SIZES[t->dtype];
    uint64_t bits;
    double d;
    switch (t->dtype) {
    case ST_F64:
        bits = le(p, 8);
        memcpy(&d, &bits, sizeof d);
        return d;
    case ST_F32: return st_from_f32((uint32_t)le(p, 4));
    case ST_F16: return st_from_f16((uint16_t)le(p, 2));
    case ST_BF16: return st_from_bf16((uint16_t)le(p, 2));
    default: return (double)st_get_i64(t, i);
    }
}

int64_t st_get_i64(const st_tensor *t, size_t i)
{
    const unsigned char *p = t->data + i * SIZES[t->dtype];
    uint64_t u;
    switch (t->dtype) {
    case ST_I64:
        u = le(p, 8);
        return u >> 63 ? -(int64_t)(~u) - 1 : (int64_t)u;
    case ST_I32:
        u = le(p, 4);
        return u >> 31 ? -(int64_t)(~u & 0xFFFFFFFFu) - 1 : (int64_t)u;
    case ST_U8:
    case ST_BOOL: return p[0];
    default: return 0;
    }
}

/* ---- reading ---- */

void st_free(st_file *f)
{
    size_t i;
    if (!f) return;
    for (i = 0; i < f->ntensors; i++) free(f->tensors[i].name);
    for (i = 0; i < f->nmeta; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->tensors);
    free(f->meta_keys);
    free(f->meta_values);
    free(f->buf);
    memset(f, 0, sizeof *f);
}

static char *dup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

typedef struct {
    size_t begin, end, index;
} span;

static int by_begin(const void *a, const void *b)
{
    const span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->index < y->index ? -1 : 1);
}

/* One header entry `e` named `name` into t; its byte span into s. */
static int entry(const char *where, const char *name, const jvalue *e, size_t data_size, st_tensor *t,
                 span *s, char *err, size_t errlen)
{
    const jvalue *dt = json_get(e, "dtype"), *shape = json_get(e, "shape"), *off = json_get(e, "data_offsets");
    long long begin, end, dim;
    size_t i, count = 1, nbytes;
    int zero = 0;
    if (!dt || !shape || !off || e->len != 3)
        return say(err, errlen, "%s: tensor '%s': expected an object with exactly dtype, shape and data_offsets",
                   where, name);
    if (dt->type != J_STR || st_dtype_parse(dt->str, &t->dtype))
        return say(err, errlen, "%s: tensor '%s': dtype is not one of F64 F32 F16 BF16 I64 I32 U8 BOOL", where, name);
    if (shape->type != J_ARR || shape->len > ST_MAX_RANK)
        return say(err, errlen, "%s: tensor '%s': shape must be a list of at most %d integers", where, name,
                   ST_MAX_RANK);
    if (off->type != J_ARR || off->len != 2 || json_int(&off->items[0], 0, (long long)data_size, &begin)
        || json_int(&off->items[1], begin, (long long)data_size, &end))
        return say(err, errlen, "%s: tensor '%s': data_offsets must be [begin, end] with 0 <= begin <= end <= %lu "
                   "(the data's size)", where, name, (unsigned long)data_size);
    t->rank = (int)shape->len;
    for (i = 0; i < shape->len; i++) {
        if (json_int(&shape->items[i], 0, (long long)1 << 40, &dim))
            return say(err, errlen, "%s: tensor '%s': shape entries must be integers in [0, 2^40]", where, name);
        t->shape[i] = (size_t)dim;
        if (dim == 0) zero = 1;
    }
    /* the element count, checked against the data's size before any multiplication overflows */
    if (zero) {
        count = 0;
    } else {
        for (i = 0; i < shape->len; i++) {
            if (count > data_size / SIZES[t->dtype] / t->shape[i])
                return say(err, errlen, "%s: tensor '%s': its shape needs more bytes than the file holds", where,
                           name);
            count *= t->shape[i];
        }
    }
    nbytes = count * SIZES[t->dtype];
    if (nbytes != (size_t)(end - begin))
        return say(err, errlen, "%s: tensor '%s': its shape of %s needs %lu bytes, data_offsets span %lu", where,
                   name, NAMES[t->dtype], (unsigned long)nbytes, (unsigned long)(end - begin));
    t->count = count;
    s->begin = (size_t)begin;
    s->end = (size_t)end;
    return 0;
}

int st_read(const char *path, st_file *f, char *err, size_t errlen)
{
    FILE *fp;
    long fsize;
    unsigned char lenbuf[8];
    uint64_t hlen;
    char *header = NULL;
    jvalue root;
    size_t data_size, i, nt = 0, expect;
    span *spans = NULL;
    char jerr[200];
    int rc = -1;

    memset(f, 0, sizeof *f);
    memset(&root, 0, sizeof root);
    fp = fopen(path, "rb");
    if (!fp) return say(err, errlen, "%s: cannot open", path);
    if (fseek(fp, 0, SEEK_END) != 0 || (fsize = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0) {
        say(err, errlen, "%s: cannot determine its size", path);
        goto done;
    }
    if (fsize < 8 || fread(lenbuf, 1, 8, fp) != 8) {
        say(err, errlen, "%s: %ld bytes, too short for a safetensors header (at least 8)", path, fsize);
        goto done;
    }
    hlen = le(lenbuf, 8);
    if (hlen > ST_MAX_HEADER || hlen > (uint64_t)fsize - 8) {
        say(err, errlen, "%s: header length %llu exceeds %s (%ld bytes)", path, (unsigned long long)hlen,
            hlen > (uint64_t)fsize - 8 ? "the file" : "the limit of 16 MiB", fsize);
        goto done;
    }
    data_size = (size_t)((uint64_t)fsize - 8 - hlen);
    header = malloc((size_t)hlen + 1);
    if (!header) {
        say(err, errlen, "%s: out of memory for the header", path);
        goto done;
    }
    if (fread(header, 1, (size_t)hlen, fp) != (size_t)hlen) {
        say(err, errlen, "%s: truncated header", path);
        goto done;
    }
    if (json_parse(header, (size_t)hlen, &root, jerr, sizeof jerr)) {
        say(err, errlen, "%s: the header is not valid JSON (%s)", path, jerr);
        goto done;
    }
    if (root.type != J_OBJ) {
        say(err, errlen, "%s: the header is not a JSON object", path);
        goto done;
    }
    f->tensors = calloc(root.len ? root.len : 1, sizeof *f->tensors);
    spans = calloc(root.len ? root.len : 1, sizeof *spans);
    if (!f->tensors || !spans) {
        say(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (i = 0; i < root.len; i++) {
        const jvalue *e = &root.items[i];
        if (strcmp(root.keys[i], "__metadata__") == 0) {
            size_t j;
            if (e->type != J_OBJ) {
                say(err, errlen, "%s: __metadata__ must be an object of strings", path);
                goto done;
            }
            f->meta_keys = calloc(e->len ? e->len : 1, sizeof *f->meta_keys);
            f->meta_values = calloc(e->len ? e->len : 1, sizeof *f->meta_values);
            if (!f->meta_keys || !f->meta_values) {
                say(err, errlen, "%s: out of memory", path);
                goto done;
            }
            for (j = 0; j < e->len; j++) {
                if (e->items[j].type != J_STR) {
                    say(err, errlen, "%s: __metadata__ must be an object of strings ('%s' is not)", path, e->keys[j]);
                    goto done;
                }
                f->meta_keys[j] = dup(e->keys[j]);
                f->meta_values[j] = dup(e->items[j].str);
                f->nmeta = j + 1;
                if (!f->meta_keys[j] || !f->meta_values[j]) {
                    say(err, errlen, "%s: out of memory", path);
                    goto done;
                }
            }
            continue;
        }
        if (entry(path, root.keys[i], e, data_size, &f->tensors[nt], &spans[nt], err, errlen)) goto done;
        spans[nt].index = nt;
        f->tensors[nt].name = dup(root.keys[i]);
        f->ntensors = ++nt;
        if (!f->tensors[nt - 1].name) {
            say(err, errlen, "%s: out of memory", path);
            goto done;
        }
    }
    /* the tensors must tile the data exactly: no gap, no overlap, nothing left over */
    qsort(spans, nt, sizeof *spans, by_begin);
    for (i = 0, expect = 0; i < nt; i++) {
        if (spans[i].begin != expect) {
            say(err, errlen, "%s: tensor '%s' begins at byte %lu of the data, expected %lu (tensors must be "
                "contiguous, without gaps or overlap)", path, f->tensors[spans[i].index].name,
                (unsigned long)spans[i].begin, (unsigned long)expect);
            goto done;
        }
        expect = spans[i].end;
    }
    if (expect != data_size) {
        say(err, errlen, "%s: the header declares %lu bytes of tensor data, the file holds %lu", path,
            (unsigned long)expect, (unsigned long)data_size);
        goto done;
    }
    /* only now, with every size checked against the file's, is the data allocated and read */
    f->buf = malloc(data_size ? data_size : 1);
    if (!f->buf) {
        say(err, errlen, "%s: out of memory for %lu bytes of data", path, (unsigned long)data_size);
        goto done;
    }
    if (fread(f->buf, 1, data_size, fp) != data_size) {
        say(err, errlen, "%s: truncated while reading the data", path);
        goto done;
    }
    for (i = 0; i < nt; i++) {
        st_tensor *t = &f->tensors[spans[i].index];
        size_t j;
        t->data = f->buf + spans[i].begin;
        if (t->dtype == ST_BOOL)
            for (j = 0; j < t->count; j++)
                if (t->data[j] > 1) {
                    say(err, errlen, "%s: tensor '%s' is BOOL but holds bytes other than 0 and 1", path, t->name);
                    goto done;
                }
    }
    rc = 0;
done:
    if (rc) st_free(f);
    json_free(&root);
    free(header);
    free(spans);
    fclose(fp);
    return rc;
}

const st_tensor *st_find(const st_file *f, const char *name)
{
    size_t i;
    for (i = 0; i < f->ntensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *st_meta(const st_file *f, const char *key)
{
    size_t i;
    for (i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta_keys[i], key) == 0) return f->meta_values[i];
    return NULL;
}

/* ---- writing ---- */

static int by_name(const void *a, const void *b)
{
    return strcmp(((const st_out *)a)->name, ((const st_out *)b)->name);
}

/* Append text to a growing buffer. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = (b->len + n + 1) * 2;
        char *p = realloc(b->p, nc);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_json_string(sbuf *b, const char *s)
{
    char tmp[8];
    sb_str(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            sb_add(b, tmp, 2);
        } else if (c < 0x20) {
            sprintf(tmp, "\\u%04x", c);
            sb_str(b, tmp);
        } else {
            sb_add(b, (const char *)s, 1);
        }
    }
    sb_str(b, "\"");
}

int st_write(const char *path, st_out *tensors, size_t n, char *err, size_t errlen)
{
    sbuf h = {NULL, 0, 0, 0};
    size_t i, j, k, offset = 0, count;
    char num[64];
    unsigned char lenbuf[8], item[8];
    FILE *fp;
    int rc = -1;

    qsort(tensors, n, sizeof *tensors, by_name);
    sb_str(&h, "{");
    for (i = 0; i < n; i++) {
        st_out *t = &tensors[i];
        if (!st_is_float(t->dtype)) return say(err, errlen, "%s: tensor '%s': only float dtypes are written", path,
                                               t->name);
        for (count = 1, k = 0; k < (size_t)t->rank; k++) count *= t->shape[k];
        if (i) sb_str(&h, ",");
        sb_json_string(&h, t->name);
        sb_str(&h, ":{\"data_offsets\":[");
        sprintf(num, "%lu,%lu", (unsigned long)offset, (unsigned long)(offset + count * SIZES[t->dtype]));
        sb_str(&h, num);
        sb_str(&h, "],\"dtype\":\"");
        sb_str(&h, NAMES[t->dtype]);
        sb_str(&h, "\",\"shape\":[");
        for (k = 0; k < (size_t)t->rank; k++) {
            sprintf(num, k ? ",%lu" : "%lu", (unsigned long)t->shape[k]);
            sb_str(&h, num);
        }
        sb_str(&h, "]}");
        offset += count * SIZES[t->dtype];
    }
    sb_str(&h, "}");
    while (!h.oom && h.len % 8) sb_str(&h, " ");
    if (h.oom) return say(err, errlen, "%s: out of memory", path);

    fp = fopen(path, "wb");
    if (!fp) {
        free(h.p);
        return say(err, errlen, "%s: cannot open for writing", path);
    }
    put_le(lenbuf, (uint64_t)h.len, 8);
    if (fwrite(lenbuf, 1, 8, fp) != 8 || fwrite(h.p, 1, h.len, fp) != h.len) goto done;
    for (i = 0; i < n; i++) {
        st_out *t = &tensors[i];
        size_t size = SIZES[t->dtype];
        for (count = 1, k = 0; k < (size_t)t->rank; k++) count *= t->shape[k];
        for (j = 0; j < count; j++) {
            double x = t->values[j];
            uint64_t bits;
            switch (t->dtype) {
            case ST_F64: memcpy(&bits, &x, sizeof bits); break;
            case ST_F32: bits = st_to_f32(x); break;
            case ST_F16: bits = st_to_f16(x); break;
            default: bits = st_to_bf16(x); break;
            }
            put_le(item, bits, size);
            if (fwrite(item, 1, size, fp) != size) goto done;
        }
    }
    rc = 0;
done:
    if (fclose(fp) != 0) rc = -1;
    free(h.p);
    if (rc) say(err, errlen, "%s: write failed", path);
    return rc;
}
