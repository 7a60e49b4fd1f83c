/* attnspec_sdpa BUNDLE_DIR OUTPUTS_DIR: attnspec's sdpa in plain C99, run on a conformance bundle.
 *
 * For every case listed in BUNDLE_DIR/manifest.json it reads the case's safetensors file, computes
 * sdpa in double precision exactly as spec/README.md defines it (the visibility table, then the
 * softmax over the visible keys only), and writes OUTPUTS_DIR/<case id>.safetensors with `out`
 * (plus `weights` and `lse` when the case asks for them) in the dtypes the case names. A case
 * using anything this file does not implement gets OUTPUTS_DIR/<case id>.unsupported with the
 * reason; a malformed case gets OUTPUTS_DIR/<case id>.error. `attnspec vectors verify` judges the
 * outputs.
 *
 * Built with -DATTNSPEC_FILL_MINUS_1E9 it is the textbook bug instead: hidden keys get the logit
 * -1e9 and stay in the softmax, so a row with no visible key averages every value (and a hidden
 * NaN reaches the output). That build must fail verification on clause sdpa.empty_row.
 *
 * Exit status: 0 when every case got an output or an .unsupported file, 1 when some case got an
 * .error, 2 for a bad command line or an unreadable manifest. */
#include "json.h"
#include "safetensors.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIMS (ST_MAX_RANK + 3)
#define MAX_ELEMENTS ((size_t)1 << 31) /* the largest input or output handled, in elements */
#define MSG 512

typedef enum { CASE_OK, CASE_UNSUPPORTED, CASE_ERROR } case_status;

typedef struct {
    char msg[MSG];
} report;

static case_status say(report *r, case_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof r->msg, fmt, ap);
    va_end(ap);
    return s;
}

/* ---- broadcasting: an array of shape `shape` read as if it had the shape `target` ---- */

typedef struct {
    int present;
    size_t strides[MAX_DIMS]; /* one per axis of the target; 0 on a broadcast axis */
} view;

/* Strides reading an array of `shape` (row-major) over `target`; -1 if it does not broadcast. */
static int bind(const size_t *shape, int rank, const size_t *target, int trank, view *vw)
{
    size_t natural = 1;
    int a;
    if (rank > trank) return -1;
    memset(vw, 0, sizeof *vw);
    vw->present = 1;
    for (a = trank - 1; a >= 0; a--) {
        int src = a - (trank - rank);
        if (src < 0) continue;
        if (shape[src] == target[a]) vw->strides[a] = shape[src] == 1 ? 0 : natural;
        else if (shape[src] == 1) vw->strides[a] = 0;
        else return -1;
        natural *= shape[src];
    }
    return 0;
}

static size_t offset(const view *vw, const size_t *idx, int rank)
{
    size_t off = 0;
    int a;
    for (a = 0; a < rank; a++) off += idx[a] * vw->strides[a];
    return off;
}

static int mul_ok(size_t *acc, size_t x)
{
    if (x && *acc > MAX_ELEMENTS / x) return 0;
    *acc *= x;
    return 1;
}

static void shape_text(const size_t *shape, int rank, char *buf, size_t len)
{
    int a;
    size_t used = 0;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, len, "(");
    for (a = 0; a < rank && used < len; a++)
        used += (size_t)snprintf(buf + used, len - used, a ? ", %lu" : "%lu", (unsigned long)shape[a]);
    if (used < len) snprintf(buf + used, len - used, rank == 1 ? ",)" : ")");
}

/* ---- the case's options and arrays ---- */

enum { CAUSAL_NONE, CAUSAL_UPPER_LEFT, CAUSAL_LOWER_RIGHT, CAUSAL_LOWER_RIGHT_LENGTHS };

typedef struct {
    /* options */
    int causal, has_window, return_weights, return_lse, has_softcap;
    long long left, right;
    double scale, softcap, dropout_p;
    /* sizes */
    int nbatch, squeeze_head;
    size_t batch[ST_MAX_RANK], hq, hkv, n, m, dk, dv, nb;
    /* inputs, as doubles (floats) or int64 (integers); bools are read from the file */
    double *q, *k, *v, *bias, *slopes, *sinks;
    int64_t *q_len, *kv_len, *q_ids, *kv_ids;
    const unsigned char *mask, *keep;
    view vq, vk, vv, vmask, vbias, vkeep, vqlen, vkvlen, vqids, vkvids, vslopes;
    /* outputs, (*batch, Hq, n, ...) row-major */
    double *out, *weights, *lse;
} problem;

static void problem_free(problem *p)
{
    /* every buffer the problem owns: its inputs as read, then its outputs */
    void *owned[] = {p->q, p->k, p->v, p->bias, p->slopes, p->sinks, p->q_len, p->kv_len,
                     p->q_ids, p->kv_ids, p->out, p->weights, p->lse};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        free(owned[i]);
}

