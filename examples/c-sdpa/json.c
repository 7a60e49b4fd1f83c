/* A minimal JSON reader: see json.h. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

typedef struct {
    const char *p, *end, *start;
    int depth;
    char *err;
    size_t errlen;
} parser;

static int fail(parser *ps, const char *fmt, ...)
{
    va_list ap;
    int n;
    if (ps->err && ps->errlen) {
        n = snprintf(ps->err, ps->errlen, "JSON at byte %lu: ", (unsigned long)(ps->p - ps->start));
        if (n > 0 && (size_t)n < ps->errlen) {
            va_start(ap, fmt);
            vsnprintf(ps->err + n, ps->errlen - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int parse_value(parser *ps, jvalue *v);

static int hex4(parser *ps, unsigned *out)
{
    unsigned u = 0;
    int i;
    if (ps->end - ps->p < 4) return fail(ps, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        char c = *ps->p++;
        u <<= 4;
        if (c >= '0' && c <= '9') u |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') u |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') u |= (unsigned)(c - 'A' + 10);
        else return fail(ps, "bad hex digit in \\u escape");
    }
    *out = u;
    return 0;
}

/* Called with ps->p just past the opening quote. */
static int parse_string(parser *ps, char **out)
{
    const char *q = ps->p;
    char *buf, *w;
    /* the decoded text is never longer than its escaped form */
    while (q < ps->end && *q != '"') q += (*q == '\\' && q + 1 < ps->end) ? 2 : 1;
    if (q >= ps->end) return fail(ps, "unterminated string");
    buf = malloc((size_t)(q - ps->p) + 1);
    if (!buf) return fail(ps, "out of memory");
    w = buf;
    while (*ps->p != '"') {
        unsigned char c = (unsigned char)*ps->p++;
        if (c < 0x20) { free(buf); return fail(ps, "control character in string"); }
        if (c != '\\') { *w++ = (char)c; continue; }
        c = (unsigned char)*ps->p++;
        switch (c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            unsigned u, lo;
            if (hex4(ps, &u)) { free(buf); return -1; }
            if (u >= 0xD800 && u <= 0xDBFF) {
                if (ps->end - ps->p < 6 || ps->p[0] != '\\' || ps->p[1] != 'u') {
                    free(buf);
                    return fail(ps, "unpaired surrogate in \\u escape");
                }
                ps->p += 2;
                if (hex4(ps, &lo)) { free(buf); return -1; }
                if (lo < 0xDC00 || lo > 0xDFFF) { free(buf); return fail(ps, "unpaired surrogate in \\u escape"); }
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            } else if (u >= 0xDC00 && u <= 0xDFFF) {
                free(buf);
                return fail(ps, "unpaired surrogate in \\u escape");
            }
            if (u == 0) { free(buf); return fail(ps, "NUL character in string"); }
            if (u < 0x80) {
                *w++ = (char)u;
            } else if (u < 0x800) {
                *w++ = (char)(0xC0 | (u >> 6));
                *w++ = (char)(0x80 | (u & 0x3F));
            } else if (u < 0x10000) {
                *w++ = (char)(0xE0 | (u >> 12));
                *w++ = (char)(0x80 | ((u >> 6) & 0x3F));
                *w++ = (char)(0x80 | (u & 0x3F));
            } else {
                *w++ = (char)(0xF0 | (u >> 18));
                *w++ = (char)(0x80 | ((u >> 12) & 0x3F));
                *w++ = (char)(0x80 | ((u >> 6) & 0x3F));
                *w++ = (char)(0x80 | (u & 0x3F));
            }
            break;
        }
        default:
            free(buf);
            return fail(ps, "bad escape in string");
        }
    }
    ps->p++; /* the closing quote */
    *w = '\0';
    *out = buf;
    return 0;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int parse_number(parser *ps, jvalue *v)
{
    const char *s = ps->p;
    size_t n;
    if (ps->p < ps->end && *ps->p == '-') ps->p++;
    if (ps->p >= ps->end || !is_digit(*ps->p)) return fail(ps, "bad number");
    if (*ps->p == '0') ps->p++;
    else while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (ps->p >= ps->end || !is_digit(*ps->p)) return fail(ps, "bad number: digits must follow '.'");
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || !is_digit(*ps->p)) return fail(ps, "bad number: digits must follow 'e'");
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    }
    n = (size_t)(ps->p - s);
    v->str = malloc(n + 1);
    if (!v->str) return fail(ps, "out of memory");
    memcpy(v->str, s, n);
    v->str[n] = '\0';
    v->type = J_NUM;
    v->num = strtod(v->str, NULL);
    return 0;
}

static int literal(parser *ps, const char *word, jtype t, jvalue *v)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return fail(ps, "unexpected character");
    ps->p += n;
    v->type = t;
    return 0;
}

