"""Reformer LSH attention with shared query/key: the golden definition.

Shape letters, used in every shape comment below:
    ...  leading batch dims (batch, heads, ...); x and v broadcast against each other
    L    sequence length (queries and keys are the same L positions)
    d    query/key dim;  dv  value dim
    nh   hashing rounds (n_hashes);  nb  buckets (n_buckets, even);  K = nb // 2
    C    chunk_length;  Lp = C * ceil(L / C), one round padded to whole chunks
    nc   chunks, nh * Lp / C;  B  the leading dims flattened into one

For one batch element: x (L, d) is both query and key, v (L, dv), n = kv_length (default L).

1. Rotations R (d, nh, K) are data. ``lsh_rotations(seed, d, nh, nb)`` draws them as
   ``np.random.default_rng(seed).standard_normal((d, nh, K), dtype=np.float32)``; every backend
   is handed the same array and never draws its own. float32 because every framework holds it
   bit for bit and it converts exactly to float64.
2. Hash. For round r and position t, p = x[t] @ R[:, r, :] (K values), computed in **float64**
   from the exact inputs, and ``bucket[r, t] = argmax(concat(p, -p))`` in [0, nb), first index on
   ties (so x[t] = 0 hashes to 0). The top-2 margin (best minus second best of that concat) is
   exposed by `lsh_bucket_margins`: a backend that computes p less precisely can only disagree
   on a bucket whose margin is below twice its projection error (see `lsh_bucket_margins`).
3. Sort. Padded positions t >= n, and the positions L <= t < Lp added by step 9, take bucket nb:
   after every real bucket, so they sit at the end of each round and their content can change
   nothing (HF Reformer gives padding tokens the same extra bucket). Within each round positions
   are sorted by (bucket, position); rounds are concatenated in order: nh * Lp slots sorted by
   (round, bucket, position). slot(r, t) is the inverse permutation.
4. Logits. Keys are the unit-normalized x: k_hat[t] = x[t] / max(||x[t]||_2, NORM_EPS), and
   logit(i, j) = scale * (x[i] . k_hat[j]). scale defaults to **1**: the keys are already unit
   length, so the logit scale is an explicit choice (|logit| <= scale * ||x[i]||); 1 / sqrt(d)
   would shrink a second time what normalization already bounded.
5. Chunks. The nh * Lp slots are cut into nc chunks of C. A slot in chunk c attends to the 2C
   slots of chunk (c - 1) mod nc followed by chunk c: the look-back wraps globally (the first
   chunk of round r sees the last chunk of round r - 1; the very first sees the very last).
6. Visibility, by original positions (query i, key j in its window):
   - j >= n is absent (that covers the step-9 positions, as n <= L);
   - with ``causal``, j > i is absent;
   - j == i is visible, but its logit is replaced by SELF_LOGIT, so a query sees itself only
     when nothing else is visible (then it gets weight 1);
   - a padded query row (i >= n) sees nothing and produces 0.
   Absent keys get weight exactly 0 and their values (NaN included) never reach the output.
7. Per slot row, a max-subtracted softmax over its visible window entries and its logsumexp
   lse_r. Undo the sort (row of query i in round r is slot(r, i)) and combine the rounds:
   out[i] = sum_r exp(lse_r - logsumexp_r(lse_r)) * out_r[i].
8. ``dedup=True``: count(i, j) = the number of slots, over all nh windows of query i (duplicates
   within one window included), that hold key j. Every entry for j gets logit - log(count(i, j))
   (after the self replacement). The result is then exactly the softmax over the union of the
   query's windows, each key once: sum_r exp(lse_r) = sum over distinct visible j of exp(logit).
9. L not a multiple of C: positions L..Lp-1 are added as absent keys (step 3) and the output is
   sliced back to L. nc must be >= 2, or a chunk's "previous chunk" would be itself (SpecError).
   L = 0 is allowed and gives an empty output.

Constants:
    NORM_EPS = 1e-12: the eps of torch.nn.functional.normalize (which reformer-pytorch uses for
        these keys), so a backend can call it as is; it only matters for ||x|| < 1e-12.
    SELF_LOGIT = -5e4: far below any real logit, so whenever another key is visible the self
        weight is exp(-5e4 + scale * ||x[i]||) or less, which is exactly 0.0 in float64 while
        scale * ||x[i]|| < ~49000; and finite, so a self-only row gets weight 1 rather than 0/0.
        -5e4 is representable in float16 (max 65504), so a backend holding logits in float16 can
        write it without turning it into -inf (reformer-pytorch uses -5e4 for that reason; HF
        and trax use -1e5 in float32). The result is the same for any such constant.

Who differs (their normalization and masking, not the algorithm): HF Reformer and trax scale
keys by rsqrt(mean(x^2) + 1e-6) / sqrt(d) (HF) or rsqrt(mean(x^2) + 1e-6) (trax), and mask with
large finite constants, so masked NaN values leak; trax subtracts its self constant instead of
replacing the logit. `attnspec.spec.reformer` reproduces HF's and reformer-pytorch's layers
through this module's core with the switches of `_Semantics`; the spec page lists every
difference.

Causality caveat: with ``causal=True`` no later *value* or *key* reaches an earlier output, but
later positions' *hashes* move chunk boundaries, so changing x at later positions can change
which earlier keys share a window with an earlier query. That is Reformer's design, not a bug
of this definition.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from attnspec._errors import SpecError
from attnspec.spec._validate import (
    FLOAT_DTYPES,
    ArrayInfo,
    check_lengths,
    check_scale,
    is_int,
    numpy_info,
)

__all__ = [
    "NORM_EPS",
    "SELF_LOGIT",
    "LSHPlan",
    "lsh_attention",
    "lsh_bucket_margins",
    "lsh_buckets",
    "lsh_rotations",
    "validate_lsh",
]

NORM_EPS = 1e-12
SELF_LOGIT = -5e4
ROTATION_DTYPES = ("float32", "float64")


def lsh_rotations(seed: int, d: int, n_hashes: int, n_buckets: int) -> np.ndarray:
    """Random rotations (d, n_hashes, n_buckets // 2), float32, standard normal.

    Exactly ``np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)``. The array,
    not the seed, is the input backends receive: NumPy does not promise the same stream across
    versions, so conformance runs pass the array itself.
    """
    fn = "lsh_rotations"
    for name, value, low in (("seed", seed, 0), ("d", d, 1), ("n_hashes", n_hashes, 1)):
        if not is_int(value) or value < low:
            raise SpecError(f"{fn}: {name}={value!r} must be an int >= {low}")
    if not is_int(n_buckets) or n_buckets < 2 or n_buckets % 2:
        raise SpecError(
            f"{fn}: n_buckets={n_buckets!r} must be an even int >= 2 "
            "(the hash is an argmax over [x R, -x R], 2 * (n_buckets // 2) values)"
        )
    shape = (int(d), int(n_hashes), int(n_buckets) // 2)
    return np.random.default_rng(int(seed)).standard_normal(shape, dtype=np.float32)


def _check_x_rotations(fn: str, x: ArrayInfo, rotations: ArrayInfo) -> None:
    if len(x.shape) < 2:
        raise SpecError(f"{fn}: x.ndim={len(x.shape)} must be >= 2 (expected (..., L, d)), got shape {x.shape}")
    if x.dtype not in FLOAT_DTYPES:
        raise SpecError(f"{fn}: x.dtype={x.dtype} must be one of {', '.join(FLOAT_DTYPES)}")
    d = x.shape[-1]
    if d < 1:
        raise SpecError(f"{fn}: x.shape[-1]={d} (the query/key dim d) must be >= 1")
    if rotations.dtype not in ROTATION_DTYPES:
        raise SpecError(f"{fn}: rotations.dtype={rotations.dtype} must be float32 or float64")
    if len(rotations.shape) != 3:
        raise SpecError(
            f"{fn}: rotations.ndim={len(rotations.shape)} must be 3 (d, n_hashes, n_buckets // 2), "
            f"got shape {rotations.shape}"
        )
    if rotations.shape[0] != d:
        raise SpecError(f"{fn}: rotations.shape[0]={rotations.shape[0]} must equal x.shape[-1]={d}")
    if rotations.shape[1] < 1:
        raise SpecError(f"{fn}: rotations.shape[1]={rotations.shape[1]} (n_hashes) must be >= 1")
    if rotations.shape[2] < 1:
        raise SpecError(
            f"{fn}: rotations.shape[2]={rotations.shape[2]} (n_buckets // 2) must be >= 1, "
            "i.e. n_buckets must be an even number >= 2"
        )


@dataclass(frozen=True)
class LSHPlan:
    """A validated lsh_attention call: sizes and normalized options."""

    batch: tuple[int, ...]
    L: int
    d: int
    dv: int
    n_hashes: int
    n_buckets: int
    chunk_length: int
    dtype: str
    scale: float
    causal: bool
    dedup: bool
    kv_lengths: np.ndarray | None  # int64, broadcast to `batch`

    @property
    def padded_length(self) -> int:
        """Lp: one round padded to whole chunks."""
        return -(-self.L // self.chunk_length) * self.chunk_length

    @property
    def n_chunks(self) -> int:
        return self.n_hashes * self.padded_length // self.chunk_length


def validate_lsh(
    fn: str,
    x: ArrayInfo,
    v: ArrayInfo,
    rotations: ArrayInfo,
    *,
    chunk_length: object,
    causal: object = False,
    kv_lengths: object = None,
    dedup: object = False,
    scale: object = None,
) -> LSHPlan:
    """Check one lsh_attention call and return its plan; raise `SpecError` naming the first problem."""
    _check_x_rotations(fn, x, rotations)
    if len(v.shape) < 2:
        raise SpecError(f"{fn}: v.ndim={len(v.shape)} must be >= 2 (expected (..., L, dv)), got shape {v.shape}")
    if v.dtype != x.dtype:
        raise SpecError(f"{fn}: x and v must share one dtype, got x.dtype={x.dtype}, v.dtype={v.dtype}")
    L, d = x.shape[-2:]
    if v.shape[-2] != L:
        raise SpecError(f"{fn}: v.shape[-2]={v.shape[-2]} must equal x.shape[-2]={L} (one value per position)")
    try:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], v.shape[:-2]))
    except ValueError:
        raise SpecError(
            f"{fn}: leading batch dims do not broadcast: x {x.shape[:-2]}, v {v.shape[:-2]}"
        ) from None
    if not is_int(chunk_length) or chunk_length < 1:
        raise SpecError(f"{fn}: chunk_length={chunk_length!r} must be an int >= 1")
    nh, C = rotations.shape[1], int(chunk_length)
    n_chunks = nh * -(-L // C)
    if L > 0 and n_chunks < 2:
        raise SpecError(
            f"{fn}: n_hashes * ceil(L / chunk_length) = {nh} * ceil({L} / {C}) = {n_chunks} chunk(s), "
            "expected >= 2 so that each chunk's previous chunk is a different one"
        )
    for name, flag in (("causal", causal), ("dedup", dedup)):
        if not isinstance(flag, (bool, np.bool_)):
            raise SpecError(f"{fn}: {name}={flag!r} must be a bool (True or False)")
    return LSHPlan(
        batch=batch,
        L=L,
        d=d,
        dv=v.shape[-1],
        n_hashes=nh,
        n_buckets=2 * rotations.shape[2],
        chunk_length=C,
        dtype=x.dtype,
        scale=1.0 if scale is None else check_scale(fn, scale, d),
        causal=bool(causal),
        dedup=bool(dedup),
        kv_lengths=check_lengths(fn, "kv_lengths", kv_lengths, batch, L, "L"),
    )


def _rotated(x64: np.ndarray, r64: np.ndarray) -> np.ndarray:
    """concat(x R, -x R) per round: (..., nh, L, nb), in float64."""
    d, nh, K = r64.shape
    p = x64 @ r64.reshape(d, nh * K)  # (..., L, nh * K)
    p = np.moveaxis(p.reshape(*p.shape[:-1], nh, K), -2, -3)  # (..., nh, L, K)
    return np.concatenate([p, -p], axis=-1)  # (..., nh, L, nb)


def _hash_inputs(fn: str, x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    info_x, info_r = numpy_info(fn, "x", x), numpy_info(fn, "rotations", rotations)
    _check_x_rotations(fn, info_x, info_r)
    return _rotated(x.astype(np.float64), rotations.astype(np.float64))


def lsh_buckets(x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Buckets (..., n_hashes, L), int64 in [0, n_buckets): step 2 of the module docstring.

    ``bucket[..., r, t] = argmax(concat(p, -p))`` with p = x[..., t, :] @ rotations[:, r, :],
    computed in float64, first index on ties. Padding is not applied here: `lsh_attention`
    (``return_buckets=True``) reports the buckets it sorted by, with n_buckets at padded positions.
    """
    return np.argmax(_hash_inputs("lsh_buckets", x, rotations), axis=-1).astype(np.int64)