/* A tensor's elements, converted to TYPE by GET, in a buffer of their own (NULL: out of memory). */
#define ELEMENTS_AS(NAME, TYPE, GET)                                   \
    static TYPE *NAME(const st_tensor *t)                              \
    {                                                                  \
        TYPE *x = malloc(t->count ? t->count * sizeof *x : 1);         \
        if (x)                                                         \
            for (size_t i = 0; i < t->count; i++) x[i] = GET(t, i);    \
        return x;                                                      \
    }

ELEMENTS_AS(as_f64, double, st_get_f64)
ELEMENTS_AS(as_i64, int64_t, st_get_i64)

/* A float from the metadata: the whole string must be a decimal float. */
static int parse_double(const char *s, double *out)
{
    char *end;
    if (!s || !*s) return -1;
    *out = strtod(s, &end);
    return *end == '\0' ? 0 : -1;
}

static int parse_flag(const char *s, int *out)
{
    if (!s || strcmp(s, "false") == 0) *out = 0;
    else if (strcmp(s, "true") == 0) *out = 1;
    else return -1;
    return 0;
}

/* An output's dtype, as the metadata names it ("float32", or the safetensors code "F32"). */
static int parse_out_dtype(const char *s, st_dtype *out)
{
    static const char *const names[4] = {"float64", "float32", "float16", "bfloat16"};
    static const st_dtype codes[4] = {ST_F64, ST_F32, ST_F16, ST_BF16};
    int i;
    if (!s) return -1;
    for (i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = codes[i];
            return 0;
        }
    return st_dtype_parse(s, out) == 0 && st_is_float(*out) ? 0 : -1;
}

static const char *const INPUTS[] = {"q", "k", "v", "mask", "bias", "q_lengths", "kv_lengths", "alibi_slopes",
                                     "sinks", "q_segment_ids", "kv_segment_ids", "dropout_mask", NULL};
static const char *const OPTIONS[] = {"option.causal", "option.window", "option.scale", "option.softcap",
                                      "option.dropout_p", "option.return_weights", "option.return_lse", NULL};

static int listed(const char *const *list, const char *name)
{
    for (; *list; list++)
        if (strcmp(*list, name) == 0) return 1;
    return 0;
}

static int starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* Anything in the case this program does not know: an .unsupported reason, never a guess. */
static case_status check_known(const st_file *f, report *r)
{
    size_t i;
    const char *fn = st_meta(f, "function");
    if (!fn || strcmp(fn, "sdpa") != 0) return say(r, CASE_UNSUPPORTED, "function %s: only sdpa is implemented",
                                                   fn ? fn : "(none)");
    for (i = 0; i < f->ntensors; i++) {
        const char *name = f->tensors[i].name;
        if (listed(INPUTS, name) || starts(name, "expected.") || starts(name, "zero_rows.") || starts(name, "nan."))
            continue;
        return say(r, CASE_UNSUPPORTED, "input '%s' is not implemented", name);
    }
    for (i = 0; i < f->nmeta; i++) {
        const char *key = f->meta_keys[i];
        if (starts(key, "option.") && !listed(OPTIONS, key))
            return say(r, CASE_UNSUPPORTED, "%s is not implemented", key);
        if (starts(key, "dtype.") && strcmp(key, "dtype.out") != 0 && strcmp(key, "dtype.weights") != 0
            && strcmp(key, "dtype.lse") != 0)
            return say(r, CASE_UNSUPPORTED, "output '%s' is not implemented", key + 6);
    }
    return CASE_OK;
}

