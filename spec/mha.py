"""Multi-head attention: input projections, `sdpa` per head, output projection.

Shape letters, used in every shape comment below:
    ...   leading batch dims (broadcast like NumPy between query, key and value)
    n     queries;  m  keys
    E     embed_dim: query features, the query projection's size and the output's features
    H     query heads;  Hkv  key/value heads (H % Hkv == 0);  G = H // Hkv
    hd    head_dim = E // H, for queries, keys and values alike
    kdim  key features;  vdim  value features (both E unless the module says otherwise)
    P     Hkv * hd, the key and value projections' size (E for plain multi-head attention)

Definition, with weights in torch.nn.Linear's (out_features, in_features) layout:

    q = query @ w_q.T + b_q                       (..., n, E)
    k = key   @ w_k.T + b_k                       (..., m, P)
    v = value @ w_v.T + b_v                       (..., m, P)
    head h of q is columns h*hd : (h+1)*hd       (..., H, n, hd); likewise k, v with Hkv heads
    o = sdpa(q, k, v, <sdpa keywords>)            (..., H, n, hd)   query head h reads kv head h // G
    out = merge(o) @ w_o.T + b_o                  (..., n, E)       merge puts head h back at h*hd

A missing bias is zero. b_k adds the same scale * (q . b_k) to every logit of a query row, so it
never changes the result (softmax ignores a shift); it is kept because torch stores it. Everything
is computed in float64 and the result is cast to the inputs' dtype. A query row with no visible
key gets attention output 0 (sdpa's decision 1), so its mha output is b_o, the output projection
of zero.

Every keyword of `sdpa` passes through to the per-head call unchanged, the variants of issue #15
included (softcap, alibi_slopes, sinks, segment ids, causal="lower_right_lengths", dropout,
return_lse): each is defined per query head, on the projected logits, and means here what it
means there (spec/README.md, "mha and the variants"). sinks, like bias, come in the inputs' dtype
and are read in float64; the log-sum-exp is sdpa's, per head, (..., H, n).

The parameters are `MHAParams` (`attnspec.spec.mha_params`; torch's state dicts in
`attnspec.spec.mha_torch`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.dtypes import round_to
from attnspec.spec.mha_params import MHAParams, ParamDims, _check_heads, check_param_infos
from attnspec.spec.options import VARIANT_ARRAYS, take, with_options
from attnspec.spec.sdpa import sdpa
from attnspec.spec.validate import (
    ArrayInfo,
    SDPAPlan,
    check_inputs,
    is_int,
    numpy_info,
    validate_sdpa,
)

__all__ = ["MHAParams", "ParamDims", "check_param_infos", "merge_heads", "mha", "split_heads", "validate_mha"]


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(..., L, H * hd) -> (..., H, L, hd): head h is columns h*hd : (h+1)*hd."""
    fn = "split_heads"
    info = numpy_info(fn, "x", x)
    if len(info.shape) < 2:
        raise SpecError(f"{fn}: x.ndim={len(info.shape)} must be >= 2 (expected (..., L, H * hd))")
    if not is_int(num_heads) or num_heads < 1 or x.shape[-1] % num_heads:
        raise SpecError(f"{fn}: x.shape[-1]={x.shape[-1]} must be a multiple of num_heads={num_heads!r} >= 1")
    x = x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)  # (..., L, H, hd)
    return np.swapaxes(x, -2, -3)  # (..., H, L, hd)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(..., H, L, hd) -> (..., L, H * hd): the inverse of `split_heads`."""
    fn = "merge_heads"
    info = numpy_info(fn, "x", x)
    if len(info.shape) < 3:
        raise SpecError(f"{fn}: x.ndim={len(info.shape)} must be >= 3 (expected (..., H, L, hd))")
    x = np.swapaxes(x, -2, -3)  # (..., L, H, hd)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])  # (..., L, H*hd)


