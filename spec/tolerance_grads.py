"""The tolerance rule for gradients: how far a backend's sdpa_vjp may be from the float64 golden.

The same shape as the forward rule (`attnspec.spec.tolerance`), per gradient tensor T:

    golden_T  = `sdpa_vjp` (float64 arithmetic)
    ref_T     = the golden backward run from the reference forward (`reference_sdpa`: weights P
                and output O rounded to D) in the inputs' precision: float32 arithmetic for
                float16, bfloat16 and float32 inputs (as fused backward kernels accumulate), each
                result rounded once to D; for float64 the reference is the golden itself
    allowed_T = K * max |ref_T - golden_T| + floor_T,   K = 4 (the forward rule's K, same reasons)
    floor_T   = eps(D) * S_T * (1 + sqrt(c_T) + 2 * sqrt(dk) * L)

S_T is the largest size an entry of T can have from the inputs, c_T the number of terms summed
into one entry, L the logit scale of the forward rule. With A = max|dO| * max|v| (the size of
dP = dO . v and of D = dO . O, so |dS| <= 2 A P), R = G * n (the query rows reading one kv
head) and Pcol = the largest column sum of P over those rows (<= R):

    dbias  S = 2 A                       c = m + dv   (dP is a dv-term dot product; D sums m)
    dq     S = 2 A * scale * max|k|      c = m + dv
    dk     S = 2 A * scale * max|q| * Pcol,  c = R + dv
    dv     S = max|dO| * Pcol            c = R

Each term is first-order: the rounding of the result (1), a random-walk sum of c terms
(sqrt(c)), and the relative error 2 sqrt(dk) eps L that a logit error puts on every weight. The
dS = P * (dP - D) cancellation is why S is built from A and not from |dS| itself: two nearly
equal terms of size A leave an absolute error of order eps * A whatever their difference is.
PyTorch's own tests allow backward errors several times the forward's, tuned per dtype; this
rule derives them per case instead.
"""

from __future__ import annotations

import math

import numpy as np

from attnspec.spec._validate import SDPAPlan
from attnspec.spec.grads import _attention_vjp, _sdpa_visibility, _sum_to
from attnspec.spec.sdpa import _with_head
from attnspec.spec.tolerance import _NP, K, _logit_scale, eps, reference_sdpa

__all__ = ["GRAD_NAMES", "reference_sdpa_vjp", "sdpa_vjp_allowed"]

GRAD_NAMES = ("dq", "dk", "dv", "dbias")


def reference_sdpa_vjp(plan: SDPAPlan, q, k, v, d_out, mask, bias) -> list[np.ndarray]:
    """The golden backward in the inputs' precision (the rule's ``ref_T``), as float64 arrays."""
    p = plan
    dt = _NP[p.dtype]
    ct = np.float64 if p.dtype == "float64" else np.float32
    out, w = reference_sdpa(p, q, k, v, mask, bias, return_weights=True)  # rounded to D
    shapes = [_with_head(x).shape for x in (q, k, v)] + ([] if bias is None else [bias.shape])
    if p.n == 0 or p.m == 0 or p.hq == 0:
        return [np.zeros(x.shape) for x in (q, k, v) + (() if bias is None else (bias,))]
    vis = _sdpa_visibility(p, mask, bias)  # (..., Hq, n, m)

    def fold(x):  # (..., Hq, n, c) -> (..., Hkv, G*n, c), batch dims broadcast out
        x = np.broadcast_to(x, (*p.batch, p.hq, p.n, x.shape[-1]))
        return x.reshape(*p.batch, p.hkv, p.group * p.n, x.shape[-1]).astype(ct)

    kk = np.broadcast_to(_with_head(k), (*p.batch, p.hkv, p.m, p.dk)).astype(ct)
    vv = np.broadcast_to(_with_head(v), (*p.batch, p.hkv, p.m, p.dv)).astype(ct)
    full_out = (*p.batch, p.hq, p.n, p.dv)
    with np.errstate(invalid="ignore", over="ignore"):
        dq, dk, dv, ds = _attention_vjp(
            fold(_with_head(q)), kk, vv, fold(w.reshape(p.full_weights_shape)), fold(vis),
            fold(out.reshape(full_out)), fold(d_out.reshape(full_out)), ct(p.scale))
    grads = [dq.reshape(*p.batch, p.hq, p.n, p.dk), dk, dv]
    if bias is not None:
        grads.append(ds.reshape(p.full_weights_shape))
    originals = [x.shape for x in (q, k, v)] + ([] if bias is None else [bias.shape])
    return [_sum_to(g, s).astype(dt).astype(np.float64).reshape(o)  # one rounding, after the sums
            for g, s, o in zip(grads, shapes, originals)]


def sdpa_vjp_allowed(plan: SDPAPlan, q, k, v, d_out, bias, vis: np.ndarray, weights: np.ndarray,
                     err_ref: dict[str, float]) -> dict[str, float]:
    """``allowed_T`` for each gradient of one sdpa_vjp case (``weights``: the golden P, float64)."""
    p = plan

    def finite_max(x) -> float:
        x = np.abs(np.asarray(x, dtype=np.float64))
        return float(x[np.isfinite(x)].max(initial=0.0))

    A = finite_max(d_out) * finite_max(v)
    L = _logit_scale(p, q, k, bias, vis)
    w = np.where(np.isfinite(weights), weights, 0).reshape(p.full_weights_shape)
    w = w.reshape(*p.batch, p.hkv, p.group * p.n, p.m)  # (..., Hkv, G*n, m)
    pcol = float(w.sum(axis=-2).max(initial=0.0))
    R = p.group * p.n
    sizes = {
        "dq": (2 * A * p.scale * finite_max(k), p.m + p.dv),
        "dk": (2 * A * p.scale * finite_max(q) * pcol, R + p.dv),
        "dv": (finite_max(d_out) * pcol, R),
        "dbias": (2 * A, p.m + p.dv),
    }
    e = eps(p.dtype)
    return {name: K * err_ref.get(name, 0.0) + e * S * (1 + math.sqrt(c) + 2 * math.sqrt(p.dk) * L)
            for name, (S, c) in sizes.items()}
