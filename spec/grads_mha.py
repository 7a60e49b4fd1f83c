"""Gradients of multi-head attention: the backward pass of `attnspec.spec.mha`, analytic.

Shape letters as in `attnspec.spec.mha`:
    ...  leading batch dims (broadcast like NumPy between query, key and value)
    n    queries;  m  keys
    E    embed_dim;  H  query heads;  Hkv  key/value heads;  hd = E // H
    kdim key features;  vdim  value features;  P = Hkv * hd

With the forward pass ``q = query W_q^T + b_q`` (likewise k, v), ``o = sdpa(split(q), split(k),
split(v))`` and ``out = merge(o) W_o^T + b_o``, and dO = d_out:

    dM      = dO W_o                  d_w_o = sum over (..., n) of dO^T merge(o);  d_b_o = sum dO
    do      = split(dM)               (..., H, n, hd), the upstream gradient of sdpa
    dq, dk, dv (, dbias)(, dsinks) = sdpa_vjp(q, k, v, do, ...)   every sdpa keyword passed through
    d_query = merge(dq) W_q           d_w_q = sum merge(dq)^T query;  d_b_q = sum merge(dq)
    d_key   = merge(dk) W_k           d_w_k = sum merge(dk)^T key;    d_b_k = 0 exactly
    d_value = merge(dv) W_v           d_w_v = sum merge(dv)^T value;  d_b_v = sum merge(dv)

d_b_k is exactly 0: b_k adds scale * (q_i . b_k) to every logit of row i, the same shift for all
of the row's keys, and softmax ignores a shift. (Summing merge(dk) gives the same 0 up to
rounding, since each row of dS sums to 0; the spec returns the exact value.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.dtypes import round_to
from attnspec.spec.grads import sdpa_vjp
from attnspec.spec.mha import MHAParams, _project, in_float64, merge_heads, plan_mha_numpy, split_heads
from attnspec.spec.options import take, with_options
from attnspec.spec.sdpa import sdpa
from attnspec.spec.validate import numpy_info

__all__ = ["mha_vjp"]


@with_options(outputs=False)
def mha_vjp(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: MHAParams,
    d_out: np.ndarray,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    **options: Any,
) -> tuple:
    """The vector-Jacobian product of `mha`: gradients of ``sum(mha(...) * d_out)``.

    Args:
        query, key, value, params, num_heads, num_kv_heads, mask, bias, causal, window, scale,
            q_lengths, kv_lengths, softcap, alibi_slopes, sinks, q_segment_ids, kv_segment_ids,
            dropout_mask, dropout_p: as for `mha`.
        d_out: the upstream gradient, with mha's output shape (..., n, E) and query's dtype.

    Returns:
        ``(d_query, d_key, d_value, d_params)``, then ``d_bias`` when ``bias`` is given, then
        ``d_sinks`` (H,) when ``sinks`` is: the inputs' gradients come first in argument order,
        then the parameters', then the bias's and the sinks', as `sdpa_vjp` orders dbias and
        dsinks. ALiBi slopes, segment ids and the dropout mask are constants. d_query, d_key,
        d_value have their input's shape and dtype (summed over broadcast batch dims); d_params
        is an `MHAParams` whose fields have their parameter's shape and dtype, None where the
        parameter is None; d_bias and d_sinks have their argument's shape and dtype.
        ``d_params.b_k`` is exactly zero (see the module docstring). A query row with no visible key
        gets d_query = 0 and adds nothing to the key and value gradients; a key no row sees gets
        d_key = d_value = 0; all as in `sdpa_vjp`. Computed in float64, each result rounded once to
        its dtype.

    Raises:
        SpecError: for any input `mha` refuses, and for a d_out of the wrong type, shape or dtype.
    """
    fn = "mha_vjp"
    options = take(fn, options, outputs=False)
    mask, bias, sinks = options.pop("mask"), options.pop("bias"), options["sinks"]
    plan_mha_numpy(fn, query, key, value, params, num_heads, num_kv_heads, mask, bias, options)
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    out_shape = (
        *np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2]),
        query.shape[-2],
        params.embed_dim,
    )
    info = numpy_info(fn, "d_out", d_out)
    if info.shape != out_shape:
        raise SpecError(f"{fn}: d_out.shape={info.shape} must equal the output shape {out_shape}")
    if info.dtype != query.dtype.name:
        raise SpecError(f"{fn}: d_out.dtype={info.dtype} must equal query.dtype={query.dtype.name}")

    query64, key64, value64, dO = (x.astype(np.float64) for x in (query, key, value, d_out))
    w = {name: getattr(params, name) for name in ("w_q", "w_k", "w_v", "w_o")}
    w = {name: x.astype(np.float64) for name, x in w.items()}
    b = {
        name: None if getattr(params, name) is None else getattr(params, name).astype(np.float64)
        for name in ("b_q", "b_k", "b_v", "b_o")
    }
    kw = in_float64(bias=bias, **options)  # bias and sinks in float64, like the projections
    with np.errstate(invalid="ignore", over="ignore"):  # NaN in padded rows and hidden keys is expected
        q = split_heads(_project(query64, w["w_q"], b["b_q"]), num_heads)  # (..., H, n, hd)
        k = split_heads(_project(key64, w["w_k"], b["b_k"]), hkv)  # (..., Hkv, m, hd)
        v = split_heads(_project(value64, w["w_v"], b["b_v"]), hkv)  # (..., Hkv, m, hd)
        o = sdpa(q, k, v, mask=mask, **kw)  # (..., H, n, hd)
        merged = merge_heads(o)  # (..., n, E)
        d_merged = dO @ w["w_o"]  # (..., n, E) @ (E, E) -> (..., n, E)
        do = split_heads(d_merged, num_heads)  # (..., H, n, hd), o's shape
        grads = sdpa_vjp(q, k, v, np.ascontiguousarray(do), mask=mask, **kw)  # dq, dk, dv[, dbias][, dsinks]
        # sdpa_vjp sums each gradient to its input's shape, so dq has query's leading dims, dk
        # key's and dv value's: each pairs with its own input below, no further broadcast
        dq, dk, dv = (merge_heads(g) for g in grads[:3])  # (..., n, E), (..., m, P), (..., m, P)

        d_inputs = [dq @ w["w_q"], dk @ w["w_k"], dv @ w["w_v"]]  # (..., L, out) @ (out, in) -> (..., L, in)
        d_w = {
            "w_q": _outer_sum(dq, query64),  # (E, E)
            "w_k": _outer_sum(dk, key64),  # (P, kdim)
            "w_v": _outer_sum(dv, value64),  # (P, vdim)
            "w_o": _outer_sum(dO, merged),  # (E, E)
        }
        d_b = {"b_q": _row_sum(dq), "b_k": np.zeros(params.kv_dim), "b_v": _row_sum(dv), "b_o": _row_sum(dO)}

    def d_weight(name: str) -> np.ndarray:
        return round_to(d_w[name], getattr(params, name).dtype)

    def d_bias(name: str) -> np.ndarray | None:
        return None if getattr(params, name) is None else round_to(d_b[name], getattr(params, name).dtype)

    d_params = MHAParams(
        w_q=d_weight("w_q"),
        w_k=d_weight("w_k"),
        w_v=d_weight("w_v"),
        w_o=d_weight("w_o"),
        b_q=d_bias("b_q"),
        b_k=d_bias("b_k"),
        b_v=d_bias("b_v"),
        b_o=d_bias("b_o"),
    )
    inputs = (query, key, value)
    result: list[np.ndarray | MHAParams] = [
        round_to(g.reshape(x.shape), x.dtype) for g, x in zip(d_inputs, inputs)
    ]
    result.append(d_params)
    extra = list(grads[3:])  # sdpa_vjp's dbias, then dsinks (H,)
    if bias is not None:
        result.append(round_to(extra.pop(0), bias.dtype))
    if sinks is not None:
        result.append(round_to(extra.pop(0), sinks.dtype))
    return tuple(result)


def _outer_sum(d: np.ndarray, x: np.ndarray) -> np.ndarray:
    """sum over every batch element and row of d[..., r, :]^T x[..., r, :], for equal leading dims."""
    d2 = d.reshape(-1, d.shape[-1])  # (..., L, out) -> (R, out)
    x2 = x.reshape(-1, x.shape[-1])  # (..., L, in) -> (R, in)
    return d2.T @ x2  # (out, R) @ (R, in) -> (out, in)


def _row_sum(d: np.ndarray) -> np.ndarray:
    return d.reshape(-1, d.shape[-1]).sum(axis=0)  # (..., L, out) -> (out,)