static case_status read_options(const st_file *f, problem *p, report *r)
{
    const char *causal = st_meta(f, "option.causal"), *window = st_meta(f, "option.window");
    const char *s;
    if (!causal || strcmp(causal, "None") == 0) p->causal = CAUSAL_NONE;
    else if (strcmp(causal, "upper_left") == 0) p->causal = CAUSAL_UPPER_LEFT;
    else if (strcmp(causal, "lower_right") == 0) p->causal = CAUSAL_LOWER_RIGHT;
    else if (strcmp(causal, "lower_right_lengths") == 0) p->causal = CAUSAL_LOWER_RIGHT_LENGTHS;
    else return say(r, CASE_UNSUPPORTED, "option.causal=%s is not implemented", causal);
    if (window && strcmp(window, "None") != 0) {
        char tail;
        if (sscanf(window, "%lld,%lld%c", &p->left, &p->right, &tail) != 2 || p->left < 0 || p->right < 0)
            return say(r, CASE_ERROR, "option.window=%s: expected 'left,right', two ints >= 0", window);
        p->has_window = 1;
    }
    s = st_meta(f, "option.scale");
    p->scale = -1;
    if (s && strcmp(s, "None") != 0 && (parse_double(s, &p->scale) || !(p->scale > 0) || !isfinite(p->scale)))
        return say(r, CASE_ERROR, "option.scale=%s: expected a finite float > 0", s);
    s = st_meta(f, "option.softcap");
    if (s && strcmp(s, "None") != 0) {
        if (parse_double(s, &p->softcap) || !(p->softcap > 0) || !isfinite(p->softcap))
            return say(r, CASE_ERROR, "option.softcap=%s: expected a finite float > 0", s);
        p->has_softcap = 1;
    }
    s = st_meta(f, "option.dropout_p");
    p->dropout_p = 0;
    if (s && strcmp(s, "None") != 0 && (parse_double(s, &p->dropout_p) || !(p->dropout_p >= 0 && p->dropout_p < 1)))
        return say(r, CASE_ERROR, "option.dropout_p=%s: expected a float in [0, 1)", s);
    if (parse_flag(st_meta(f, "option.return_weights"), &p->return_weights)
        || parse_flag(st_meta(f, "option.return_lse"), &p->return_lse))
        return say(r, CASE_ERROR, "option.return_weights and option.return_lse must be 'true' or 'false'");
    return CASE_OK;
}

/* A float input given or not; its dtype is checked against q's. */
static case_status float_input(const st_file *f, const char *name, st_dtype dtype, int any_float,
                               const st_tensor **t, double **x, report *r)
{
    *t = st_find(f, name);
    if (!*t) return CASE_OK;
    if (!st_is_float((*t)->dtype) || (!any_float && (*t)->dtype != dtype))
        return say(r, CASE_ERROR, "%s has dtype %s, expected %s", name, st_dtype_name((*t)->dtype),
                   any_float ? "a float dtype" : st_dtype_name(dtype));
    *x = as_f64(*t);
    return *x ? CASE_OK : say(r, CASE_ERROR, "out of memory reading %s", name);
}

static case_status int_input(const st_file *f, const char *name, const st_tensor **t, int64_t **x, report *r)
{
    *t = st_find(f, name);
    if (!*t) return CASE_OK;
    if (!st_is_int((*t)->dtype))
        return say(r, CASE_ERROR, "%s has dtype %s, expected an integer dtype", name, st_dtype_name((*t)->dtype));
    *x = as_i64(*t);
    return *x ? CASE_OK : say(r, CASE_ERROR, "out of memory reading %s", name);
}

static case_status bind_input(const st_tensor *t, const size_t *target, int trank, view *vw, report *r)
{
    char a[160], b[160];
    if (!t) return CASE_OK;
    if (bind(t->shape, t->rank, target, trank, vw) == 0) return CASE_OK;
    shape_text(t->shape, t->rank, a, sizeof a);
    shape_text(target, trank, b, sizeof b);
    return say(r, CASE_ERROR, "%s has shape %s, which does not broadcast to %s", t->name, a, b);
}

