"""Scaled dot-product attention: the golden definition.

Shape letters, used in every shape comment below:
    ...  leading batch dims (broadcast like NumPy)
    Hq   query heads;  Hkv  key/value heads (Hq % Hkv == 0);  G = Hq // Hkv
    n    queries;      m    keys
    dk   query/key head dim;  dv  value head dim

For query head h, batch index b, query row i:

    visible(i, j)  = AND of every rule given (mask, bias != -inf, causal, window, lengths)
    s[i, j]        = scale * (q[b, h, i] . k[b, h // G, j]) + bias[b, h, i, j]     (visible j)
    w[i, j]        = exp(s[i, j] - max_j' s[i, j']) / sum_j'' exp(s[i, j''] - max)  (visible j)
                     0                                                             (otherwise)
    out[b, h, i]   = sum over visible j of w[i, j] * v[b, h // G, j]

A row with no visible key gets w = 0 and out = 0. Keys that are not visible are absent: their k
and v values (NaN and inf included) never reach the row. Everything is computed in float64 and the
result is cast to the inputs' dtype.

Large inputs (batch * Hq * n * m >= BLOCKED_MIN_LOGITS) are computed by the tiled online softmax
of `attnspec.spec.blocked`, the same function to a few ulp, in O(tile + n * dv) extra memory.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from attnspec.spec._validate import SDPAPlan, numpy_info, validate_sdpa
from attnspec.spec.blocked import blocked_core
from attnspec.spec.masks import visibility

__all__ = ["BLOCKED_MIN_LOGITS", "GOLDEN_TILES", "golden", "sdpa", "sdpa_loops"]

#: `sdpa` computes tile by tile (`attnspec.spec.blocked`) once batch * Hq * n * m reaches this.
#: The vectorized form holds about five float64 arrays of that many elements at once (logits,
#: masked logits, exponentials, weights, visibility): 2**20 logits cost ~40 MiB there, and the
#: tiled form is no slower from about this size on (measured: 8 heads of n = m = 512 run ~2x
#: faster tiled). Counted over all heads, not per head, because that is what the memory holds.
BLOCKED_MIN_LOGITS = 1 << 20
#: the tiles (block_q, block_k) `sdpa` uses there: one float64 logits tile is 4 MiB. Against
#: sdpa_blocked's default 256 x 512, the same share of the matmul rate single-threaded (~0.67 at
#: (1, 8, 4096, 64)) and ~10% more with two BLAS threads (fewer, larger BLAS calls).
GOLDEN_TILES = (512, 1024)


def _validate(fn, q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths) -> SDPAPlan:
    return validate_sdpa(
        fn,
        numpy_info(fn, "q", q),
        numpy_info(fn, "k", k),
        numpy_info(fn, "v", v),
        mask=None if mask is None else numpy_info(fn, "mask", mask),
        bias=None if bias is None else numpy_info(fn, "bias", bias),
        causal=causal,
        window=window,
        scale=scale,
        q_lengths=q_lengths,
        kv_lengths=kv_lengths,
    )


def _with_head(x: np.ndarray) -> np.ndarray:
    return x[None] if x.ndim == 2 else x  # (L, d) -> (1, L, d): a missing head axis is one head


def sdpa(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    causal: str | None = None,
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    q_lengths: np.ndarray | int | None = None,
    kv_lengths: np.ndarray | int | None = None,
    return_weights: bool = False,
):
    """Scaled dot-product attention, exactly as attnspec defines it.

    Args:
        q: (..., Hq, n, dk); k: (..., Hkv, m, dk); v: (..., Hkv, m, dv). Rank >= 2: a missing
            head axis means one head. One dtype among float16, bfloat16, float32, float64.
            Leading batch dims broadcast like NumPy. Query head h reads kv head h // (Hq // Hkv).
        mask: bool, True = may attend, broadcastable to (..., Hq, n, m).
        bias: additive logits of q's dtype, broadcastable like mask; -inf means "cannot attend"
            (such a key is absent, exactly as if masked).
        causal: None, "upper_left" (key j visible from query i iff j <= i) or "lower_right"
            (iff j <= i + m - n). ``True`` is refused: it is ambiguous across frameworks.
        window: (left, right): key j visible iff i' - left <= j <= i' + right, where i' = i, or
            i + m - n when causal is "lower_right".
        scale: multiplies q . k; default 1 / sqrt(dk). Finite and > 0.
        q_lengths, kv_lengths: ints broadcastable to the batch dims. Keys j >= kv_length are not
            visible; query rows i >= q_length see no key and so produce 0.
        return_weights: also return the weights, (..., Hq, n, m).

    Every rule combines with AND. A row with no visible key produces output 0 and weights 0.
    Computed in float64 with a max-subtracted softmax; results are cast to the inputs' dtype.
    From batch * Hq * n * m >= BLOCKED_MIN_LOGITS on, the same function is computed tile by tile
    (`sdpa_blocked`): no (n, m) intermediate, results equal to a few ulp. With return_weights the
    weights themselves are (..., Hq, n, m) by nature; the tiled pass writes them in place, so the
    peak is that one array instead of about five.

    Raises:
        SpecError: for any input outside the definition (see spec/README.md, "Bad input").
    """
    plan = _validate("sdpa", q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths)
    return golden(plan, q, k, v, mask, bias, return_weights)


def golden(plan: SDPAPlan, q, k, v, mask, bias, return_weights: bool):
    """`sdpa` after validation: the vectorized core, or the tiled one for large inputs."""
    if math.prod(plan.full_weights_shape) >= BLOCKED_MIN_LOGITS:
        return blocked_core(plan, q, k, v, mask, bias, return_weights, *GOLDEN_TILES)
    out, weights = attention_core(plan, q, k, v, mask, bias, np.float64, _identity)
    return finish(plan, out, weights, q.dtype, return_weights)


def finish(plan: SDPAPlan, out, weights, dtype, return_weights: bool):
    out = out.astype(dtype).reshape(plan.out_shape)
    if not return_weights:
        return out
    return out, weights.astype(dtype).reshape(plan.weights_shape)


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def attention_core(
    plan: SDPAPlan,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    bias: np.ndarray | None,
    compute: type,
    rnd: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """The vectorized algorithm, parameterized by precision.

    ``compute`` is the dtype every operation runs in; ``rnd`` rounds each stored intermediate
    (identity for the golden; a cast to float16/bfloat16 for the same-precision reference that
    the tolerance rule measures against). Returns out (*batch, Hq, n, dv) and weights
    (*batch, Hq, n, m), both in ``compute``.
    """
    p = plan
    full_w = p.full_weights_shape
    if p.m == 0 or p.n == 0 or p.hq == 0:
        return np.zeros((*p.batch, p.hq, p.n, p.dv), compute), np.zeros(full_w, compute)
    q = rnd(_with_head(q).astype(compute))
    k = rnd(_with_head(k).astype(compute))
    v = rnd(_with_head(v).astype(compute))
    vis = visibility(p.n, p.m, causal=p.causal, window=p.window,
                     q_lengths=p.q_lengths, kv_lengths=p.kv_lengths)
    if mask is not None:
        vis = mask if vis is None else vis & mask
    if bias is not None:
        bias = rnd(bias.astype(compute))
        finite_bias = bias != -np.inf
        vis = finite_bias if vis is None else vis & finite_bias
    if vis is None:
        vis = np.ones((1, 1), bool)
    vis = np.broadcast_to(vis, full_w)  # (..., Hq, n, m)

    G = p.group
    q5 = q.reshape(*q.shape[:-3], p.hkv, G, p.n, p.dk)  # (..., Hkv, G, n, dk)
    kt5 = np.swapaxes(k, -1, -2)[..., :, None, :, :]  # (..., Hkv, 1, dk, m)
    s = rnd(q5 @ kt5)  # (..., Hkv, G, n, m)
    s = s.reshape(*s.shape[:-4], p.hq, p.n, p.m)  # (..., Hq, n, m)
    s = rnd(s * compute(p.scale))
    if bias is not None:
        s = rnd(s + bias)
    s = np.where(vis, s, -np.inf)  # absent keys: their k (even NaN) is dropped here

    row_max = s.max(axis=-1, keepdims=True)  # (..., Hq, n, 1); NaN if a visible logit is NaN
    row_max = np.where(row_max == -np.inf, 0, row_max)  # rows with no visible key
    e = rnd(np.exp(s - row_max))  # absent keys: exp(-inf) = 0
    denom = rnd(e.sum(axis=-1, keepdims=True))
    w = rnd(e / np.where(denom == 0, 1, denom))  # no visible key: 0 / 1 = 0
    w = np.broadcast_to(w, full_w)

    out = _weighted_values(w, v, vis, p, rnd)
    return out, w


def _weighted_values(w, v, vis, p: SDPAPlan, rnd) -> np.ndarray:
    """sum over visible j of w[i, j] * v[j], where a non-finite v[j] reaches only rows that see j.

    A plain ``w @ v`` would turn a masked NaN or inf (weight exactly 0) into NaN for every row,
    since 0 * inf = NaN. So the matmul runs on v with non-finite entries zeroed, and the few
    non-finite entries are added back only where their key is visible.
    """
    G = p.group
    finite = np.isfinite(v)
    v_fin = np.where(finite, v, 0)
    w5 = w.reshape(*w.shape[:-3], p.hkv, G, p.n, p.m)  # (..., Hkv, G, n, m)
    out = rnd(w5 @ v_fin[..., :, None, :, :])  # (..., Hkv, G, n, dv)
    out = out.reshape(*out.shape[:-4], p.hq, p.n, p.dv)  # (..., Hq, n, dv)
    if finite.all():
        return out
    bad_keys = np.flatnonzero((~finite).any(axis=-1).reshape(-1, p.m).any(axis=0))
    v_bad = np.where(finite, 0, v)[..., bad_keys, :]  # (..., Hkv, s, dv), only non-finite parts
    v_bad = np.repeat(v_bad, G, axis=-3)  # (..., Hq, s, dv)
    w_bad = w[..., bad_keys]  # (..., Hq, n, s)
    contrib = w_bad[..., :, :, None] * v_bad[..., None, :, :]  # (..., Hq, n, s, dv)
    contrib = np.where(vis[..., bad_keys][..., None], contrib, 0)
    return out + contrib.sum(axis=-2)


def sdpa_loops(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    causal: str | None = None,
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    q_lengths: np.ndarray | int | None = None,
    kv_lengths: np.ndarray | int | None = None,
    return_weights: bool = False,
):
    """`sdpa` written as explicit loops over batch, head, query and key: the literal definition.

    O(n * m) Python iterations per head, so for small shapes only. It applies each visibility
    rule as written in the docstring of `sdpa` rather than through the mask builders, which makes
    it an independent check of the vectorized code.
    """
    p = _validate("sdpa_loops", q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths)
    full = (*p.batch, p.hq)
    q64 = np.broadcast_to(_with_head(q).astype(np.float64), (*full, p.n, p.dk))
    k64 = np.broadcast_to(_with_head(k).astype(np.float64), (*p.batch, p.hkv, p.m, p.dk))
    v64 = np.broadcast_to(_with_head(v).astype(np.float64), (*p.batch, p.hkv, p.m, p.dv))
    fw = p.full_weights_shape
    mask_f = None if mask is None else np.broadcast_to(mask, fw)
    bias_f = None if bias is None else np.broadcast_to(bias.astype(np.float64), fw)
    out = np.zeros((*full, p.n, p.dv))
    weights = np.zeros(fw)
    shift = p.m - p.n if p.causal == "lower_right" else 0

    def visible(b, h, i, j) -> bool:
        if p.causal == "upper_left" and j > i:
            return False
        if p.causal == "lower_right" and j > i + shift:
            return False
        if p.window is not None and not (i + shift - p.window[0] <= j <= i + shift + p.window[1]):
            return False
        if p.kv_lengths is not None and j >= p.kv_lengths[b]:
            return False
        if p.q_lengths is not None and i >= p.q_lengths[b]:
            return False
        if mask_f is not None and not mask_f[(*b, h, i, j)]:
            return False
        return bias_f is None or bias_f[(*b, h, i, j)] != -np.inf

    for b in np.ndindex(*p.batch):
        for h in range(p.hq):
            g = h // p.group
            for i in range(p.n):
                keys, logits = [], []
                for j in range(p.m):
                    if visible(b, h, i, j):
                        logit = p.scale * float(np.dot(q64[(*b, h, i)], k64[(*b, g, j)]))
                        if bias_f is not None:
                            logit += bias_f[(*b, h, i, j)]
                        keys.append(j)
                        logits.append(logit)
                if not keys:
                    continue  # no visible key: output 0, weights 0
                top = np.max(logits)  # NaN propagates, as in sdpa
                exps = [np.exp(s - top) for s in logits]
                total = sum(exps)
                for j, e in zip(keys, exps):
                    weights[(*b, h, i, j)] = e / total
                    out[(*b, h, i)] += (e / total) * v64[(*b, g, j)]
    return finish(p, out, weights, q.dtype, return_weights)
