"""The exact sdpa algorithm written once against the Python array API standard (2024.12).

``xp`` is any namespace that implements the standard: what `array_api_compat.array_namespace`
returns (NumPy, CuPy, torch through array-api-compat, array_api_strict), or ``jax.numpy``, which
implements the standard itself. Only standard functions and operators are used, so running under
array_api_strict proves it. Shape letters as in `attnspec.spec.sdpa`.

It follows the golden step for step (max-subtracted softmax over visible keys, rows with no
visible key give 0, masked keys are absent), in float32 for float16/bfloat16/float32 inputs and
float64 for float64, then rounds once to the input dtype. It has no data-dependent branch and no
data-dependent shape, so JAX can trace it under `jax.jit`.
"""

from __future__ import annotations

import math

from attnspec.backends._common import compute_dtype_name
from attnspec.spec.validate import SDPAPlan


def attention(
    xp,
    p: SDPAPlan,
    q,
    k,
    v,
    vis,
    bias,
    *,
    nonfinite_v: bool,
    want_weights: bool,
    alibi=None,
    sinks=None,
    keep=None,
):
    """out (*batch, Hq, n, dv), weights (*batch, Hq, n, m) if asked (else None), in q's dtype,
    and lse (*batch, Hq, n) in the plan's lse dtype if ``p.return_lse`` (else None).

    q, k, v carry a head axis (rank >= 3); ``vis`` is bool and broadcasts to (*batch, Hq, n, m),
    or None. ``nonfinite_v`` asks for the exact treatment of NaN/inf in v (decided by the caller,
    outside any trace); without it, v must be finite. Callers handle n = 0, m = 0 and Hq = 0.
    The variants: ``p.softcap`` caps the scaled logits before bias; ``alibi`` (broadcasting to
    (*batch, Hq, n, m), the term -slope * |i' - j|) is added after bias; ``sinks`` (Hq,) is one
    more logit of every row's max and denominator; ``keep`` (bool) multiplies the weights by
    keep / (1 - p.dropout_p).
    """
    dtype = q.dtype
    ct = getattr(xp, compute_dtype_name(p.dtype))
    q, k, v = xp.astype(q, ct), xp.astype(k, ct), xp.astype(v, ct)
    full_w = (*p.batch, p.hq, p.n, p.m)

    q5 = xp.reshape(q, (*q.shape[:-3], p.hkv, p.group, p.n, p.dk))  # (..., Hkv, G, n, dk)
    kt5 = xp.matrix_transpose(xp.expand_dims(k, axis=-3))  # (..., Hkv, 1, dk, m)
    s = xp.matmul(q5, kt5)  # (..., Hkv, G, n, m)
    s = xp.reshape(s, (*s.shape[:-4], p.hq, p.n, p.m)) * p.scale  # (..., Hq, n, m)
    if p.softcap is not None:
        s = xp.tanh(s / p.softcap) * p.softcap
    if bias is not None:
        s = s + xp.astype(bias, ct)
    if alibi is not None:
        s = s + xp.astype(alibi, ct)
    if vis is not None:
        s = xp.where(vis, s, -math.inf)  # absent keys: their k (even NaN) is dropped here

    row_max = xp.max(s, axis=-1, keepdims=True)  # (..., Hq, n, 1); NaN propagates
    sink = None if sinks is None else xp.reshape(xp.astype(sinks, ct), (p.hq, 1, 1))  # (Hq, 1, 1)
    if sink is not None:
        row_max = xp.maximum(row_max, sink)  # the sink is one more logit of every row
    row_max = xp.where(row_max == -math.inf, 0.0, row_max)  # rows with no visible key
    e = xp.exp(s - row_max)
    denom = xp.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + xp.exp(sink - row_max)
    w = e / xp.where(denom == 0, 1.0, denom)  # no visible key: 0 / 1 = 0
    lse = None
    if p.return_lse:
        lse = row_max + xp.log(denom)  # (..., Hq, n, 1); log(0) = -inf: no visible key, no sink
        lse = xp.astype(lse[..., 0], getattr(xp, p.lse_dtype))
        lse = _finish(xp, lse, (*p.batch, p.hq, p.n), p.lse_shape)
    if keep is not None:
        w = w * xp.astype(keep, ct) / (1.0 - p.dropout_p)

    finite = xp.isfinite(v)
    out = _grouped_matmul(xp, p, w, xp.where(finite, v, 0.0))  # (..., Hq, n, dv)
    if nonfinite_v:
        out = _nonfinite_values(xp, p, w, v, vis, out, full_w, ct)

    out = _finish(xp, xp.astype(out, dtype), (*p.batch, p.hq, p.n, p.dv), p.out_shape)
    if not want_weights:
        return out, None, lse
    return out, _finish(xp, xp.astype(w, dtype), full_w, p.weights_shape), lse


