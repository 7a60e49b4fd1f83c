"""The tolerance rule for mha: how far a backend's multi-head attention may be from the golden.

The rule is sdpa's (`attnspec.spec.tolerance`), with the reference and the floor extended to the
three projections around the per-head sdpa. For a case with inputs of dtype D:

    golden   = `attnspec.spec.mha` on the inputs (float64 arithmetic, before the final rounding)
    ref      = the same algorithm with every stored intermediate rounded to D: each projection's
               matmul and bias add, every step of sdpa (`attention_core` with rounding), the
               merge, the output projection (for float16 and bfloat16 each operation runs in
               float32 first, as fused kernels accumulate)
    err_ref  = max |ref - golden|
    allowed  = K * err_ref + floor,  K = 4 as for sdpa

The floor is the first-order error of an implementation as exact as D allows that sums in
another order (it is what judges float64, where ref is the golden and err_ref is 0). With
u = eps(D), and for a projection y = x W^T + b its scale A_y = max over rows and outputs of
sum_d |x_d W_od| + |b_o|:

    projection error      d_y  = u * (1 + sqrt(in_features)) * A_y      (one rounding, plus a
                                 random walk over the in_features products)
    logit error           d_L  = scale * hd * (d_q * A_k + A_q * d_k)   (q . k over hd terms)
    attention output      d_o  = u * A_v * (1 + sqrt(m) + 2 sqrt(hd) L) (sdpa's own floor on the
                                 projected q, k, v; L the largest visible logit magnitude)
                                 + 2 * d_L * A_v                         (a logit error of d_L moves
                                 each weight by up to 2 d_L relative)
                                 + d_v                                   (the values' own error)
    output                floor = d_o * max_r sum_j |W_o[r, j]|          (carried through W_o)
                                 + u * (1 + sqrt(E)) * A_out             (the output projection)

Weights use u * (1 + sqrt(m) + 2 sqrt(hd) L) + 2 * d_L (sdpa's floor with V = 1, plus the
projected logits' error). At the kit's sizes the float64 floor is ~1e-14 of the output's scale.

The variants (issue #15) enter as they enter sdpa's rule (`attnspec.spec.tolerance`): ref runs
them (`attention_core` with the variant arrays); ALiBi terms and sinks join L; softcap's tanh has
slope <= 1, so d_L and L stay bounds; segment ids and "lower_right_lengths" only change which
pairs are visible, which L and d_L are taken over; dropout scales the kept weights, and so their
errors, by 1 / (1 - p), which divides d_o's attention part and the weights' floor. The
log-sum-exp gets sdpa's `lse_allowed` floor on the projected q, k plus d_L: d lse / d s_j = w_j
and the w_j sum to at most 1, so the projections' logit error d_L moves lse by at most d_L.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from attnspec.spec.mha import (
    MHAParams,
    in_float64,
    merge_heads,
    mha,
    plan_mha_numpy,
    split_heads,
)
from attnspec.spec.options import NAMES
from attnspec.spec.sdpa import attention_core, sdpa
from attnspec.spec.tolerance import _NP, K, _logit_scale, compare, eps, logit_scale, visibility_view
from attnspec.spec.validate import SDPAExtras

__all__ = ["MHAGolden", "mha_golden", "reference_mha"]

#: sdpa's keywords besides mask and bias, which mha passes through
_OPTIONS = tuple(name for name in NAMES if name not in ("mask", "bias", "return_weights"))


@dataclass(frozen=True)
class MHAGolden:
    """The float64 golden of one mha case and the errors the tolerance rule allows."""

    out: np.ndarray  # (..., n, E), float64, unrounded
    weights: np.ndarray  # (..., H, n, m)
    allowed_out: float
    allowed_w: float
    err_ref_out: float
    err_ref_w: float
    lse: np.ndarray | None = None  # (..., H, n), float64, when the case asks for it (return_lse)
    allowed_lse: float = 0.0
    err_ref_lse: float = 0.0


def _extras(options: dict[str, Any]) -> SDPAExtras:
    return SDPAExtras.of(options)


def reference_mha(query, key, value, params: MHAParams, *, num_heads: int, **options: Any):
    """The golden algorithm with every stored intermediate rounded to the inputs' dtype; ``options``
    are `mha`'s other keywords (num_kv_heads, mask, bias and the sdpa options).

    Returns (out (..., n, E), weights (..., H, n, m)) in the inputs' dtype, and the lse
    (..., H, n) in its dtype when ``return_lse`` is among the options.
    """
    num_kv_heads, mask, bias = (
        options.pop("num_kv_heads", None),
        options.pop("mask", None),
        options.pop("bias", None),
    )
    options = {k: options[k] for k in _OPTIONS if options.get(k) is not None}
    plan = plan_mha_numpy(
        "reference_mha", query, key, value, params, num_heads, num_kv_heads, mask, bias, options
    )
    dt = _NP[plan.dtype]
    compute = np.float32 if plan.dtype in ("float16", "bfloat16") else dt

    def rnd(x: np.ndarray) -> np.ndarray:
        return x.astype(dt).astype(compute)

    def project(x, w, b):
        y = rnd(x.astype(compute) @ w.astype(compute).T)  # (..., L, in) @ (in, out)
        return y if b is None else rnd(y + b.astype(compute))

    p = params
    q = split_heads(project(query, p.w_q, p.b_q), num_heads)  # (..., H, n, hd)
    k = split_heads(project(key, p.w_k, p.b_k), plan.hkv)  # (..., Hkv, m, hd)
    v = split_heads(project(value, p.w_v, p.b_v), plan.hkv)  # (..., Hkv, m, hd)
    with np.errstate(all="ignore"):
        o, w, lse = attention_core(
            plan, q, k, v, mask, bias, compute, rnd, _extras(options), with_lse=True
        )  # (*batch, H, n, hd), (*batch, H, n, m), (*batch, H, n)
    out = project(merge_heads(o), p.w_o, p.b_o)  # (*batch, n, E)
    if plan.return_lse:
        return out.astype(dt), w.astype(dt), lse.astype(plan.lse_dtype)
    return out.astype(dt), w.astype(dt)


def mha_golden(
    query,
    key,
    value,
    params: MHAParams,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    mask=None,
    bias=None,
    **options: Any,
) -> MHAGolden:
    """The golden of one case (inputs in their dtype, params exact in it) and its tolerances."""
    opts: dict[str, Any] = {k: options.get(k) for k in _OPTIONS if options.get(k) is not None}
    plan = plan_mha_numpy("mha_golden", query, key, value, params, num_heads, num_kv_heads, mask, bias, opts)
    f64 = [x.astype(np.float64) for x in (query, key, value)]
    q64, k64, v64 = f64
    gold = mha(
        q64,
        k64,
        v64,
        params,
        bias=None if bias is None else bias.astype(np.float64),
        return_weights=True,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        mask=mask,
        **in_float64(**opts),
    )  # (out, weights[, lse]), float64
    ref = reference_mha(
        query,
        key,
        value,
        params,
        bias=bias,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        mask=mask,
        **opts,
    )
    err = [compare(r, g, np.inf).max_abs_err for r, g in zip(ref, gold)]
    floor_out, floor_w, floor_lse = _floors(
        plan, f64, params, mask, bias, num_heads, opts, gold[2] if plan.return_lse else None
    )
    golden = MHAGolden(gold[0], gold[1], K * err[0] + floor_out, K * err[1] + floor_w, err[0], err[1])
    if plan.return_lse:
        golden = replace(golden, lse=gold[2], allowed_lse=K * err[2] + floor_lse, err_ref_lse=err[2])
    return golden


def _abs_projection(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """|x| @ |w|^T + |b|: per entry of the projection, the scale its rounding error grows with."""
    a = np.abs(np.nan_to_num(x, posinf=0, neginf=0)) @ np.abs(w.astype(np.float64)).T  # (..., L, out)
    return a if b is None else a + np.abs(b.astype(np.float64))


def _floors(
    plan,
    f64,
    params: MHAParams,
    mask,
    bias,
    num_heads: int,
    opts: dict[str, Any],
    gold_lse: np.ndarray | None,
) -> tuple[float, float, float]:
    """The floors of the output, the weights and the lse (0 when the case has none)."""
    query, key, value = f64
    p = params
    u = eps(plan.dtype)
    hd, e, hkv = plan.dk, p.embed_dim, plan.hkv
    extras = _extras(opts)
    bias64 = None if bias is None else bias.astype(np.float64)

    def proj64(x, w, b):
        y = x @ w.astype(np.float64).T
        return y if b is None else y + b.astype(np.float64)

    q = split_heads(proj64(query, p.w_q, p.b_q), num_heads)  # (..., H, n, hd)
    k = split_heads(proj64(key, p.w_k, p.b_k), hkv)  # (..., Hkv, m, hd)
    v = split_heads(proj64(value, p.w_v, p.b_v), hkv)  # (..., Hkv, m, hd)
    a_q = split_heads(_abs_projection(query, p.w_q, p.b_q), num_heads)  # (..., H, n, hd)
    a_k = split_heads(_abs_projection(key, p.w_k, p.b_k), hkv)  # (..., Hkv, m, hd)
    a_v = float(_abs_projection(value, p.w_v, p.b_v).max(initial=0.0))
    v_max = float(np.abs(v).max(initial=0.0))

    vis = visibility_view(plan, mask, bias64, extras)
    shape = plan.full_weights_shape
    full = np.ones(shape, bool) if vis is None else np.broadcast_to(vis, shape)
    logit = logit_scale(plan, q, k, bias64, full, extras)  # with ALiBi's terms and the sinks
    # logit error: sum_d (dq_d k_d + q_d dk_d), with |dq_d| <= u (1 + sqrt(E)) A_q[d] and so on
    d_logit = u * (
        (1 + math.sqrt(e)) * _logit_scale(plan, a_q, k, None, full)
        + (1 + math.sqrt(p.kdim)) * _logit_scale(plan, q, a_k, None, full)
    )
    sdpa_floor = 1.0 + math.sqrt(plan.m) + 2.0 * math.sqrt(hd) * logit
    d_v = u * (1 + math.sqrt(p.vdim)) * a_v
    weight_gain = 1.0 / (1.0 - plan.dropout_p) if extras.dropout_mask is not None else 1.0

    d_o = (u * v_max * sdpa_floor + 2.0 * d_logit * v_max) * weight_gain + d_v
    sdpa_opts = {k: v for k, v in opts.items() if k != "return_lse"}
    with np.errstate(all="ignore"):
        o = sdpa(q, k, v, mask=mask, **in_float64(bias=bias, **sdpa_opts))  # (*batch, H, n, hd)
    a_out = float(_abs_projection(merge_heads(o), p.w_o, p.b_o).max(initial=0.0))
    w_o_rows = float(np.abs(p.w_o.astype(np.float64)).sum(axis=1).max(initial=0.0))
    floor_out = d_o * w_o_rows + u * (1 + math.sqrt(e)) * a_out
    floor_w = (u * sdpa_floor + 2.0 * d_logit) * weight_gain
    floor_lse = 0.0
    if gold_lse is not None:  # sdpa's lse floor (`tolerance.lse_allowed`) on the projections, plus d_L
        finite = gold_lse[np.isfinite(gold_lse)]
        top = float(np.abs(finite).max(initial=0.0))
        floor_lse = (
            u * (2.0 * math.sqrt(hd) * logit + math.sqrt(plan.m) + 1.0) + eps(plan.lse_dtype) * top + d_logit
        )
    return floor_out, floor_w, floor_lse