/* The sizes and every input of one case, each checked the way the spec validates a call. */
static case_status load(const st_file *f, problem *p, report *r)
{
    const st_tensor *tq = st_find(f, "q"), *tk = st_find(f, "k"), *tv = st_find(f, "v");
    const st_tensor *tmask, *tbias, *tql, *tkl, *tsl, *tsk, *tqi, *tki, *tkeep;
    size_t qs[MAX_DIMS], ks[MAX_DIMS], vs[MAX_DIMS], target[MAX_DIMS], count;
    int qr, kr, vr, a, nb;
    case_status s;

    if (!tq || !tk || !tv) return say(r, CASE_ERROR, "the case lacks q, k or v");
    if (!st_is_float(tq->dtype) || tk->dtype != tq->dtype || tv->dtype != tq->dtype)
        return say(r, CASE_ERROR, "q, k and v must share one float dtype, got %s, %s, %s", st_dtype_name(tq->dtype),
                   st_dtype_name(tk->dtype), st_dtype_name(tv->dtype));
    if (tq->rank < 2 || tk->rank < 2 || tv->rank < 2) return say(r, CASE_ERROR, "q, k and v must have rank >= 2");
    /* a rank-2 array is one head: (L, d) is read as (1, L, d) */
    qr = tq->rank == 2 ? 3 : tq->rank;
    kr = tk->rank == 2 ? 3 : tk->rank;
    vr = tv->rank == 2 ? 3 : tv->rank;
    qs[0] = ks[0] = vs[0] = 1;
    memcpy(qs + (qr - tq->rank), tq->shape, (size_t)tq->rank * sizeof *qs);
    memcpy(ks + (kr - tk->rank), tk->shape, (size_t)tk->rank * sizeof *ks);
    memcpy(vs + (vr - tv->rank), tv->shape, (size_t)tv->rank * sizeof *vs);
    p->squeeze_head = tq->rank == 2;
    p->hq = qs[qr - 3];
    p->n = qs[qr - 2];
    p->dk = qs[qr - 1];
    p->hkv = ks[kr - 3];
    p->m = ks[kr - 2];
    p->dv = vs[vr - 1];
    if (ks[kr - 1] != p->dk || vs[vr - 2] != p->m || vs[vr - 3] != p->hkv || p->dk < 1 || p->hkv < 1
        || p->hq % p->hkv)
        return say(r, CASE_ERROR, "q, k, v shapes are inconsistent (dk, m, heads, or Hq not a multiple of Hkv)");
    /* the batch dims: q's, k's and v's leading dims broadcast together */
    nb = qr - 3;
    if (kr - 3 > nb) nb = kr - 3;
    if (vr - 3 > nb) nb = vr - 3;
    p->nbatch = nb;
    for (a = 0; a < nb; a++) {
        size_t d = 1, x;
        int src, which;
        for (which = 0; which < 3; which++) {
            const size_t *sh = which == 0 ? qs : which == 1 ? ks : vs;
            int rk = which == 0 ? qr : which == 1 ? kr : vr;
            src = a - (nb - (rk - 3));
            if (src < 0) continue;
            x = sh[src];
            if (x != 1 && d != 1 && x != d) return say(r, CASE_ERROR, "the batch dims of q, k and v do not broadcast");
            if (x != 1) d = x;
        }
        p->batch[a] = d;
    }
    p->nb = 1;
    for (a = 0; a < nb; a++)
        if (!mul_ok(&p->nb, p->batch[a])) return say(r, CASE_ERROR, "the batch is too large");
    count = p->nb;
    if (!mul_ok(&count, p->hq) || !mul_ok(&count, p->n) || !mul_ok(&count, p->m) || !mul_ok(&count, p->dv + 1))
        return say(r, CASE_ERROR, "the case is too large for this program");
    if (p->scale < 0) p->scale = 1.0 / sqrt((double)p->dk);

    /* q, k, v */
    memcpy(target, p->batch, (size_t)nb * sizeof *target);
    target[nb] = p->hq;
    target[nb + 1] = p->n;
    target[nb + 2] = p->dk;
    if (bind(qs, qr, target, nb + 3, &p->vq)) return say(r, CASE_ERROR, "q does not broadcast");
    target[nb] = p->hkv;
    target[nb + 1] = p->m;
    if (bind(ks, kr, target, nb + 3, &p->vk)) return say(r, CASE_ERROR, "k does not broadcast");
    target[nb + 2] = p->dv;
    if (bind(vs, vr, target, nb + 3, &p->vv)) return say(r, CASE_ERROR, "v does not broadcast");
    p->q = as_f64(tq);
    p->k = as_f64(tk);
    p->v = as_f64(tv);
    if (!p->q || !p->k || !p->v) return say(r, CASE_ERROR, "out of memory");

    /* mask, bias and dropout_mask: broadcast to (*batch, Hq, n, m) */
    target[nb] = p->hq;
    target[nb + 1] = p->n;
    target[nb + 2] = p->m;
    tmask = st_find(f, "mask");
    tkeep = st_find(f, "dropout_mask");
    if (tmask && tmask->dtype != ST_BOOL) return say(r, CASE_ERROR, "mask must be BOOL");
    if (tkeep && tkeep->dtype != ST_BOOL) return say(r, CASE_ERROR, "dropout_mask must be BOOL");
    if ((s = bind_input(tmask, target, nb + 3, &p->vmask, r)) != CASE_OK) return s;
    if ((s = bind_input(tkeep, target, nb + 3, &p->vkeep, r)) != CASE_OK) return s;
    p->mask = tmask ? tmask->data : NULL;
    p->keep = tkeep ? tkeep->data : NULL;
    if (tkeep && !st_meta(f, "option.dropout_p"))
        return say(r, CASE_ERROR, "dropout_mask is given without option.dropout_p");
    if (!tkeep && p->dropout_p > 0) return say(r, CASE_ERROR, "option.dropout_p > 0 needs a dropout_mask");
    if ((s = float_input(f, "bias", tq->dtype, 0, &tbias, &p->bias, r)) != CASE_OK) return s;
    if ((s = bind_input(tbias, target, nb + 3, &p->vbias, r)) != CASE_OK) return s;

    /* lengths over the batch dims, segment ids over (*batch, n) and (*batch, m) */
    if ((s = int_input(f, "q_lengths", &tql, &p->q_len, r)) != CASE_OK) return s;
    if ((s = int_input(f, "kv_lengths", &tkl, &p->kv_len, r)) != CASE_OK) return s;
    if ((s = bind_input(tql, p->batch, nb, &p->vqlen, r)) != CASE_OK) return s;
    if ((s = bind_input(tkl, p->batch, nb, &p->vkvlen, r)) != CASE_OK) return s;
    for (count = 0; tql && count < tql->count; count++)
        if (p->q_len[count] < 0 || (uint64_t)p->q_len[count] > p->n)
            return say(r, CASE_ERROR, "q_lengths must lie in [0, n]");
    for (count = 0; tkl && count < tkl->count; count++)
        if (p->kv_len[count] < 0 || (uint64_t)p->kv_len[count] > p->m)
            return say(r, CASE_ERROR, "kv_lengths must lie in [0, m]");
    if ((s = int_input(f, "q_segment_ids", &tqi, &p->q_ids, r)) != CASE_OK) return s;
    if ((s = int_input(f, "kv_segment_ids", &tki, &p->kv_ids, r)) != CASE_OK) return s;
    if (!tqi != !tki) return say(r, CASE_ERROR, "q_segment_ids and kv_segment_ids must come together");
    target[nb] = p->n;
    if ((s = bind_input(tqi, target, nb + 1, &p->vqids, r)) != CASE_OK) return s;
    target[nb] = p->m;
    if ((s = bind_input(tki, target, nb + 1, &p->vkvids, r)) != CASE_OK) return s;

    /* alibi_slopes (Hq,) or (*batch, Hq) of any float dtype; sinks (Hq,) of q's dtype */
    if ((s = float_input(f, "alibi_slopes", tq->dtype, 1, &tsl, &p->slopes, r)) != CASE_OK) return s;
    target[nb] = p->hq;
    if ((s = bind_input(tsl, target, nb + 1, &p->vslopes, r)) != CASE_OK) return s;
    if (tsl && tsl->shape[tsl->rank - 1] != p->hq) return say(r, CASE_ERROR, "alibi_slopes must end in Hq");
    if ((s = float_input(f, "sinks", tq->dtype, 0, &tsk, &p->sinks, r)) != CASE_OK) return s;
    if (tsk && (tsk->rank != 1 || tsk->shape[0] != p->hq)) return say(r, CASE_ERROR, "sinks must have shape (Hq,)");
    return CASE_OK;
}