/* Append a zeroed item (and, for objects, a NULL key) to v; NULL when out of memory. */
static jvalue *push(jvalue *v, size_t *cap)
{
    if (v->len == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        jvalue *items = realloc(v->items, nc * sizeof *items);
        if (!items) return NULL;
        v->items = items;
        if (v->type == J_OBJ) {
            char **keys = realloc(v->keys, nc * sizeof *keys);
            if (!keys) return NULL;
            v->keys = keys;
        }
        *cap = nc;
    }
    memset(&v->items[v->len], 0, sizeof v->items[0]);
    if (v->type == J_OBJ) v->keys[v->len] = NULL;
    return &v->items[v->len++];
}

static int parse_container(parser *ps, jvalue *v, char close)
{
    size_t cap = 0;
    v->type = close == '}' ? J_OBJ : J_ARR;
    if (++ps->depth > JSON_MAX_DEPTH) return fail(ps, "nested deeper than %d", JSON_MAX_DEPTH);
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        ps->depth--;
        return 0;
    }
    for (;;) {
        jvalue *item;
        char *key = NULL;
        skip_ws(ps);
        if (v->type == J_OBJ) {
            size_t i;
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a string key");
            ps->p++;
            if (parse_string(ps, &key)) return -1;
            for (i = 0; i < v->len; i++)
                if (strcmp(v->keys[i], key) == 0) {
                    free(key);
                    return fail(ps, "duplicate key");
                }
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') { free(key); return fail(ps, "expected ':'"); }
            ps->p++;
        }
        item = push(v, &cap);
        if (!item) { free(key); return fail(ps, "out of memory"); }
        if (v->type == J_OBJ) v->keys[v->len - 1] = key;
        if (parse_value(ps, item)) return -1;
        skip_ws(ps);
        if (ps->p >= ps->end) return fail(ps, "unterminated %s", v->type == J_OBJ ? "object" : "array");
        if (*ps->p == ',') { ps->p++; continue; }
        if (*ps->p == close) { ps->p++; break; }
        return fail(ps, "expected ',' or '%c'", close);
    }
    ps->depth--;
    return 0;
}

static int parse_value(parser *ps, jvalue *v)
{
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
    switch (*ps->p) {
    case '{': ps->p++; return parse_container(ps, v, '}');
    case '[': ps->p++; return parse_container(ps, v, ']');
    case '"': ps->p++; v->type = J_STR; return parse_string(ps, &v->str);
    case 't': return literal(ps, "true", J_TRUE, v);
    case 'f': return literal(ps, "false", J_FALSE, v);
    case 'n': return literal(ps, "null", J_NULL, v);
    default: return parse_number(ps, v);
    }
}

int json_parse(const char *text, size_t len, jvalue *out, char *err, size_t errlen)
{
    parser ps;
    ps.p = ps.start = text;
    ps.end = text + len;
    ps.depth = 0;
    ps.err = err;
    ps.errlen = errlen;
    memset(out, 0, sizeof *out);
    if (parse_value(&ps, out)) {
        json_free(out);
        return -1;
    }
    skip_ws(&ps);
    if (ps.p != ps.end) {
        fail(&ps, "trailing characters after the document");
        json_free(out);
        return -1;
    }
    return 0;
}

void json_free(jvalue *v)
{
    size_t i;
    if (!v) return;
    for (i = 0; i < v->len; i++) {
        json_free(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    memset(v, 0, sizeof *v);
}

const jvalue *json_get(const jvalue *obj, const char *key)
{
    size_t i;
    if (!obj || obj->type != J_OBJ) return NULL;
    for (i = 0; i < obj->len; i++)
        if (strcmp(obj->keys[i], key) == 0) return &obj->items[i];
    return NULL;
}

const char *json_get_str(const jvalue *obj, const char *key)
{
    const jvalue *v = json_get(obj, key);
    return v && v->type == J_STR ? v->str : NULL;
}

int json_int(const jvalue *v, long long lo, long long hi, long long *out)
{
    const char *s;
    int neg = 0;
    unsigned long long acc = 0, limit;
    if (!v || v->type != J_NUM) return -1;
    s = v->str;
    if (*s == '-') { neg = 1; s++; }
    limit = neg ? (unsigned long long)(-(lo + 1)) + 1u : (unsigned long long)(hi < 0 ? 0 : hi);
    if (neg && lo >= 0) return -1;
    for (; *s; s++) {
        if (!is_digit(*s)) return -1; /* a fraction or an exponent: not an integer literal */
        unsigned long long d = (unsigned long long)(*s - '0');
        if (acc > limit / 10u) return -1;
        acc *= 10u;
        if (d > limit - acc) return -1;
        acc += d;
    }
    if (neg) {
        *out = acc == 0 ? 0 : -(long long)(acc - 1u) - 1;
        if (*out < lo) return -1;
    } else {
        *out = (long long)acc;
        if (*out < lo) return -1;
    }
    return 0;
}
