"""Scaled dot-product attention: the golden definition.

Shape letters, used in every shape comment below:
    ...  leading batch dims (broadcast like NumPy)
    Hq   query heads;  Hkv  key/value heads (Hq % Hkv == 0);  G = Hq // Hkv
    n    queries;      m    keys
    dk   query/key head dim;  dv  value head dim

For query head h, batch index b, query row i, with i' its anchor (`masks.query_anchor`) and
visible(i, j) built by `masks.visible`:

    visible(i, j)  = AND of every rule given (mask, bias != -inf, causal, window, lengths,
                     segment ids)
    t[i, j]        = scale * (q[b, h, i] . k[b, h // G, j]),  capped to softcap * tanh(t / softcap)
    s[i, j]        = t[i, j] + bias[b, h, i, j] - alibi_slopes[b, h] * |i' - j|      (visible j)
    M[i]           = max(max over visible j of s[i, j], sinks[h])
    Z[i]           = sum over visible j of exp(s[i, j] - M) + exp(sinks[h] - M)
    w[i, j]        = exp(s[i, j] - M) / Z * dropout_mask[i, j] / (1 - dropout_p)     (visible j)
                     0                                                               (otherwise)
    out[b, h, i]   = sum over visible j of w[i, j] * v[b, h // G, j]
    lse[b, h, i]   = M + log(Z)

(the terms of an argument not given are left out). A row with no visible key gets w = 0 and
out = 0, and lse = sinks[h] (or -inf without sinks). Keys that are not visible are absent: their
k and v values (NaN and inf included) never reach the row. Everything is computed in float64 and
the result is cast to the inputs' dtype (lse: float32, or float64 for float64 inputs).

Large inputs (batch * Hq * n * m >= BLOCKED_MIN_LOGITS) are computed by the tiled online softmax
of `attnspec.spec.blocked`, the same function to a few ulp, in O(tile + n * dv) extra memory.
`attnspec.spec.sdpa_loops` is this definition as plain loops, the check the tests compare against.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from attnspec.spec.blocked import blocked_core
from attnspec.spec.masks import plan_anchor, visible
from attnspec.spec.options import NAMES
from attnspec.spec.validate import NO_EXTRAS, SDPAExtras, SDPAPlan, finish, plan_options

__all__ = ["BLOCKED_MIN_LOGITS", "GOLDEN_TILES", "finish", "golden", "plan_options", "sdpa"]

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


def plan_numpy(
    fn,
    q,
    k,
    v,
    mask,
    bias,
    causal,
    window,
    scale,
    q_lengths,
    kv_lengths,
    extras: SDPAExtras = NO_EXTRAS,
    softcap=None,
    dropout_p=None,
    return_lse=False,
) -> SDPAPlan:
    """Validate an sdpa call on NumPy arrays and return its plan (`attnspec.spec.validate`): the
    keywords one by one, as the golden has them (`plan_options` takes them as a dict)."""
    o = {
        "mask": mask,
        "bias": bias,
        "causal": causal,
        "window": window,
        "scale": scale,
        "q_lengths": q_lengths,
        "kv_lengths": kv_lengths,
        "softcap": softcap,
        **dataclasses.asdict(extras),
        "dropout_p": dropout_p,
        "return_lse": return_lse,
    }
    return plan_options(fn, q, k, v, o)[0]


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
    softcap: float | None = None,
    alibi_slopes: np.ndarray | None = None,
    sinks: np.ndarray | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
    dropout_mask: np.ndarray | None = None,
    dropout_p: float | None = None,
    return_weights: bool = False,
    return_lse: bool = False,
):
    """Scaled dot-product attention, exactly as attnspec defines it.

    Args:
        q: (..., Hq, n, dk); k: (..., Hkv, m, dk); v: (..., Hkv, m, dv). Rank >= 2: a missing
            head axis means one head. One dtype among float16, bfloat16, float32, float64.
            Leading batch dims broadcast like NumPy. Query head h reads kv head h // (Hq // Hkv).
        mask: bool, True = may attend, broadcastable to (..., Hq, n, m).
        bias: additive logits of q's dtype, broadcastable like mask; -inf means "cannot attend"
            (such a key is absent, exactly as if masked).
        causal: None, "upper_left" (key j visible from query i iff j <= i), "lower_right"
            (iff j <= i + m - n) or "lower_right_lengths" (iff j <= i + kend - qend: lower-right
            on each sequence's actual lengths, see `masks.query_anchor`). ``True`` is refused: it
            is ambiguous across frameworks.
        window: (left, right): key j visible iff i' - left <= j <= i' + right, where i' is the
            causal alignment's anchor (i when causal is None or "upper_left").
        scale: multiplies q . k; default 1 / sqrt(dk). Finite and > 0.
        q_lengths, kv_lengths: ints broadcastable to the batch dims. Keys j >= kv_length are not
            visible; query rows i >= q_length see no key and so produce 0.
        softcap: finite and > 0: each scaled logit t becomes softcap * tanh(t / softcap), before
            bias, ALiBi and masking (FlashAttention's order).
        alibi_slopes: (Hq,) or (..., Hq) over the batch dims, any float dtype: adds
            -slope[h] * |i' - j| to the logit, i' the same anchor as the window. A constant.
        sinks: (Hq,), q's dtype: one extra logit per query head in every row's softmax
            denominator, with a zero value; the weights then sum to less than 1.
        q_segment_ids, kv_segment_ids: integer (..., n) and (..., m), both or neither: key j is
            visible from query i only when their ids are equal and >= 0 (negative = padding).
        dropout_mask: bool, True = keep, broadcastable to (..., Hq, n, m); needs dropout_p.
            Weights become w * keep / (1 - dropout_p), and are returned so (out = weights @ v).
        dropout_p: in [0, 1). Without a dropout_mask only 0 (or None) is accepted: the spec never
            draws random numbers.
        return_weights: also return the weights, (..., Hq, n, m).
        return_lse: also return lse = log(sum over visible j of exp(s_ij) + exp(sink)),
            (..., Hq, n) ((n,) for rank-2 q), float32 (float64 for float64 inputs); -inf for a
            row with no visible key and no sink. Dropout does not change it.

    Returns:
        out (..., Hq, n, dv); ``(out, weights)``, ``(out, lse)`` or ``(out, weights, lse)`` when
        asked for.

    Every rule combines with AND. A row with no visible key produces output 0 and weights 0.
    Computed in float64 with a max-subtracted softmax; results are cast to the inputs' dtype.
    From batch * Hq * n * m >= BLOCKED_MIN_LOGITS on, the same function is computed tile by tile
    (`sdpa_blocked`): no (n, m) intermediate, results equal to a few ulp. With return_weights the
    weights themselves are (..., Hq, n, m) by nature; the tiled pass writes them in place, so the
    peak is that one array instead of about five.

    Raises:
        SpecError: for any input outside the definition (see spec/README.md, "Bad input").
    """
    given = locals()  # the keywords of the signature above, which is the table's (spec/options.py)
    plan, extras = plan_options("sdpa", q, k, v, {name: given[name] for name in NAMES})
    return golden(plan, q, k, v, mask, bias, return_weights, extras)


def golden(plan: SDPAPlan, q, k, v, mask, bias, return_weights: bool, extras: SDPAExtras = NO_EXTRAS):
    """`sdpa` after validation: the vectorized core, or the tiled one for large inputs."""
    if math.prod(plan.full_weights_shape) >= BLOCKED_MIN_LOGITS:
        return blocked_core(plan, q, k, v, mask, bias, return_weights, *GOLDEN_TILES, extras=extras)
    out, weights, lse = attention_core(
        plan, q, k, v, mask, bias, np.float64, _identity, extras, with_lse=True
    )
    return finish(plan, out, weights, q.dtype, return_weights, lse)


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def alibi_term(plan: SDPAPlan, extras: SDPAExtras, compute: type = np.float64) -> np.ndarray:
    """-slope[h] * |i' - j|, broadcastable to (..., Hq, n, m); i' as for the window."""
    p = plan
    anchor = plan_anchor(p, extras.q_segment_ids, extras.kv_segment_ids)
    dist = np.abs(anchor[..., None, :, None] - np.arange(p.m))  # (..., 1, n, m)
    assert extras.alibi_slopes is not None  # the ALiBi term exists only for a call with alibi_slopes
    slopes: np.ndarray = extras.alibi_slopes.astype(compute)[..., :, None, None]  # (..., Hq, 1, 1)
    return -slopes * dist.astype(compute)  # (..., Hq, n, m)


def attention_core(
    plan: SDPAPlan,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    bias: np.ndarray | None,
    compute: type,
    rnd: Callable[[np.ndarray], np.ndarray],
    extras: SDPAExtras = NO_EXTRAS,
    *,
    with_lse: bool = False,
):
    """The vectorized algorithm, parameterized by precision.

    ``compute`` is the dtype every operation runs in; ``rnd`` rounds each stored intermediate
    (identity for the golden; a cast to float16/bfloat16 for the same-precision reference that
    the tolerance rule measures against). Returns out (*batch, Hq, n, dv) and weights
    (*batch, Hq, n, m), both in ``compute``, and with ``with_lse`` also lse (*batch, Hq, n),
    computed in ``compute`` from the rounded row max and denominator.
    """
    p, ex = plan, extras
    full_w = p.full_weights_shape
    sink = None if ex.sinks is None else rnd(ex.sinks.astype(compute))[:, None, None]  # (Hq, 1, 1)
    if p.m == 0 or p.n == 0 or p.hq == 0:
        lse: np.ndarray = np.full((*p.batch, p.hq, p.n), -np.inf, compute)
        if sink is not None:
            lse[...] = sink[:, :, 0]  # no visible key: the sink alone
        empty: tuple[np.ndarray, np.ndarray] = (
            np.zeros((*p.batch, p.hq, p.n, p.dv), compute),
            np.zeros(full_w, compute),
        )
        return (*empty, lse) if with_lse else empty
    q = rnd(_with_head(q).astype(compute))
    k = rnd(_with_head(k).astype(compute))
    v = rnd(_with_head(v).astype(compute))
    if bias is not None:
        bias = rnd(bias.astype(compute))
    vis = visible(p, mask, bias, ex)
    if vis is None:
        vis = np.ones((1, 1), bool)
    vis = np.broadcast_to(vis, full_w)  # (..., Hq, n, m)

    G = p.group
    q5 = q.reshape(*q.shape[:-3], p.hkv, G, p.n, p.dk)  # (..., Hkv, G, n, dk)
    kt5 = np.swapaxes(k, -1, -2)[..., :, None, :, :]  # (..., Hkv, 1, dk, m)
    with np.errstate(invalid="ignore", over="ignore"):  # a hidden key's NaN/inf: its logit is dropped below
        s = rnd(q5 @ kt5)  # (..., Hkv, G, n, m)
        s = s.reshape(*s.shape[:-4], p.hq, p.n, p.m)  # (..., Hq, n, m)
        s = rnd(s * compute(p.scale))
    if p.softcap is not None:
        cap = compute(p.softcap)
        s = rnd(rnd(np.tanh(rnd(s / cap))) * cap)
    if bias is not None:
        s = rnd(s + bias)
    if ex.alibi_slopes is not None:
        s = rnd(s + rnd(alibi_term(p, ex, compute)))
    s = np.where(vis, s, -np.inf)  # absent keys: their k (even NaN) is dropped here

    row_max = s.max(axis=-1, keepdims=True)  # (..., Hq, n, 1); NaN if a visible logit is NaN
    if sink is not None:
        row_max = np.maximum(row_max, sink)  # the sink is one more logit of every row
    row_max = np.where(row_max == -np.inf, 0, row_max)  # rows with no visible key (and no sink)
    e = rnd(np.exp(s - row_max))  # absent keys: exp(-inf) = 0
    denom = e.sum(axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + rnd(np.exp(sink - row_max))
    denom = rnd(denom)
    w = rnd(e / np.where(denom == 0, 1, denom))  # no visible key: 0 / 1 = 0
    if ex.dropout_mask is not None:
        w = rnd(w * ex.dropout_mask / compute(1.0 - p.dropout_p))
    w = np.broadcast_to(w, full_w)

    out = _weighted_values(w, v, vis, p, rnd)
    if not with_lse:
        return out, w
    with np.errstate(divide="ignore"):  # log(0) = -inf: no visible key and no sink
        lse = (row_max + np.log(denom))[..., 0]  # (..., Hq, n)
    return out, w, np.broadcast_to(lse, (*p.batch, p.hq, p.n))


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
    with np.errstate(invalid="ignore", over="ignore"):  # 0 * inf of a hidden key: dropped just below
        contrib = w_bad[..., :, :, None] * v_bad[..., None, :, :]  # (..., Hq, n, s, dv)
    contrib = np.where(vis[..., bad_keys][..., None], contrib, 0)
    return out + contrib.sum(axis=-2)