def logit_floor(xp, q, k, bias, scale: float):
    """A lower bound of every logit a call forms: the lowest finite bias entry (0 without
    one) less scale * max ||q_i|| * max ||k_j|| (Cauchy-Schwarz bounds |scale * q . k|)."""
    q2 = xp.max(xp.sum(q * q, axis=-1)) if math.prod(q.shape) else 0.0
    k2 = xp.max(xp.sum(k * k, axis=-1)) if math.prod(k.shape) else 0.0
    floor = -scale * xp.sqrt(q2) * xp.sqrt(k2)
    if bias is not None and math.prod(bias.shape):
        floor = floor + xp.minimum(xp.min(xp.where(xp.isfinite(bias), bias, xp.inf)), 0.0)
    return floor


def _finish(xp, x, full: tuple[int, ...], final: tuple[int, ...]):
    # broadcast only when needed: NumPy's broadcast views are read-only
    x = x if tuple(x.shape) == full else xp.broadcast_to(x, full)
    return xp.reshape(x, final)  # drops the head axis of rank-2 inputs


def _grouped_matmul(xp, p: SDPAPlan, a, b):
    """a (..., Hq, n, m) @ b (..., Hkv, m, c), query head h reading kv head h // G."""
    a5 = xp.reshape(a, (*a.shape[:-3], p.hkv, p.group, p.n, p.m))  # (..., Hkv, G, n, m)
    r = xp.matmul(a5, xp.expand_dims(b, axis=-3))  # (..., Hkv, G, n, c)
    return xp.reshape(r, (*r.shape[:-4], p.hq, p.n, r.shape[-1]))  # (..., Hq, n, c)


def _nonfinite_values(xp, p: SDPAPlan, w, v, vis, out, full_w, ct):
    """Put back the NaN/inf entries of v, only in rows that see their key.

    ``out`` was computed with those entries zeroed, because a plain w @ v turns a masked inf
    (weight exactly 0) into NaN for every row (0 * inf = NaN). What a visible non-finite v[j, c]
    does to out[i, c] is IEEE arithmetic on w[i, j] * v[j, c]: NaN stays NaN, w > 0 times +-inf
    is +-inf, w = 0 times inf is NaN, and +inf plus -inf is NaN. Counting, per row and column,
    the visible keys of each kind is a matmul of 0/1 matrices, exact in floating point, so no
    data-dependent gather is needed.
    """
    w = xp.broadcast_to(w, full_w)
    seen = xp.ones_like(w, dtype=xp.bool) if vis is None else xp.broadcast_to(vis, full_w)

    def hits(rows, keys):  # (..., Hq, n, dv): does any visible key of this kind reach the row?
        return _grouped_matmul(xp, p, xp.astype(rows, ct), xp.astype(keys, ct)) > 0

    pos_inf, neg_inf = v == math.inf, v == -math.inf
    any_nan = hits(seen, xp.isnan(v))
    any_pos = hits(seen & (w > 0), pos_inf)
    any_neg = hits(seen & (w > 0), neg_inf)
    zero_times_inf = hits(seen & (w == 0), pos_inf | neg_inf)
    nan = any_nan | (any_pos & any_neg) | zero_times_inf | xp.isnan(out)
    out = xp.where(any_pos, math.inf, out)
    out = xp.where(any_neg, -math.inf, out)
    return xp.where(nan, math.nan, out)


def empty(xp, p: SDPAPlan, dtype, device, want_weights: bool, sinks=None):
    """The result when n, m or Hq is 0: every row has no visible key, so zeros (and lse the sink
    alone, -inf without one), returned as `results` does."""
    out = xp.zeros(p.out_shape, dtype=dtype, device=device)
    weights = xp.zeros(p.weights_shape, dtype=dtype, device=device) if want_weights else None
    lse = None
    if p.return_lse:
        lse_dtype = getattr(xp, p.lse_dtype)
        if sinks is None:
            lse = xp.full(p.lse_shape, -math.inf, dtype=lse_dtype, device=device)
        else:  # (Hq,) -> (*batch, Hq, n)
            col = xp.reshape(xp.astype(sinks, lse_dtype), (p.hq, 1))
            lse = xp.reshape(xp.broadcast_to(col, (*p.batch, p.hq, p.n)), p.lse_shape)
    return results(p, out, weights, lse)


def results(p: SDPAPlan, out, weights, lse):
    """out, then weights when given, then lse when the plan asks: the spec's return convention."""
    found = [out] + ([] if weights is None else [weights]) + ([lse] if p.return_lse else [])
    return found[0] if len(found) == 1 else tuple(found)
