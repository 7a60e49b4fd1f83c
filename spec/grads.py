"""Gradients of the golden attention: the backward pass, derived analytically.

Shape letters as in `attnspec.spec.sdpa`:
    ...  leading batch dims (broadcast like NumPy)
    Hq   query heads;  Hkv  key/value heads;  G = Hq // Hkv
    n    queries;      m    keys
    dk   query/key head dim;  dv  value head dim

For one query head with weights P (0 for keys that are not visible), output O and upstream
gradient dO, softmax's Jacobian gives, over visible pairs (i, j) only:

    dP[i, j] = dO[i] . v[j]
    dS[i, j] = P[i, j] * (dP[i, j] - D[i]),   D[i] = dO[i] . O[i]  (= sum_j P[i, j] dP[i, j])
    dq[i]    = scale * sum_j dS[i, j] k[j]
    dk[j]    = scale * sum_i dS[i, j] q[i]
    dv[j]    = sum_i P[i, j] dO[i]
    dbias    = dS

The variants: with dropout the weights that multiply V are P * r, r = keep / (1 - p), so
dv = sum_i P r dO and dP is taken through r (dP = r (dO . v)); D = dO . O still holds. softcap
multiplies dS by 1 - tanh^2(t / softcap) on its way to q and k (t = scale q . k), but not to
bias, which is added after the cap. A sink is one more logit with a zero value: its probability
p_sink = exp(sink - lse) enters D and nothing else, so dsink = -sum over rows of p_sink D. ALiBi
slopes and segment ids are constants.

A pair that is not visible contributes exactly nothing: its k, v, q and dO values (NaN and inf
included) never enter a sum, as in the forward pass. The core works on one query axis per kv head:
folding the G query heads of a group into it, (Hq, n) -> (Hkv, G*n), makes the GQA sums over a
group part of the ordinary sums over i.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.dtypes import round_to
from attnspec.spec.masks import visible
from attnspec.spec.options import take, with_options
from attnspec.spec.sdpa import _identity, _with_head, attention_core
from attnspec.spec.validate import NO_EXTRAS, SDPAExtras, SDPAPlan, numpy_info, plan_options

__all__ = ["sdpa_vjp"]


@with_options(outputs=False)
def sdpa_vjp(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, d_out: np.ndarray, **options: Any
) -> tuple[np.ndarray, ...]:
    """The vector-Jacobian product of `sdpa`: gradients of ``sum(sdpa(...) * d_out)``.

    Args:
        q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths, softcap,
            alibi_slopes, sinks, q_segment_ids, kv_segment_ids, dropout_mask, dropout_p: as for
            `sdpa` (the output alone is differentiated: there is no return_lse here).
        d_out: the upstream gradient, with sdpa's output shape (..., Hq, n, dv) and q's dtype.

    Returns:
        ``(dq, dk, dv)``, then ``dbias`` when ``bias`` is given, then ``dsinks`` when ``sinks``
        is given; each has the shape and dtype of its input. Where an input was broadcast (batch
        dims, a kv head read by a group of G query heads, a broadcast bias), its gradient is
        summed over the broadcast axes; dsinks (Hq,) sums over every row of every batch element.
        alibi_slopes, segment ids and the dropout mask are constants: no gradient.

    With P the weights, O the output and dO = d_out, per query head and over visible pairs only:
    ``dP = dO V^T``, ``dS = P * (dP - rowsum(dO * O))``, ``dq = scale * dS K``,
    ``dk = scale * dS^T Q``, ``dv = P^T dO``, ``dbias = dS``. A pair (i, j) that is not visible
    contributes nothing at all, so a key hidden from every row gets dk = dv = 0 exactly (whatever
    its k and v hold), and a row with no visible key (a padded query, i >= q_length) gets dq = 0
    and adds nothing to dk, dv or dbias (whatever its q and d_out hold). The gradient of a -inf
    bias entry is 0. Computed in float64; results are cast to the inputs' dtype.

    Raises:
        SpecError: for any input `sdpa` refuses, and for a d_out of the wrong type, shape or dtype.
    """
    fn = "sdpa_vjp"
    o = take(fn, options, outputs=False)
    plan, extras = plan_options(fn, q, k, v, o)
    _check_d_out(fn, plan, d_out)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # NaN and inf are handled
        grads = _sdpa_grads(plan, q, k, v, d_out, o["mask"], o["bias"], extras)
    shapes = [x.shape for x in (q, k, v)] + [x.shape for x in (o["bias"], o["sinks"]) if x is not None]
    return tuple(round_to(g, q.dtype).reshape(shape) for g, shape in zip(grads, shapes))


def _check_d_out(fn: str, plan: SDPAPlan, d_out: object) -> None:
    info = numpy_info(fn, "d_out", d_out)
    if info.shape != plan.out_shape:
        raise SpecError(f"{fn}: d_out.shape={info.shape} must equal the output shape {plan.out_shape}")
    if info.dtype != plan.dtype:
        raise SpecError(f"{fn}: d_out.dtype={info.dtype} must equal q.dtype={plan.dtype}")


def _sdpa_grads(
    plan: SDPAPlan, q, k, v, d_out, mask, bias, extras: SDPAExtras = NO_EXTRAS
) -> list[np.ndarray]:
    """float64 gradients, each in its input's shape (a rank-2 input as (1, L, d))."""
    p, ex = plan, extras
    q_h, k_h, v_h = _with_head(q), _with_head(k), _with_head(v)
    shapes = [q_h.shape, k_h.shape, v_h.shape] + [x.shape for x in (bias, ex.sinks) if x is not None]
    if p.n == 0 or p.m == 0 or p.hq == 0:
        return [np.zeros(shape) for shape in shapes]  # no visible pair: every gradient is 0
    # out (..., Hq, n, dv) and the softmax P (..., Hq, n, m), before dropout, as sdpa computes them
    undropped = dataclasses.replace(ex, dropout_mask=None)
    out, w, lse = attention_core(p, q, k, v, mask, bias, np.float64, _identity, undropped, with_lse=True)
    keep = None
    if ex.dropout_mask is not None:
        out, _ = attention_core(p, q, k, v, mask, bias, np.float64, _identity, ex)
        keep = np.broadcast_to(ex.dropout_mask / (1.0 - p.dropout_p), p.full_weights_shape)
    vis = _sdpa_visibility(p, mask, bias, ex)  # (..., Hq, n, m)
    dO = d_out.astype(np.float64).reshape(out.shape)  # (..., Hq, n, dv): a rank-2 d_out gains its head
    q64 = np.broadcast_to(q_h.astype(np.float64), (*p.batch, p.hq, p.n, p.dk))
    k64 = np.broadcast_to(k_h.astype(np.float64), (*p.batch, p.hkv, p.m, p.dk))
    v64 = np.broadcast_to(v_h.astype(np.float64), (*p.batch, p.hkv, p.m, p.dv))

    def fold(x: np.ndarray) -> np.ndarray:
        return x.reshape(*p.batch, p.hkv, p.group * p.n, x.shape[-1])  # (..., Hq, n, c) -> (..., Hkv, G*n, c)

    cap_grad = None
    if p.softcap is not None:
        t = p.scale * (fold(q64) @ np.swapaxes(k64, -1, -2))  # (..., Hkv, G*n, m): capped logits' input
        cap_grad = 1.0 - np.tanh(t / p.softcap) ** 2  # d/dt of softcap * tanh(t / softcap)
    dq, dk, dv, ds = _attention_vjp(
        fold(q64),
        k64,
        v64,
        fold(w),
        fold(vis),
        fold(out),
        fold(dO),
        p.scale,
        keep=None if keep is None else fold(keep),
        cap_grad=cap_grad,
    )
    dq = dq.reshape(*p.batch, p.hq, p.n, p.dk)  # (..., Hkv, G*n, dk) -> (..., Hq, n, dk)
    grads = [dq, dk, dv]
    if bias is not None:
        grads.append(ds.reshape(p.full_weights_shape))  # (..., Hkv, G*n, m) -> (..., Hq, n, m)
    grads = [_sum_to(g, shape) for g, shape in zip(grads, shapes)]
    if ex.sinks is not None:
        # D = dO . O per row, 0 for a row that sees nothing (whatever its d_out holds)
        row = np.where(vis.any(axis=-1), np.sum(dO * out, axis=-1), 0.0)  # (..., Hq, n)
        p_sink = np.exp(ex.sinks.astype(np.float64)[:, None] - lse)  # (..., Hq, n)
        dsinks = -(p_sink * row).reshape(-1, p.hq, p.n).sum(axis=(0, 2))  # (Hq,)
        grads.append(dsinks)
    return grads