def _project(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x.astype(np.float64) @ w.astype(np.float64).T  # (..., L, in) @ (in, out) -> (..., L, out)
    return y if b is None else y + b.astype(np.float64)


def plan_mha_numpy(fn, query, key, value, params, num_heads, num_kv_heads, mask, bias, options) -> SDPAPlan:
    """Validate an mha call on NumPy arrays and return the plan of its per-head sdpa."""

    def dims() -> ParamDims:
        if not isinstance(params, MHAParams):
            raise SpecError(f"{fn}: params must be an MHAParams, got {type(params).__name__}")
        return ParamDims(params.embed_dim, params.kdim, params.vdim, params.kv_dim)

    return validate_mha(fn, numpy_info, query, key, value, dims, num_heads, num_kv_heads, mask, bias, options)


def _same(x: Any) -> Any:
    return x


def validate_mha(
    fn: str,
    info: Callable[[str, str, Any], ArrayInfo],
    query: Any,
    key: Any,
    value: Any,
    params_dims: Callable[[], ParamDims],
    num_heads: object,
    num_kv_heads: object,
    mask: Any,
    bias: Any,
    options: dict[str, Any],
    lengths_to_numpy: Callable[[Any], Any] = _same,
) -> SDPAPlan:
    """Check one mha call on metadata alone; return the plan of its per-head sdpa call.

    Shared by the spec and every backend, so a bad input raises the same `SpecError` wherever it
    is called. ``info(fn, name, x)`` returns the ArrayInfo of one array (raising SpecError for
    anything that is not the caller's array type); ``params_dims()`` checks the parameters and
    returns their sizes; ``lengths_to_numpy`` turns framework length arrays into NumPy (they are
    checked by value). ``options`` are sdpa's keywords besides mask and bias, the variants'
    arrays among them (read through ``info``). The plan's q is (..., H, n, hd), its k and v
    (..., Hkv, m, hd).
    """
    infos = {}
    for name, x in (("query", query), ("key", key), ("value", value)):  # in order: the first problem is named
        infos[name] = info(fn, name, x)
        check_inputs(fn, {name: infos[name]}, "(..., L, features)")
    qi, ki, vi = infos["query"], infos["key"], infos["value"]
    if not qi.dtype == ki.dtype == vi.dtype:
        raise SpecError(
            f"{fn}: query, key and value must share one dtype, got query.dtype={qi.dtype}, "
            f"key.dtype={ki.dtype}, value.dtype={vi.dtype}"
        )
    d = params_dims()
    e = d.embed_dim
    hkv, hd = _check_heads(fn, e, num_heads, num_heads if num_kv_heads is None else num_kv_heads)
    assert is_int(num_heads)  # checked by _check_heads
    if d.kv_dim != hkv * hd:
        raise SpecError(
            f"{fn}: params.w_k.shape[0]={d.kv_dim} must equal num_kv_heads * head_dim = {hkv} * {hd} "
            f"(num_kv_heads defaults to num_heads; head_dim = embed_dim // num_heads = {e} // {num_heads})"
        )
    for name, x, want, what in (
        ("query", qi, e, "params.embed_dim"),
        ("key", ki, d.kdim, "params.kdim"),
        ("value", vi, d.vdim, "params.vdim"),
    ):
        if x.shape[-1] != want:
            raise SpecError(f"{fn}: {name}.shape[-1]={x.shape[-1]} must equal {what}={want}")
    if vi.shape[-2] != ki.shape[-2]:
        raise SpecError(
            f"{fn}: value.shape[-2]={vi.shape[-2]} must equal key.shape[-2]={ki.shape[-2]} "
            "(one value per key)"
        )
    try:
        np.broadcast_shapes(qi.shape[:-2], ki.shape[:-2], vi.shape[:-2])
    except ValueError:
        raise SpecError(
            f"{fn}: leading batch dims do not broadcast: query {qi.shape[:-2]}, "
            f"key {ki.shape[:-2]}, value {vi.shape[:-2]}"
        ) from None
    bias_info = None if bias is None else info(fn, "bias", bias)
    if bias_info is not None and bias_info.dtype != qi.dtype:
        raise SpecError(f"{fn}: bias.dtype={bias_info.dtype} must equal query.dtype={qi.dtype}")
    # The remaining keywords mean exactly what they mean to sdpa; checking them here, against the
    # head-split shapes, makes their messages name mha rather than the sdpa call inside it.
    n, m = qi.shape[-2], ki.shape[-2]
    opts = dict(options)
    for name in ("q_lengths", "kv_lengths"):
        opts[name] = lengths_to_numpy(opts.get(name))
    for name in VARIANT_ARRAYS:  # by shape and dtype, like query
        opts[name] = None if opts.get(name) is None else info(fn, name, opts[name])
    return validate_sdpa(
        fn,
        ArrayInfo((*qi.shape[:-2], int(num_heads), n, hd), qi.dtype),
        ArrayInfo((*ki.shape[:-2], hkv, m, hd), qi.dtype),
        ArrayInfo((*vi.shape[:-2], hkv, m, hd), qi.dtype),
        mask=None if mask is None else info(fn, "mask", mask),
        bias=bias_info,
        **opts,
    )


@with_options()
def mha(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: MHAParams,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    **options: Any,
):
    """Multi-head attention, exactly as defined in this module's docstring.

    Args:
        query: (..., n, E); key: (..., m, kdim); value: (..., m, vdim). Rank >= 2; leading batch
            dims broadcast like NumPy. One dtype among float16, bfloat16, float32, float64.
        params: the projections; any float dtype, always read in float64 (they are the layer's
            own parameters, not inputs, so they need not match the inputs' dtype).
        num_heads: H; embed_dim must be a multiple of it. head_dim = E // H.
        num_kv_heads: Hkv (default H); H must be a multiple of it, and params.kv_dim = Hkv * hd.
            Query head h reads key/value head h // (H // Hkv) (grouped-query attention; Hkv = 1
            is multi-query attention).
        mask, bias, causal, window, scale, q_lengths, kv_lengths: passed to `sdpa` unchanged, so
            they mean exactly what they mean there: mask is bool with True = may attend, bias is
            additive in the inputs' dtype with -inf = absent, both broadcast against
            (..., H, n, m); scale defaults to 1 / sqrt(head_dim).
        softcap, alibi_slopes, sinks, q_segment_ids, kv_segment_ids, dropout_mask, dropout_p:
            sdpa's variants, passed to it unchanged: alibi_slopes (H,) or (..., H), sinks (H,)
            in the inputs' dtype, segment ids (..., n) and (..., m), dropout_mask broadcastable
            to (..., H, n, m). causal="lower_right_lengths" aligns on each sequence's lengths.
        return_weights: also return the attention weights per head, (..., H, n, m).
        return_lse: also return each head's log-sum-exp, (..., H, n), float32 (float64 for
            float64 inputs), as sdpa defines it.

    Returns:
        (..., n, E) in the inputs' dtype, then the weights when asked, then the lse when asked.

    Raises:
        SpecError: for any input outside the definition, naming ``mha`` and the argument.
    """
    fn = "mha"
    options = take(fn, options)
    mask, bias, return_weights = options.pop("mask"), options.pop("bias"), options.pop("return_weights")
    plan = plan_mha_numpy(fn, query, key, value, params, num_heads, num_kv_heads, mask, bias, options)
    return_lse = options.pop("return_lse")
    hkv = num_heads if num_kv_heads is None else num_kv_heads

    q = split_heads(_project(query, params.w_q, params.b_q), num_heads)  # (..., n, E) -> (..., H, n, hd)
    k = split_heads(_project(key, params.w_k, params.b_k), hkv)  # (..., m, P) -> (..., Hkv, m, hd)
    v = split_heads(_project(value, params.w_v, params.b_v), hkv)  # (..., m, P) -> (..., Hkv, m, hd)
    result = sdpa(
        q, k, v, mask=mask, return_weights=True, return_lse=return_lse, **in_float64(bias=bias, **options)
    )  # (..., H, n, hd), (..., H, n, m)[, (..., H, n)]
    out = _project(merge_heads(result[0]), params.w_o, params.b_o)  # (..., n, E)
    results = [round_to(out, query.dtype)]
    if return_weights:
        results.append(round_to(result[1], query.dtype))  # (..., H, n, m)
    if return_lse:
        results.append(result[2].astype(plan.lse_dtype))  # (..., H, n)
    return results[0] if len(results) == 1 else tuple(results)


def in_float64(**options: Any) -> dict[str, Any]:
    """sdpa's keywords for the float64 projections: bias and sinks, which sdpa wants in q's dtype,
    in float64; everything else as given."""
    for name in ("bias", "sinks"):
        if options.get(name) is not None:
            options[name] = options[name].astype(np.float64)
    return options