/* ---- the computation ---- */

/* The anchor i' of query row i (spec/README.md: `masks.query_anchor`). */
static long long anchor(const problem *p, size_t i, long long qlen, long long kvlen, const int64_t *qids,
                        size_t qstride, const int64_t *kvids, size_t kstride)
{
    long long qend, kend;
    size_t x;
    int64_t sid;
    if (p->causal == CAUSAL_LOWER_RIGHT) return (long long)i + (long long)p->m - (long long)p->n;
    if (p->causal != CAUSAL_LOWER_RIGHT_LENGTHS) return (long long)i;
    if (!qids) return (long long)i + kvlen - qlen;
    /* with segment ids: the ends of query i's own sequence, within the lengths */
    sid = qids[i * qstride];
    qend = kend = 0;
    for (x = 0; x < (size_t)qlen; x++)
        if (qids[x * qstride] == sid) qend = (long long)x + 1;
    for (x = 0; x < (size_t)kvlen; x++)
        if (kvids[x * kstride] == sid) kend = (long long)x + 1;
    return (long long)i + kend - qend;
}

static size_t at_least_1(size_t x) { return x ? x : 1; } /* malloc(0) may return NULL */

static case_status compute(problem *p, report *r)
{
    const int nb = p->nbatch;
    const size_t group = p->hq / p->hkv, rows = p->nb * p->hq * p->n;
    size_t idx[MAX_DIMS], b, h, i, j, d, a;
    double *logits = malloc((p->m ? p->m : 1) * sizeof *logits);
    unsigned char *vis = malloc(p->m ? p->m : 1);

    p->out = calloc(at_least_1(rows * p->dv), sizeof *p->out);
    p->weights = p->return_weights ? calloc(at_least_1(rows * p->m), sizeof *p->weights) : NULL;
    p->lse = malloc((rows ? rows : 1) * sizeof *p->lse);
    if (!logits || !vis || !p->out || !p->lse || (p->return_weights && !p->weights)) {
        free(logits);
        free(vis);
        return say(r, CASE_ERROR, "out of memory");
    }
    for (b = 0; b < p->nb; b++) {
        size_t rem = b, qb, kb, vb, mb = 0, bb = 0, keepb = 0, qib = 0, kib = 0, slb = 0;
        long long qlen = (long long)p->n, kvlen = (long long)p->m;
        const int64_t *qids = NULL, *kvids = NULL;
        memset(idx, 0, sizeof idx);
        for (a = (size_t)nb; a-- > 0;) {
            idx[a] = rem % p->batch[a];
            rem /= p->batch[a];
        }
        /* the batch element's offset into each array (the head and row axes follow) */
        qb = offset(&p->vq, idx, nb);
        kb = offset(&p->vk, idx, nb);
        vb = offset(&p->vv, idx, nb);
        if (p->mask) mb = offset(&p->vmask, idx, nb);
        if (p->bias) bb = offset(&p->vbias, idx, nb);
        if (p->keep) keepb = offset(&p->vkeep, idx, nb);
        if (p->slopes) slb = offset(&p->vslopes, idx, nb);
        if (p->q_len) qlen = p->q_len[offset(&p->vqlen, idx, nb)];
        if (p->kv_len) kvlen = p->kv_len[offset(&p->vkvlen, idx, nb)];
        if (p->q_ids) {
            qib = offset(&p->vqids, idx, nb);
            kib = offset(&p->vkvids, idx, nb);
            qids = p->q_ids + qib;
            kvids = p->kv_ids + kib;
        }
        for (h = 0; h < p->hq; h++) {
            const size_t g = h / group; /* GQA: contiguous groups of query heads share a kv head */
            const double slope = p->slopes ? p->slopes[slb + h * p->vslopes.strides[nb]] : 0.0;
            for (i = 0; i < p->n; i++) {
                const size_t row = (b * p->hq + h) * p->n + i;
                const double *qi = p->q + qb + h * p->vq.strides[nb] + i * p->vq.strides[nb + 1];
                const size_t qdk = p->vq.strides[nb + 2];
                const size_t wrow = h * p->vmask.strides[nb] + i * p->vmask.strides[nb + 1];
                const size_t brow = h * p->vbias.strides[nb] + i * p->vbias.strides[nb + 1];
                const size_t krow = h * p->vkeep.strides[nb] + i * p->vkeep.strides[nb + 1];
                const long long ia = anchor(p, i, qlen, kvlen, qids, p->vqids.strides[nb], kvids,
                                            p->vkvids.strides[nb]);
                double top = -INFINITY, total = 0.0;
                int any = 0, nan_seen = 0;
                double *o = p->out + row * p->dv;

                for (j = 0; j < p->m; j++) {
                    const long long jj = (long long)j;
                    const double bias = p->bias ? p->bias[bb + brow + j * p->vbias.strides[nb + 2]] : 0.0;
                    int visible = 1;
                    if (p->causal == CAUSAL_UPPER_LEFT && j > i) visible = 0;
                    if ((p->causal == CAUSAL_LOWER_RIGHT || p->causal == CAUSAL_LOWER_RIGHT_LENGTHS) && jj > ia)
                        visible = 0;
                    if (p->has_window && (jj < ia - p->left || jj > ia + p->right)) visible = 0;
                    if (jj >= kvlen || (long long)i >= qlen) visible = 0;
                    if (qids) {
                        const int64_t qid = qids[i * p->vqids.strides[nb]];
                        if (qid < 0 || qid != kvids[j * p->vkvids.strides[nb]]) visible = 0;
                    }
                    if (p->mask && !p->mask[mb + wrow + j * p->vmask.strides[nb + 2]]) visible = 0;
                    if (p->bias && bias == -INFINITY) visible = 0;
                    vis[j] = (unsigned char)visible;
                    if (visible) {
                        const double *kj = p->k + kb + g * p->vk.strides[nb] + j * p->vk.strides[nb + 1];
                        const size_t kdk = p->vk.strides[nb + 2];
                        double t = 0.0;
                        for (d = 0; d < p->dk; d++) t += qi[d * qdk] * kj[d * kdk];
                        t *= p->scale;
                        if (p->has_softcap) t = p->softcap * tanh(t / p->softcap);
                        if (p->bias) t += bias;
                        if (p->slopes) t += -slope * (double)(ia > jj ? ia - jj : jj - ia);
                        logits[j] = t;
                    } else {
#ifdef ATTNSPEC_FILL_MINUS_1E9
                        /* the textbook bug: a hidden key stays in the softmax with a large negative logit */
                        logits[j] = -1e9;
                        vis[j] = 1;
#else
                        continue; /* a hidden key is absent: it takes no part in anything below */
#endif
                    }
                    any = 1;
                    if (isnan(logits[j])) nan_seen = 1;
                    else if (logits[j] > top) top = logits[j];
                }
                if (p->sinks) {
                    const double sink = p->sinks[h];
                    any = 1;
                    if (isnan(sink)) nan_seen = 1;
                    else if (sink > top) top = sink;
                }
                if (!any) { /* no visible key and no sink: output 0, weights 0, lse -inf */
                    p->lse[row] = -INFINITY;
                    continue;
                }
                if (nan_seen) top = NAN; /* a visible NaN logit propagates, like NumPy's max */
                for (j = 0; j < p->m; j++)
                    if (vis[j]) {
                        logits[j] = exp(logits[j] - top);
                        total += logits[j];
                    }
                if (p->sinks) total += exp(p->sinks[h] - top);
                p->lse[row] = top + log(total);
                for (j = 0; j < p->m; j++) {
                    double w;
                    const double *vj;
                    size_t vdv;
                    if (!vis[j]) continue;
                    w = logits[j] / total;
                    if (p->keep)
                        w = w * (double)p->keep[keepb + krow + j * p->vkeep.strides[nb + 2]] / (1.0 - p->dropout_p);
                    if (p->weights) p->weights[row * p->m + j] = w;
                    vj = p->v + vb + g * p->vv.strides[nb] + j * p->vv.strides[nb + 1];
                    vdv = p->vv.strides[nb + 2];
                    for (d = 0; d < p->dv; d++) o[d] += w * vj[d * vdv];
                }
            }
        }
    }
    free(logits);
    free(vis);
    return CASE_OK;
}

