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

The variants (issue #15) follow `attnspec.spec.grads`, and the reference runs them as the golden
does, in the inputs' precision (`attention_core` with each variant; the softcap derivative
1 - y^2 from the rounded y = tanh; keep / (1 - p) rounded once; p_sink = exp(sink - lse) from the
reference lse). What each changes in the floor:

    ALiBi     a constant added to the logits: enters L like a bias (`tolerance.logit_scale`),
              no gradient, S and c unchanged. Segment ids and "lower_right_lengths" change only
              the visible pairs that L, Pcol and P are taken over.
    softcap   dS reaches q and k times 1 - tanh^2(t / softcap), which is at most 1, so the S of
              dq and dk hold. The derivative itself moves by at most |2 tanh sech^2| / softcap
              < 1 / softcap per unit of error in t = scale q.k, whose error is eps sqrt(dk) Lt
              (Lt: L of scale q.k alone), so dq and dk add eps * S * sqrt(dk) * Lt / softcap.
              L stays the uncapped bound (the tanh has slope <= 1), as in the forward rule.
    sinks     the weights sum to 1 - p_sink <= 1 and |O| <= max|v|, so |dP|, |D| <= A and
              |dS| <= 2 A P still. dsinks = -sum over rows of p_sink * D (every batch element
              and query row of its head): S = A * max over heads of sum_rows p_sink, with
              p_sink = 1 - sum_j P from the golden, and c = rows + m + dv (the row sum, D's
              dv-term dot product, O's m-term sum). L >= |sink| (`logit_scale`).
    dropout   the weights that multiply V are P r, r = keep / (1 - p) <= 1 / (1 - p): dP = r dO.v,
              |O| <= max|v| / (1 - p), so |dP|, |D| <= A / (1 - p) and every S above grows by
              1 / (1 - p). Pcol is taken over P before dropout (dS = P (r dP' - D) is not zero
              where keep is False).

mha_vjp (`reference_mha_vjp`, `mha_vjp_allowed`) and lsh_attention_vjp (`reference_lsh_vjp`,
`lsh_vjp_allowed`) follow the same rule per gradient tensor, allowed_T = K * err_ref_T + floor_T,
with the reference run through the whole chain (projections, sdpa's backward, the projections'
backward; or LSH's forward and backward, in `attnspec.spec.tolerance_grads_lsh`) with every
stored intermediate rounded to D. Their
floors are each function's own first-order error bound, written out in those functions'
docstrings and on the spec page ("Gradient tolerance").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from attnspec.spec.grads import _attention_vjp, _sdpa_visibility, _sum_to
from attnspec.spec.grads_mha import _outer_sum, _row_sum
from attnspec.spec.mha import MHAParams, _project, merge_heads, plan_mha_numpy, split_heads
from attnspec.spec.sdpa import _with_head, attention_core, sdpa
from attnspec.spec.tolerance import _NP, K, _logit_scale, eps, logit_scale, reference_sdpa
from attnspec.spec.tolerance_grads_lsh import LSH_GRAD_NAMES, lsh_vjp_allowed, reference_lsh_vjp
from attnspec.spec.tolerance_mha import _abs_projection
from attnspec.spec.validate import NO_EXTRAS, SDPAExtras, SDPAPlan

__all__ = [
    "GRAD_NAMES",
    "LSH_GRAD_NAMES",
    "MHA_GRAD_NAMES",
    "grad_names",
    "lsh_vjp_allowed",
    "mha_grads_by_name",
    "mha_vjp_allowed",
    "reference_lsh_vjp",
    "reference_mha_vjp",
    "reference_sdpa_vjp",
    "sdpa_vjp_allowed",
]

#: sdpa_vjp's gradients by name, each present when its input is (`grad_names`)
GRAD_NAMES = ("dq", "dk", "dv", "dbias", "dsinks")
#: mha_vjp's gradients by name: the inputs', each parameter's (its MHAParams field), the bias's
MHA_GRAD_NAMES = (
    "d_query",
    "d_key",
    "d_value",
    "w_q",
    "b_q",
    "w_k",
    "b_k",
    "w_v",
    "b_v",
    "w_o",
    "b_o",
    "d_bias",
)
PARAM_FIELDS = MHA_GRAD_NAMES[3:11]
_OPTIONS = ("causal", "window", "scale", "q_lengths", "kv_lengths")


def grad_names(bias, sinks) -> tuple[str, ...]:
    """The names of sdpa_vjp's results, in its order: dq, dk, dv, then dbias, then dsinks."""
    return (
        GRAD_NAMES[:3] + (("dbias",) if bias is not None else ()) + (("dsinks",) if sinks is not None else ())
    )


def reference_sdpa_vjp(
    plan: SDPAPlan, q, k, v, d_out, mask, bias, extras: SDPAExtras = NO_EXTRAS
) -> list[np.ndarray]:
    """The golden backward in the inputs' precision (the rule's ``ref_T``), as float64 arrays, in
    `grad_names` order. With the variants (``extras``, and the plan's softcap and dropout_p) it
    follows `attnspec.spec.grads`: the softcap's derivative 1 - y^2 from the rounded y = tanh, the
    dropout factor keep / (1 - p) rounded once, p_sink = exp(sink - lse) from the reference lse."""
    p, ex = plan, extras
    dt = _NP[p.dtype]
    ct = np.float64 if p.dtype == "float64" else np.float32
    leaves = (q, k, v) + tuple(x for x in (bias, ex.sinks) if x is not None)
    if p.n == 0 or p.m == 0 or p.hq == 0:
        return [np.zeros(x.shape) for x in leaves]

    def rnd(x):
        return x.astype(dt).astype(ct)

    def fold(x):  # (..., Hq, n, c) -> (..., Hkv, G*n, c), batch dims broadcast out
        x = np.broadcast_to(x, (*p.batch, p.hq, p.n, x.shape[-1]))
        return x.reshape(*p.batch, p.hkv, p.group * p.n, x.shape[-1]).astype(ct)

    full_out = (*p.batch, p.hq, p.n, p.dv)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # the reference forward: weights P before dropout, lse, and the output (after dropout)
        undropped = dataclasses.replace(ex, dropout_mask=None)
        out, w, lse = attention_core(p, q, k, v, mask, bias, ct, rnd, undropped, with_lse=True)
        keep = None
        if ex.dropout_mask is not None:
            out, _ = attention_core(p, q, k, v, mask, bias, ct, rnd, ex)
            keep = fold(
                rnd(np.broadcast_to(ex.dropout_mask, p.full_weights_shape).astype(ct) / ct(1.0 - p.dropout_p))
            )
        out, w = rnd(out), rnd(w)  # stored in D, as the forward returns them
        vis = _sdpa_visibility(p, mask, bias, ex)  # (..., Hq, n, m)
        kk = np.broadcast_to(_with_head(k), (*p.batch, p.hkv, p.m, p.dk)).astype(ct)
        vv = np.broadcast_to(_with_head(v), (*p.batch, p.hkv, p.m, p.dv)).astype(ct)
        qq = fold(_with_head(q))  # (..., Hkv, G*n, dk)
        cap_grad = None
        if p.softcap is not None:
            t = rnd(rnd(qq @ np.swapaxes(kk, -1, -2)) * ct(p.scale))  # (..., Hkv, G*n, m)
            y = rnd(np.tanh(rnd(t / ct(p.softcap))))
            cap_grad = rnd(1 - y * y)
        dO = d_out.astype(ct).reshape(full_out)  # (..., Hq, n, dv)
        dq, dk, dv, ds = _attention_vjp(
            qq, kk, vv, fold(w), fold(vis), fold(out), fold(dO), ct(p.scale), keep=keep, cap_grad=cap_grad
        )
        grads = [dq.reshape(*p.batch, p.hq, p.n, p.dk), dk, dv]
        if bias is not None:
            grads.append(ds.reshape(p.full_weights_shape))
        shapes = [_with_head(x).shape for x in (q, k, v)] + ([] if bias is None else [bias.shape])
        grads = [_sum_to(g, s) for g, s in zip(grads, shapes)]
        if ex.sinks is not None:  # dsinks = -sum over rows of p_sink * D
            row = np.where(vis.any(axis=-1), np.sum(dO * np.broadcast_to(out, full_out), axis=-1), 0)
            p_sink = rnd(np.exp(rnd(ex.sinks.astype(ct))[:, None] - lse))  # (..., Hq, n)
            grads.append(-(p_sink * row).reshape(-1, p.hq, p.n).sum(axis=(0, 2)))  # (Hq,)
    return [
        g.astype(dt).astype(np.float64).reshape(x.shape)  # one rounding, after the sums
        for g, x in zip(grads, leaves)
    ]


def sdpa_vjp_allowed(
    plan: SDPAPlan,
    q,
    k,
    v,
    d_out,
    bias,
    vis: np.ndarray,
    weights: np.ndarray,
    err_ref: dict[str, float],
    extras: SDPAExtras = NO_EXTRAS,
) -> dict[str, float]:
    """``allowed_T`` for each gradient of one sdpa_vjp case (``weights``: the golden P, float64,
    before dropout; ``vis``: the case's visibility, (..., Hq, n, m)). With sinks, dsinks too."""
    p, ex = plan, extras
    A = _finite_max(d_out) * _finite_max(v)
    L = logit_scale(p, q, k, bias, vis, ex)  # ALiBi terms and sinks join L
    r = 1.0 / (1.0 - p.dropout_p) if ex.dropout_mask is not None else 1.0  # kept weights are P * r
    w = np.where(np.isfinite(weights), weights, 0).reshape(p.full_weights_shape)
    pcol = float(w.reshape(*p.batch, p.hkv, p.group * p.n, p.m).sum(axis=-2).max(initial=0.0))
    R = p.group * p.n
    e = eps(p.dtype)

    def floor(S, c, cap=0.0):
        return e * S * (1 + math.sqrt(c) + 2 * math.sqrt(p.dk) * L + cap)

    # the softcap's derivative moves by at most 1/softcap per unit of error in its input t
    cap = 0.0 if p.softcap is None else math.sqrt(p.dk) * _logit_scale(p, q, k, None, vis) / p.softcap
    floors = {
        "dq": floor(2 * A * r * p.scale * _finite_max(k), p.m + p.dv, cap),
        "dk": floor(2 * A * r * p.scale * _finite_max(q) * pcol, R + p.dv, cap),
        "dv": floor(_finite_max(d_out) * r * pcol, R),
    }
    if bias is not None:
        floors["dbias"] = floor(2 * A * r, p.m + p.dv)
    if ex.sinks is not None:
        p_sink = 1.0 - w.sum(axis=-1)  # (..., Hq, n): exp(sink - lse), 1 for a row that sees nothing
        rows = math.prod(p.batch) * p.n
        s_sink = float(p_sink.reshape(-1, p.hq, p.n).sum(axis=(0, 2)).max(initial=0.0))
        floors["dsinks"] = floor(A * r * s_sink, rows + p.m + p.dv)
    return {name: K * err_ref.get(name, 0.0) + f for name, f in floors.items()}


def _finite_max(x) -> float:
    x = np.abs(np.asarray(x, dtype=np.float64))
    return float(x[np.isfinite(x)].max(initial=0.0))


def _ratio(err: float, size: float) -> float:
    return err / size if size > 0 else 0.0


# -- mha_vjp ------------------------------------------------------------------------------------


def mha_grads_by_name(grads: tuple) -> dict:
    """mha_vjp's result as ``{name: array}`` in `MHA_GRAD_NAMES` order (None parameters left out)."""
    named = dict(zip(MHA_GRAD_NAMES[:3], grads[:3]))
    named.update({f: getattr(grads[3], f) for f in PARAM_FIELDS if getattr(grads[3], f) is not None})
    if len(grads) > 4:
        named["d_bias"] = grads[4]
    return named


def reference_mha_vjp(
    query,
    key,
    value,
    params: MHAParams,
    d_out,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    mask=None,
    bias=None,
    **options,
) -> dict:
    """mha's backward with every stored intermediate rounded to D (the rule's ``ref_T``).

    The projections and the output projection's backward ``dO W_o`` are rounded to D, sdpa's
    backward is `reference_sdpa_vjp` on them, then each input's and parameter's gradient is one
    matmul or sum in the compute dtype, rounded once. d_b_k is ``sum merge(dk)``, as autodiff
    computes it (the golden's exact 0 is its limit). Returns float64 arrays by name.
    """
    opts = {k: options.get(k) for k in _OPTIONS}
    plan = plan_mha_numpy(
        "reference_mha_vjp", query, key, value, params, num_heads, num_kv_heads, mask, bias, opts
    )
    dt = _NP[plan.dtype]
    ct = np.float64 if plan.dtype == "float64" else np.float32

    def rnd(x):
        return x.astype(dt).astype(ct)

    def project(x, w, b):  # (..., L, in) @ (in, out) -> (..., L, out), rounded as stored
        y = rnd(x.astype(ct) @ w.astype(ct).T)
        return y if b is None else rnd(y + b.astype(ct))

    p, h = params, num_heads
    q = split_heads(project(query, p.w_q, p.b_q), h).astype(dt)  # (..., H, n, hd)
    k = split_heads(project(key, p.w_k, p.b_k), plan.hkv).astype(dt)  # (..., Hkv, m, hd)
    v = split_heads(project(value, p.w_v, p.b_v), plan.hkv).astype(dt)  # (..., Hkv, m, hd)
    with np.errstate(all="ignore"):
        o = reference_sdpa(plan, q, k, v, mask, bias)  # (..., H, n, hd), in D
        dO = d_out.astype(ct)  # (..., n, E)
        do = split_heads(rnd(dO @ p.w_o.astype(ct)), h).astype(dt)  # (..., H, n, hd)
        grads = reference_sdpa_vjp(plan, q, k, v, do, mask, bias)
        dq, dk, dv = (merge_heads(g).astype(ct) for g in grads[:3])  # (..., n, E), (..., m, P) twice
        named = {
            "d_query": dq @ p.w_q.astype(ct),
            "d_key": dk @ p.w_k.astype(ct),
            "d_value": dv @ p.w_v.astype(ct),
            "w_q": _outer_sum(dq, query.astype(ct)),
            "w_k": _outer_sum(dk, key.astype(ct)),
            "w_v": _outer_sum(dv, value.astype(ct)),
            "w_o": _outer_sum(dO, merge_heads(o).astype(ct)),
            "b_q": _row_sum(dq),
            "b_k": _row_sum(dk),
            "b_v": _row_sum(dv),
            "b_o": _row_sum(dO),
        }
    named = {name: g for name, g in named.items() if name not in PARAM_FIELDS or getattr(p, name) is not None}
    named = {name: rnd(g).astype(np.float64) for name, g in named.items()}
    named.update(
        {
            "d_query": named["d_query"].reshape(query.shape),
            "d_key": named["d_key"].reshape(key.shape),
            "d_value": named["d_value"].reshape(value.shape),
        }
    )
    if bias is not None:
        named["d_bias"] = grads[3]
    return named


def mha_vjp_allowed(
    query,
    key,
    value,
    params: MHAParams,
    d_out,
    err_ref: dict,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    mask=None,
    bias=None,
    **options,
) -> dict:
    """``allowed_T`` for each gradient of one mha_vjp case: K * err_ref_T + floor_T.

    The floor is the first-order error of an implementation as exact as D allows, u = eps(D),
    built from three parts (sizes from the float64 golden's projections q, k, v, o and
    do = split(dO W_o), the upstream gradient of sdpa):

    * Forward errors, as `attnspec.spec.tolerance_mha`: d_q, d_k, d_v = u (1 + sqrt(in)) * max of
      the projection's |x| |W|^T + |b|; d_L, the logit error; d_o, the attention output's.
      The backward's own input has d_do = u (1 + sqrt(E)) max(|dO| |W_o|).
    * sdpa's backward on them: e_T = S_T * (u (1 + sqrt(c_T) + 2 sqrt(hd) L) + rho_T) with S_T,
      c_T as for sdpa_vjp (A = max|do| max|v|) and rho_T the relative error its inputs carry:
      dq and dbias d_do/|do| + d_v/|v| (+ d_k/|k| for dq) + 3 d_L, dk the same with d_q/|q|,
      dv d_do/|do| + 2 d_L. 3 d_L: a logit error d_L moves each weight by 2 d_L relative, so
      dS = P (dP - D) by 2 d_L * 2A (the P factor) plus 2 d_L * A (through D), per 2A P.
      Each is multiplied by the number of broadcast copies it is summed over.
    * The chain back through the projections, each a first-order bound: the input error times
      the map's gain, plus one rounding of a sum of c terms, u (1 + sqrt(c)) times the result's
      bound. With colsum(W) = max_c sum_r |W[r, c]| and N_x = max_c sum_rows |x[row, c]|:
      d_query colsum(W_q) (e_dq + u (1 + sqrt(E)) S_dq), likewise d_key, d_value with P terms;
      w_q N_query (e_dq + u (1 + sqrt(R_q)) S_dq), likewise w_k, w_v; w_o N_dO (d_o + u (1 +
      sqrt(R_o)) max|o|); b_q R_q (e_dq + u (1 + sqrt(R_q)) S_dq), likewise b_k, b_v; b_o
      u (1 + sqrt(R_o)) N_dO; d_bias e_dbias. R_x counts the rows summed (batch * length).
    """
    opts: dict[str, Any] = {k: options.get(k) for k in _OPTIONS}  # sdpa's keywords, as the caller gave them
    plan = plan_mha_numpy(
        "mha_vjp_allowed", query, key, value, params, num_heads, num_kv_heads, mask, bias, opts
    )
    u = eps(plan.dtype)
    pr = params
    e, hd, hkv, G, n, m = pr.embed_dim, plan.dk, plan.hkv, plan.group, plan.n, plan.m
    f64 = [np.asarray(x, dtype=np.float64) for x in (query, key, value, d_out)]
    query64, key64, value64, dO = f64
    bias64 = None if bias is None else bias.astype(np.float64)
    wo = pr.w_o.astype(np.float64)
    q = split_heads(_project(query64, pr.w_q, pr.b_q), num_heads)  # (..., H, n, hd)
    k = split_heads(_project(key64, pr.w_k, pr.b_k), hkv)  # (..., Hkv, m, hd)
    v = split_heads(_project(value64, pr.w_v, pr.b_v), hkv)  # (..., Hkv, m, hd)
    do = split_heads(dO @ wo, num_heads)  # (..., H, n, hd)

    # forward errors, as tolerance_mha's floor
    a_q = split_heads(_abs_projection(query64, pr.w_q, pr.b_q), num_heads)  # (..., H, n, hd)
    a_k = split_heads(_abs_projection(key64, pr.w_k, pr.b_k), hkv)  # (..., Hkv, m, hd)
    d_q = u * (1 + math.sqrt(e)) * float(a_q.max(initial=0.0))
    d_k = u * (1 + math.sqrt(pr.kdim)) * float(a_k.max(initial=0.0))
    d_v = u * (1 + math.sqrt(pr.vdim)) * float(_abs_projection(value64, pr.w_v, pr.b_v).max(initial=0.0))
    d_do = u * (1 + math.sqrt(e)) * float(_abs_projection(dO, wo.T, None).max(initial=0.0))
    with np.errstate(all="ignore"):
        o, w = sdpa(
            q, k, v, mask=mask, bias=bias64, return_weights=True, **opts
        )  # (..., H, n, hd), (..., H, n, m)
    vis = _sdpa_visibility(plan, mask, bias64)  # (..., H, n, m)
    L = _logit_scale(plan, q, k, bias64, vis)
    d_L = u * (
        (1 + math.sqrt(e)) * _logit_scale(plan, a_q, k, None, vis)
        + (1 + math.sqrt(pr.kdim)) * _logit_scale(plan, q, a_k, None, vis)
    )
    v_max = _finite_max(v)
    d_o = u * v_max * (1 + math.sqrt(m) + 2 * math.sqrt(hd) * L) + 2 * d_L * v_max + d_v

    # sdpa's backward on the projected q, k, v and do
    A = _finite_max(do) * v_max
    wf = np.where(np.isfinite(w), w, 0).reshape(plan.full_weights_shape)
    pcol = float(wf.reshape(*plan.batch, hkv, G * n, m).sum(axis=-2).max(initial=0.0))
    batch = math.prod(plan.batch)

    def copies(x) -> int:  # broadcast copies of x's batch dims summed into its gradient
        return batch // max(math.prod(x.shape[:-2]), 1)

    def base(c):
        return u * (1 + math.sqrt(c) + 2 * math.sqrt(hd) * L)

    r_do, r_v = _ratio(d_do, _finite_max(do)), _ratio(d_v, v_max)
    S = {
        "dq": 2 * A * plan.scale * _finite_max(k) * copies(query64),
        "dk": 2 * A * plan.scale * _finite_max(q) * pcol * copies(key64),
        "dv": _finite_max(do) * pcol * copies(value64),
    }
    err = {
        "dq": S["dq"] * (base(m + hd) + r_do + r_v + _ratio(d_k, _finite_max(k)) + 3 * d_L),
        "dk": S["dk"] * (base(G * n + hd) + r_do + r_v + _ratio(d_q, _finite_max(q)) + 3 * d_L),
        "dv": S["dv"] * (base(G * n) + r_do + 2 * d_L),
    }

    def colsum(w_) -> float:
        return float(np.abs(w_.astype(np.float64)).sum(axis=0).max(initial=0.0))

    def rowsum(x) -> float:
        return float(
            np.abs(np.where(np.isfinite(x), x, 0)).reshape(-1, x.shape[-1]).sum(axis=0).max(initial=0.0)
        )

    def rows(x) -> int:
        return math.prod(x.shape[:-1])

    floor = {
        "d_query": colsum(pr.w_q) * (err["dq"] + u * (1 + math.sqrt(e)) * S["dq"]),
        "d_key": colsum(pr.w_k) * (err["dk"] + u * (1 + math.sqrt(pr.kv_dim)) * S["dk"]),
        "d_value": colsum(pr.w_v) * (err["dv"] + u * (1 + math.sqrt(pr.kv_dim)) * S["dv"]),
        "w_q": rowsum(query64) * (err["dq"] + u * (1 + math.sqrt(rows(query64))) * S["dq"]),
        "w_k": rowsum(key64) * (err["dk"] + u * (1 + math.sqrt(rows(key64))) * S["dk"]),
        "w_v": rowsum(value64) * (err["dv"] + u * (1 + math.sqrt(rows(value64))) * S["dv"]),
        "w_o": rowsum(dO) * (d_o + u * (1 + math.sqrt(rows(dO))) * _finite_max(o)),
        "b_q": rows(query64) * (err["dq"] + u * (1 + math.sqrt(rows(query64))) * S["dq"]),
        "b_k": rows(key64) * (err["dk"] + u * (1 + math.sqrt(rows(key64))) * S["dk"]),
        "b_v": rows(value64) * (err["dv"] + u * (1 + math.sqrt(rows(value64))) * S["dv"]),
        "b_o": u * (1 + math.sqrt(rows(dO))) * rowsum(dO),
    }
    if bias is not None:
        n_copies = math.prod(plan.full_weights_shape) // max(math.prod(bias.shape), 1)
        floor["d_bias"] = n_copies * 2 * A * (base(m + hd) + r_do + r_v + 3 * d_L)
    return {name: K * err_ref.get(name, 0.0) + f for name, f in floor.items()}