def _sdpa_visibility(p: SDPAPlan, mask, bias, extras: SDPAExtras = NO_EXTRAS) -> np.ndarray:
    """The visibility `attention_core` applies, as a (..., Hq, n, m) bool view."""
    vis = visible(p, mask, bias, extras)
    return np.broadcast_to(np.ones((1, 1), bool) if vis is None else vis, p.full_weights_shape)


def _attention_vjp(q, k, v, w, vis, out, d_out, scale: float, *, keep=None, cap_grad=None):
    """The backward pass of weighted-sum attention, given its forward weights and visibility.

    Inputs, all float64 with the same batch dims: q (..., R, dk), k (..., m, dk), v (..., m, dv),
    w and vis (..., R, m), out and d_out (..., R, dv), where R is every query row that reads this
    k and v (G*n for a GQA group). w is the softmax before dropout; ``keep`` (..., R, m) is the
    dropout factor keep / (1 - p) and ``cap_grad`` (..., R, m) the softcap's derivative, or None.
    Returns dq (..., R, dk), dk (..., m, dk), dv (..., m, dv) and dS (..., R, m), the gradient of
    the final logits, each summed over visible pairs only.
    """
    w = np.where(vis, w, 0)  # a row whose visible logit is NaN has NaN weights everywhere
    dp = d_out @ np.swapaxes(v, -1, -2)  # (..., R, dv) @ (..., dv, m) -> (..., R, m)
    if keep is not None:
        dp = dp * keep  # the gradient of P, through the weights P * keep that multiply V
    row = np.sum(d_out * out, axis=-1, keepdims=True)  # (..., R, 1)
    ds = np.where(vis, w * (dp - row), 0)  # (..., R, m); drops the NaN that absent v or dO bring
    ds_qk = ds if cap_grad is None else np.where(vis, ds * cap_grad, 0)  # the uncapped logits'
    vis_t = np.swapaxes(vis, -1, -2)  # (..., m, R)
    dq = scale * _visible_matmul(ds_qk, k, vis)  # (..., R, m) @ (..., m, dk) -> (..., R, dk)
    ds_t = np.swapaxes(ds_qk, -1, -2)  # (..., m, R)
    dk = scale * _visible_matmul(ds_t, q, vis_t)  # (..., m, R) @ (..., R, dk) -> (..., m, dk)
    w_v = w if keep is None else w * keep  # the weights that multiply V
    dv = _visible_matmul(np.swapaxes(w_v, -1, -2), d_out, vis_t)  # (..., m, R) @ (..., R, dv) -> (..., m, dv)
    return dq, dk, dv, ds