/* ---- one case ---- */

static case_status write_outputs(const st_file *f, problem *p, const char *path, report *r)
{
    st_out outs[3];
    size_t n = 0;
    int a, rank;
    const char *names[3] = {"out", "weights", "lse"};
    int wanted[3];
    int w;
    wanted[0] = 1;
    wanted[1] = p->return_weights;
    wanted[2] = p->return_lse;
    for (w = 0; w < 3; w++) {
        char key[32];
        st_out *o;
        if (!wanted[w]) continue;
        o = &outs[n++];
        sprintf(key, "dtype.%s", names[w]);
        o->name = names[w];
        if (parse_out_dtype(st_meta(f, key), &o->dtype))
            return say(r, CASE_ERROR, "%s is %s, expected a float dtype", key, st_meta(f, key) ? st_meta(f, key)
                                                                                                 : "missing");
        /* (*batch, Hq, n, ...), without the head axis when q had rank 2 */
        rank = 0;
        for (a = 0; a < p->nbatch; a++) o->shape[rank++] = p->batch[a];
        if (!p->squeeze_head) o->shape[rank++] = p->hq;
        o->shape[rank++] = p->n;
        if (w == 0) o->shape[rank++] = p->dv;
        if (w == 1) o->shape[rank++] = p->m;
        o->rank = rank;
        o->values = w == 0 ? p->out : w == 1 ? p->weights : p->lse;
    }
    if (st_write(path, outs, n, r->msg, sizeof r->msg)) return CASE_ERROR;
    return CASE_OK;
}