def lsh_bucket_margins(x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Top-2 margins (..., n_hashes, L), float64 >= 0: best minus second best of concat(p, -p).

    A backend that computes p with unit roundoff u over d products has error at most
    E = gamma_d * max_k (|x[t]| @ |R[:, r, :]|)_k on every entry, gamma_d = d u / (1 - d u)
    (plus u once more per product if it rounds x or R to a narrower format first). Its argmax
    can differ from the golden's only where margin <= 2E. One changed bucket moves the chunk
    boundaries of its whole round, so a conformance check must skip (or regenerate) the whole
    batch element when any unpadded position falls under that threshold, not just that position.
    """
    full = _hash_inputs("lsh_bucket_margins", x, rotations)  # (..., nh, L, nb)
    top2 = np.sort(full, axis=-1)[..., -2:]  # (..., nh, L, 2)
    return top2[..., 1] - top2[..., 0]


def lsh_attention(
    x: np.ndarray,
    v: np.ndarray,
    *,
    rotations: np.ndarray,
    chunk_length: int,
    causal: bool = False,
    kv_lengths: np.ndarray | int | None = None,
    dedup: bool = False,
    scale: float | None = None,
    return_buckets: bool = False,
):
    """Reformer LSH attention with shared query/key, exactly as the module docstring defines it.

    Args:
        x: (..., L, d), the shared queries and keys. v: (..., L, dv), same dtype (float16,
            bfloat16, float32 or float64). Leading dims broadcast like NumPy.
        rotations: (d, n_hashes, n_buckets // 2), float32 or float64 (see `lsh_rotations`).
        chunk_length: C >= 1; n_hashes * ceil(L / C) must be >= 2.
        causal: bool; key j is absent for query i when j > i.
        kv_lengths: ints broadcastable to the leading dims; positions >= kv_length are absent
            keys, take no part in the hash order, and their query rows produce 0.
        dedup: subtract log(count) for keys a query meets more than once (exact union softmax).
        scale: multiplies x[i] . k_hat[j]; default 1 (the keys are unit length).
        return_buckets: also return the buckets the sort used, int64 (..., n_hashes, L):
            `lsh_buckets` at unpadded positions, n_buckets at padded ones.

    Returns out (..., L, dv) in x's dtype (and the buckets). Computed in float64; memory is
    O(n_hashes * L * 2C) per batch element (times d or dv where vectors are gathered); no L x L
    array is built.
    """
    fn = "lsh_attention"
    p = validate_lsh(fn, numpy_info(fn, "x", x), numpy_info(fn, "v", v),
                     numpy_info(fn, "rotations", rotations), chunk_length=chunk_length,
                     causal=causal, kv_lengths=kv_lengths, dedup=dedup, scale=scale)
    B, L = math.prod(p.batch), p.L
    x64 = np.broadcast_to(x.astype(np.float64), (*p.batch, L, p.d)).reshape(B, L, p.d)  # (B, L, d)
    v64 = np.broadcast_to(v.astype(np.float64), (*p.batch, L, p.dv)).reshape(B, L, p.dv)  # (B, L, dv)
    kv = np.full(B, L) if p.kv_lengths is None else p.kv_lengths.reshape(B)  # (B,)
    buckets = np.argmax(_rotated(x64, rotations.astype(np.float64)), axis=-1)  # (B, nh, L)
    if B == 0 or L == 0:
        out, eff = np.zeros((B, L, p.dv)), buckets
    else:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            out, eff = _lsh_core(p, x64, v64, kv, buckets)
    out = out.astype(x.dtype).reshape(*p.batch, L, p.dv)
    if not return_buckets:
        return out
    return out, eff.astype(np.int64).reshape(*p.batch, p.n_hashes, L)


@dataclass(frozen=True)
class _Semantics:
    """The switches that turn the spec's LSH into another library's: private, set only by
    `attnspec.spec.reformer` (the spec page lists each difference). The defaults are the spec.

    ``before``/``after``: chunks of look-back and look-ahead, each wrapping over all nh * Lp slots
    (the spec: 1, 0). ``key_eps``: None for k = x / max(||x||, NORM_EPS); a float e for Hugging
    Face's x * rsqrt(mean(x^2) + e) / sqrt(d). ``pad_bucket``: invalid positions sort last with
    bucket nb (else they keep their hash). ``mask_queries``: an invalid query row is masked too.
    ``mask_value``: the logit of a masked pair (-inf: absent). ``self_logit``: the logit of j == i.
    ``self_over_mask``: the self logit replaces even a masked pair's (the spec masks after).
    ``zero_invalid_rows``: invalid query rows output 0.
    """

    before: int = 1
    after: int = 0
    key_eps: float | None = None
    pad_bucket: bool = True
    mask_queries: bool = True
    mask_value: float = -math.inf
    self_logit: float = SELF_LOGIT
    self_over_mask: bool = False
    zero_invalid_rows: bool = True


SPEC = _Semantics()


def _lsh_core(p: LSHPlan, x64, v64, kv, buckets, sem: _Semantics = SPEC, valid_in=None):
    """(out (B, L, dv), buckets sorted by (B, nh, L)). ``valid_in`` (B, L) bool, when given,
    replaces ``kv`` (an arbitrary mask of valid positions, for `attnspec.spec.reformer`)."""
    B, L, d, dv = x64.shape[0], p.L, p.d, p.dv
    nh, nb, C, Lp, nc = p.n_hashes, p.n_buckets, p.chunk_length, p.padded_length, p.n_chunks
    pos = np.arange(Lp)
    if valid_in is None:
        valid = pos < kv[:, None]  # (B, Lp): unpadded; kv <= L, so also false for the step-9 pad
    else:
        valid = np.zeros((B, Lp), bool)
        valid[:, :L] = valid_in  # (B, Lp)
    eff = np.full((B, nh, Lp), nb)
    eff[:, :, :L] = buckets
    sorts_last = valid if sem.pad_bucket else (pos < L)[None, :]  # (B or 1, Lp)
    eff = np.where(sorts_last[:, None, :], eff, nb)  # (B, nh, Lp): padded positions sort last
    order = np.argsort(eff * Lp + pos, axis=-1)  # (B, nh, Lp): position held by each slot; keys unique
    slot_pos = order.reshape(B, nc, C)  # (B, nc, C): rounds concatenated, cut into chunks
    offsets = range(-sem.before, sem.after + 1)  # chunk c + o for each o, wrapping over all nc
    win_pos = np.concatenate([np.roll(slot_pos, -o, axis=1) for o in offsets], axis=-1)  # (B, nc, W)

    x_pad = np.zeros((B, Lp, d))
    x_pad[:, :L] = x64  # (B, Lp, d)
    v_pad = np.zeros((B, Lp, dv))
    v_pad[:, :L] = v64  # (B, Lp, dv)
    if sem.key_eps is None:
        k_hat = x_pad / np.maximum(np.linalg.norm(x_pad, axis=-1, keepdims=True), NORM_EPS)  # (B, Lp, d)
    else:
        rms = np.sqrt(np.mean(x_pad * x_pad, axis=-1, keepdims=True) + sem.key_eps)  # (B, Lp, 1)
        k_hat = x_pad / rms / math.sqrt(d)  # (B, Lp, d)
    bi = np.arange(B)[:, None, None]
    q = x_pad[bi, slot_pos]  # (B, nc, C, d)
    k = k_hat[bi, win_pos]  # (B, nc, W, d)
    s = p.scale * (q @ np.swapaxes(k, -1, -2))  # (B, nc, C, W)
    qp, kp = slot_pos[..., :, None], win_pos[..., None, :]  # (B, nc, C, 1), (B, nc, 1, W)
    vis = valid[bi, win_pos][..., None, :]  # (B, nc, 1, W)
    if sem.mask_queries:
        vis = vis & valid[bi, slot_pos][..., :, None]  # (B, nc, C, W)
    if p.causal:
        vis = vis & (kp <= qp)
    vis = np.broadcast_to(vis, (B, nc, C, win_pos.shape[-1]))  # (B, nc, C, W)
    is_self = kp == qp
    if sem.self_over_mask:
        s = np.where(is_self, sem.self_logit, np.where(vis, s, sem.mask_value))
        vis = vis | is_self
    else:
        s = np.where(is_self, sem.self_logit, s)
        if p.dedup:
            s = s - np.log(_window_counts(order, win_pos, C))
        s = np.where(vis, s, sem.mask_value)  # absent keys: their x (even NaN) is dropped here
    if math.isfinite(sem.mask_value):
        vis = np.ones_like(vis)  # a finite mask value keeps the pair: its value is multiplied by 0

    row_max = s.max(axis=-1, keepdims=True)  # (B, nc, C, 1)
    row_max = np.where(row_max == -np.inf, 0, row_max)  # rows with no visible key (padded queries)
    e = np.exp(s - row_max)
    denom = e.sum(axis=-1, keepdims=True)  # (B, nc, C, 1)
    w = e / np.where(denom == 0, 1, denom)  # (B, nc, C, W)
    lse = (row_max + np.log(denom))[..., 0]  # (B, nc, C); -inf for padded queries
    o = _weighted_values(w, v_pad[bi, win_pos], vis)  # (B, nc, C, dv)

    slot_of = np.argsort(order, axis=-1)  # (B, nh, Lp): slot within its round holding position t
    flat = np.arange(nh)[:, None] * Lp + slot_of  # (B, nh, Lp): index among the nh * Lp slots
    o = o.reshape(B, nh * Lp, dv)[bi, flat]  # (B, nh, Lp, dv)
    lse = lse.reshape(B, nh * Lp)[bi, flat]  # (B, nh, Lp)
    if sem.zero_invalid_rows:
        lse = np.where(valid[:, None, :], lse, 0)  # padded rows: any finite value, zeroed below
    top = lse.max(axis=1, keepdims=True)  # (B, 1, Lp)
    rw = np.exp(lse - top)
    rw = rw / rw.sum(axis=1, keepdims=True)  # (B, nh, Lp): exp(lse_r - logsumexp_r lse)
    out = (rw[..., None] * o).sum(axis=1)  # (B, Lp, dv)
    if sem.zero_invalid_rows:
        out = np.where(valid[..., None], out, 0)
    return out[:, :L], eff[:, :, :L]  # (B, L, dv), (B, nh, L)


def _window_counts(order: np.ndarray, win_pos: np.ndarray, C: int) -> np.ndarray:
    """count(i, j) for every window entry, in slot layout (B, nc, C, 2C)."""
    B, nh, Lp = order.shape
    bi = np.arange(B)[:, None, None]
    flat = np.arange(nh)[:, None] * Lp + np.argsort(order, axis=-1)  # (B, nh, Lp): slot of (r, t)
    keys = win_pos[bi, flat // C]  # (B, nh, Lp, 2C): window of query t in round r
    per_query = np.moveaxis(keys, 1, 2).reshape(B * Lp, nh * 2 * C)  # (B*Lp, nh*2C): all its windows
    ids = np.arange(B * Lp)[:, None] * Lp + per_query  # (B*Lp, nh*2C): one id per (query, key)
    _, inverse, counts = np.unique(ids.ravel(), return_inverse=True, return_counts=True)
    per_query = counts[inverse.ravel()].reshape(B, Lp, nh, 2 * C)  # (B, Lp, nh, 2C)
    by_round = np.moveaxis(per_query, 2, 1)  # (B, nh, Lp, 2C): by round and position
    by_slot = by_round[bi, np.arange(nh)[:, None], order]  # (B, nh, Lp, 2C): by round and slot
    return by_slot.reshape(B, -1, C, 2 * C)  # (B, nc, C, 2C)


def _weighted_values(w, v_win, vis) -> np.ndarray:
    """sum over visible window entries of w * v, where a non-finite v reaches only rows that see it.

    ``w @ v`` would turn an absent NaN (weight exactly 0) into NaN for its whole chunk, so the
    matmul runs on finite values and non-finite ones are added back where visible. That branch
    holds (B, nc, C, 2C, dv) at once; it runs only when v has non-finite entries.
    """
    finite = np.isfinite(v_win)  # (B, nc, 2C, dv)
    out = w @ np.where(finite, v_win, 0)  # (B, nc, C, dv)
    if finite.all():
        return out
    bad = np.where(finite, 0, v_win)[..., None, :, :]  # (B, nc, 1, 2C, dv): non-finite parts only
    contrib = np.where(vis[..., None], w[..., None] * bad, 0)  # (B, nc, C, 2C, dv)
    return out + contrib.sum(axis=-2)


def _lsh_attention_loops(
    x: np.ndarray,
    v: np.ndarray,
    *,
    rotations: np.ndarray,
    chunk_length: int,
    causal: bool = False,
    kv_lengths: np.ndarray | int | None = None,
    dedup: bool = False,
    scale: float | None = None,
    return_buckets: bool = False,
):
    """`lsh_attention` as Python loops over the numbered steps: an independent check, tiny inputs."""
    fn = "_lsh_attention_loops"
    p = validate_lsh(fn, numpy_info(fn, "x", x), numpy_info(fn, "v", v),
                     numpy_info(fn, "rotations", rotations), chunk_length=chunk_length,
                     causal=causal, kv_lengths=kv_lengths, dedup=dedup, scale=scale)
    L, nh, nb, C, Lp = p.L, p.n_hashes, p.n_buckets, p.chunk_length, p.padded_length
    xs = np.broadcast_to(x.astype(np.float64), (*p.batch, L, p.d))
    vs = np.broadcast_to(v.astype(np.float64), (*p.batch, L, p.dv))
    R = rotations.astype(np.float64)
    out = np.zeros((*p.batch, L, p.dv))
    all_buckets = np.zeros((*p.batch, nh, L), np.int64)
    for b in np.ndindex(*p.batch):
        n = L if p.kv_lengths is None else int(p.kv_lengths[b])
        xb = [[float(c) for c in xs[b][t]] for t in range(L)]

        def k_hat(j: int) -> list[float]:
            norm = math.sqrt(sum(c * c for c in xb[j]))
            return [c / max(norm, NORM_EPS) for c in xb[j]]

        slots: list[int] = []  # steps 2, 3, 9: the flat sorted sequence of all rounds
        for r in range(nh):
            bucket = {}
            for t in range(Lp):
                bucket[t] = _hash_one(xb[t], R, r) if t < n else nb
                if t < L:
                    all_buckets[(*b, r, t)] = bucket[t]
            slots += sorted(range(Lp), key=lambda t: (bucket[t], t))
        chunks = [slots[c:c + C] for c in range(0, len(slots), C)]  # step 5

        for i in range(n):  # padded query rows stay 0
            windows = []
            for r in range(nh):
                c = (r * Lp + slots[r * Lp:(r + 1) * Lp].index(i)) // C
                windows.append(chunks[c - 1] + chunks[c])  # chunks[-1] wraps to the last chunk
            count = Counter(j for window in windows for j in window)  # step 8
            lses, outs = [], []
            for window in windows:  # steps 4, 6, 7 for one round
                logits, values = [], []
                for j in window:
                    if j >= n or (p.causal and j > i):
                        continue
                    if j == i:
                        logit = SELF_LOGIT
                    else:
                        logit = p.scale * sum(a * c for a, c in zip(xb[i], k_hat(j)))
                    if p.dedup:
                        logit -= math.log(count[j])
                    logits.append(logit)
                    values.append(vs[b][j])
                top = max(logits)
                exps = [math.exp(s - top) for s in logits]
                total = sum(exps)
                lses.append(top + math.log(total))
                outs.append(sum(e / total * val for e, val in zip(exps, values)))
            top = max(lses)
            round_w = [math.exp(s - top) for s in lses]
            out[(*b, i)] = sum(rw / sum(round_w) * o for rw, o in zip(round_w, outs))
    out = out.astype(x.dtype)
    return (out, all_buckets) if return_buckets else out


def _hash_one(xt: list[float], R: np.ndarray, r: int) -> int:
    d, _, K = R.shape
    proj = [sum(xt[a] * float(R[a, r, k]) for a in range(d)) for k in range(K)]
    values = proj + [-s for s in proj]
    best = 0
    for idx, value in enumerate(values):
        if value > values[best]:  # strict: the first index wins ties
            best = idx
    return best