def _visible_matmul(a: np.ndarray, b: np.ndarray, vis: np.ndarray) -> np.ndarray:
    """sum over c with vis[r, c] of a[r, c] * b[c]: (..., r, c) @ (..., c, d) -> (..., r, d).

    ``a`` must be 0 wherever ``vis`` is False. A plain matmul would still let a non-finite row of
    ``b`` through (0 * inf = NaN), so the matmul runs on b with non-finite entries zeroed and those
    entries are added back only for the visible pairs, as `sdpa` does for its values.
    """
    finite = np.isfinite(b)
    out = a @ np.where(finite, b, 0)  # (..., r, d)
    if finite.all():
        return out
    bad = np.flatnonzero((~finite).any(axis=-1).reshape(-1, b.shape[-2]).any(axis=0))
    b_bad = np.where(finite, 0, b)[..., bad, :]  # (..., s, d): only the non-finite parts
    contrib = a[..., :, bad, None] * b_bad[..., None, :, :]  # (..., r, s, 1) * (..., 1, s, d)
    contrib = np.where(vis[..., bad][..., None], contrib, 0)  # (..., r, s, 1) selects visible pairs
    return out + contrib.sum(axis=-2)  # (..., r, d)


def _sum_to(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum a broadcast result back to an input's own shape (the adjoint of np.broadcast_to)."""
    x = x.sum(axis=tuple(range(x.ndim - len(shape))))  # drop leading dims the input lacked
    axes = tuple(i for i, (s, t) in enumerate(zip(shape, x.shape)) if s == 1 and t != 1)
    return x.sum(axis=axes, keepdims=True)