static case_status run_case(const char *case_path, const char *id, const char *out_path, report *r)
{
    st_file f;
    problem p;
    case_status s;
    const char *meta_id;
    memset(&p, 0, sizeof p);
    if (st_read(case_path, &f, r->msg, sizeof r->msg)) return CASE_ERROR;
    meta_id = st_meta(&f, "case");
    if (meta_id && strcmp(meta_id, id) != 0) s = say(r, CASE_ERROR, "the file's case id is %s, the manifest's %s",
                                                     meta_id, id);
    else if ((s = check_known(&f, r)) == CASE_OK && (s = read_options(&f, &p, r)) == CASE_OK
             && (s = load(&f, &p, r)) == CASE_OK && (s = compute(&p, r)) == CASE_OK)
        s = write_outputs(&f, &p, out_path, r);
    problem_free(&p);
    st_free(&f);
    return s;
}

/* ---- the bundle ---- */

static char *read_all(const char *path, size_t limit, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    long size;
    char *buf;
    if (!fp) return NULL;
    if (fseek(fp, 0, SEEK_END) != 0 || (size = ftell(fp)) < 0 || (size_t)size > limit || fseek(fp, 0, SEEK_SET)) {
        fclose(fp);
        return NULL;
    }
    buf = malloc((size_t)size + 1);
    if (buf && fread(buf, 1, (size_t)size, fp) != (size_t)size) {
        free(buf);
        buf = NULL;
    }
    fclose(fp);
    if (buf) {
        buf[size] = '\0';
        *len = (size_t)size;
    }
    return buf;
}

/* Case ids and file names become paths: letters, digits, '.', '_' and '-' only, no leading '.'. */
static int safe_name(const char *s)
{
    if (!s || !*s || *s == '.' || strlen(s) > 200) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '.'
              || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

/* Messages may quote the file's own bytes: keep them printable ASCII (so valid UTF-8, one line). */
static void printable(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7E) *s = '?';
}

static int write_text(const char *path, char *text)
{
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    printable(text);
    fputs(text, fp);
    fputc('\n', fp);
    return fclose(fp);
}

int main(int argc, char **argv)
{
    const char *bundle, *outdir;
    char *text, path[4096], result[4096], tmp[4200], jerr[200];
    size_t len, c, ncases;
    jvalue manifest;
    const jvalue *cases;
    int done = 0, unsupported = 0, errors = 0;
    const char *fn, *family;
    char whole[200] = "";

    if (argc != 3) {
        fprintf(stderr, "usage: %s BUNDLE_DIR OUTPUTS_DIR\n"
                        "  reads BUNDLE_DIR/manifest.json and its cases, writes OUTPUTS_DIR/<case id>.safetensors\n"
                        "  (or .unsupported / .error); OUTPUTS_DIR must exist\n", argv[0]);
        return 2;
    }
    bundle = argv[1];
    outdir = argv[2];
    snprintf(path, sizeof path, "%s/manifest.json", bundle);
    text = read_all(path, 64ul * 1024ul * 1024ul, &len);
    if (!text) {
        fprintf(stderr, "attnspec_sdpa: cannot read %s\n", path);
        return 2;
    }
    if (json_parse(text, len, &manifest, jerr, sizeof jerr)) {
        fprintf(stderr, "attnspec_sdpa: %s: %s\n", path, jerr);
        free(text);
        return 2;
    }
    free(text);
    cases = json_get(&manifest, "cases");
    if (!cases || (cases->type != J_ARR && cases->type != J_OBJ)) {
        fprintf(stderr, "attnspec_sdpa: %s has no list of cases\n", path);
        json_free(&manifest);
        return 2;
    }
    ncases = cases->len;
    /* A bundle of another function (sdpa_fp8's FP8 storage) or another layout of sdpa (the paged
       cache) is declared unsupported from the manifest alone: its files need not parse here. */
    fn = json_get_str(&manifest, "function");
    family = json_get_str(&manifest, "family");
    if (!fn || strcmp(fn, "sdpa") != 0)
        snprintf(whole, sizeof whole, "function %s: only sdpa is implemented", fn ? fn : "(none)");
    else if (family && strcmp(family, "sdpa_serving") != 0)
        snprintf(whole, sizeof whole, "bundle family %s: only sdpa's contiguous layout is implemented", family);
    for (c = 0; c < ncases; c++) {
        const jvalue *entry = &cases->items[c];
        const char *id = cases->type == J_OBJ ? cases->keys[c] : json_get_str(entry, "id");
        const char *file = json_get_str(entry, "file");
        static const char *const exts[3] = {"safetensors", "unsupported", "error"};
        report r;
        case_status s;
        int e;
        if (!safe_name(id) || !safe_name(file)) {
            fprintf(stderr, "attnspec_sdpa: case %lu of the manifest has no usable id and file\n", (unsigned long)c);
            errors++;
            continue;
        }
        /* a stale result of an earlier run must not stand beside this one */
        for (e = 0; e < 3; e++) {
            snprintf(result, sizeof result, "%s/%s.%s", outdir, id, exts[e]);
            remove(result);
        }
        snprintf(path, sizeof path, "%s/%s", bundle, file);
        snprintf(result, sizeof result, "%s/%s.safetensors", outdir, id);
        snprintf(tmp, sizeof tmp, "%s.partial", result);
        r.msg[0] = '\0';
        s = whole[0] ? say(&r, CASE_UNSUPPORTED, "%s", whole) : run_case(path, id, tmp, &r);
        if (s == CASE_OK && rename(tmp, result) != 0) s = say(&r, CASE_ERROR, "cannot rename %s", tmp);
        if (s != CASE_OK) {
            remove(tmp);
            snprintf(result, sizeof result, "%s/%s.%s", outdir, id, s == CASE_UNSUPPORTED ? "unsupported" : "error");
            if (write_text(result, r.msg)) {
                fprintf(stderr, "attnspec_sdpa: cannot write %s\n", result);
                json_free(&manifest);
                return 2;
            }
            fprintf(stderr, "%s %s: %s\n", id, s == CASE_UNSUPPORTED ? "unsupported" : "error", r.msg);
        }
        if (s == CASE_OK) done++;
        else if (s == CASE_UNSUPPORTED) unsupported++;
        else errors++;
    }
    json_free(&manifest);
    printf("attnspec_sdpa%s: %lu cases: %d written, %d unsupported, %d errors\n",
#ifdef ATTNSPEC_FILL_MINUS_1E9
           " (fill -1e9 twin)",
#else
           "",
#endif
           (unsigned long)ncases, done, unsupported, errors);
    return errors ? 1 : 0;
}
