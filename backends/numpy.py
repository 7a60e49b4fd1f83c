"""The golden itself as a backend: `attnspec.spec.sdpa`, `attnspec.spec.sdpa_fp8` and
`attnspec.spec.lsh_attention` on NumPy arrays (bfloat16 and the FP8 dtypes via ml_dtypes).

It runs the spec's own validation and core under the names ``numpy.sdpa`` and ``numpy.mha``, so
its bad-input messages carry the backend's name like every other backend's. Its mha reads the
parameters in float64, as the spec does, whatever their dtype.
"""

from __future__ import annotations

import numpy as np

from attnspec.backends import _mha
from attnspec.backends._common import refuse, to_reference
from attnspec.backends._common import variant_keywords as _variants
from attnspec.backends.base import VARIANT_FEATURES, Backend, MHAArrays
from attnspec.spec.blocked import blocked_core, check_block
from attnspec.spec.fp8 import FP8_DTYPES, FP8_NUMPY, finish_fp8, golden_fp8, plan_fp8
from attnspec.spec.grads import sdpa_vjp as spec_sdpa_vjp
from attnspec.spec.grads_lsh import lsh_attention_vjp as spec_lsh_attention_vjp
from attnspec.spec.grads_mha import mha_vjp as spec_mha_vjp
from attnspec.spec.lsh import lsh_attention as spec_lsh_attention
from attnspec.spec.lsh import validate_lsh
from attnspec.spec.mha import MHAParams, mha
from attnspec.spec.options import VARIANT_ARRAYS
from attnspec.spec.sdpa import golden
from attnspec.spec.validate import ArrayInfo, SDPAExtras, validate_sdpa

__all__ = ["NumpyBackend"]


def _info(fn: str, name: str, x: object) -> ArrayInfo:
    if not isinstance(x, np.ndarray):
        raise refuse(fn, name, x, "numpy.ndarray")
    return ArrayInfo(tuple(x.shape), x.dtype.name)


def _plan(fn, q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths, variants: dict):
    arrays = {name: None if variants.get(name) is None else _info(fn, name, variants[name])
              for name in VARIANT_ARRAYS}
    plan = validate_sdpa(
        fn, _info(fn, "q", q), _info(fn, "k", k), _info(fn, "v", v),
        mask=None if mask is None else _info(fn, "mask", mask),
        bias=None if bias is None else _info(fn, "bias", bias),
        causal=causal, window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
        softcap=variants.get("softcap"), dropout_p=variants.get("dropout_p"),
        return_lse=variants.get("return_lse", False), **arrays,
    )
    return plan, SDPAExtras(*(variants.get(name) for name in VARIANT_ARRAYS))


class NumpyBackend(Backend):
    """The golden definition: float64 computation, one rounding to the inputs' dtype."""

    name = "numpy"
    variants = frozenset(VARIANT_FEATURES)

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> np.ndarray:
        if dtype in FP8_DTYPES:  # ml_dtypes' cast: out of e4m3fn's range gives NaN, not 448
            return np.asarray(x).astype(FP8_NUMPY[dtype])
        return np.array(to_reference(x, dtype))  # a copy: callers may mutate their input

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, softcap=None, alibi_slopes=None, sinks=None,
             q_segment_ids=None, kv_segment_ids=None, dropout_mask=None, dropout_p=None,
             return_weights=False, return_lse=False):
        plan, extras = _plan("numpy.sdpa", q, k, v, mask, bias, causal, window, scale, q_lengths,
                             kv_lengths, _variants(locals()))
        return golden(plan, q, k, v, mask, bias, return_weights, extras)  # tiled for large inputs

    def sdpa_blocked(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
                     q_lengths=None, kv_lengths=None, softcap=None, alibi_slopes=None, sinks=None,
                     q_segment_ids=None, kv_segment_ids=None, dropout_mask=None, dropout_p=None,
                     return_weights=False, return_lse=False, block_q=256, block_k=512):
        fn = "numpy.sdpa_blocked"
        plan, extras = _plan(fn, q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths,
                             _variants(locals()))
        bq, bk = check_block("block_q", block_q, fn), check_block("block_k", block_k, fn)
        return blocked_core(plan, q, k, v, mask, bias, return_weights, bq, bk, extras=extras)

    def sdpa_fp8(self, q, k, v, *, q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
                 mask=None, bias=None, causal=None, window=None, scale=None, q_lengths=None,
                 kv_lengths=None, softcap=None, alibi_slopes=None, sinks=None, q_segment_ids=None,
                 kv_segment_ids=None, dropout_mask=None, dropout_p=None, return_weights=False,
                 return_lse=False):
        options = {name: value for name, value in locals().items() if name not in ("self", "q", "k", "v")}
        fp = plan_fp8("numpy.sdpa_fp8", q, k, v, options)
        return finish_fp8(fp, golden_fp8(fp, q, k, v, options, return_weights), return_weights)

    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, mask=None,
            bias=None, causal=None, window=None, scale=None, q_lengths=None, kv_lengths=None,
            softcap=None, alibi_slopes=None, sinks=None, q_segment_ids=None, kv_segment_ids=None,
            dropout_mask=None, dropout_p=None, return_weights=False, return_lse=False):
        options = dict(causal=causal, window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
                       **_variants(locals()))
        _mha.validate("numpy.mha", _info, _same, query, key, value, params, num_heads, num_kv_heads,
                      mask, bias, options)
        if isinstance(params, MHAArrays):
            params = MHAParams(**vars(params))
        return mha(query, key, value, params, num_heads=num_heads, num_kv_heads=num_kv_heads, mask=mask,
                   bias=bias, return_weights=return_weights, **options)

    def lsh_attention(self, x, v, *, rotations, chunk_length, causal=False, kv_lengths=None,
                      dedup=False, scale=None, return_buckets=False):
        fn = "numpy.lsh_attention"
        validate_lsh(fn, _info(fn, "x", x), _info(fn, "v", v), _info(fn, "rotations", rotations),
                     chunk_length=chunk_length, causal=causal, kv_lengths=kv_lengths, dedup=dedup,
                     scale=scale)
        return spec_lsh_attention(x, v, rotations=rotations, chunk_length=chunk_length, causal=causal,
                                  kv_lengths=kv_lengths, dedup=dedup, scale=scale,
                                  return_buckets=return_buckets)

    # the golden gradients themselves (attnspec.spec.grads*): analytic, float64
    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, causal=None, window=None,
                 scale=None, q_lengths=None, kv_lengths=None, softcap=None, alibi_slopes=None,
                 sinks=None, q_segment_ids=None, kv_segment_ids=None, dropout_mask=None,
                 dropout_p=None):
        return spec_sdpa_vjp(q, k, v, d_out, mask=mask, bias=bias, causal=causal, window=window,
                             scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
                             **_variants(locals()))

    def mha_vjp(self, query, key, value, params, d_out, *, num_heads, num_kv_heads=None, mask=None,
                bias=None, causal=None, window=None, scale=None, q_lengths=None, kv_lengths=None,
                softcap=None, alibi_slopes=None, sinks=None, q_segment_ids=None, kv_segment_ids=None,
                dropout_mask=None, dropout_p=None):
        if isinstance(params, MHAArrays):
            params = MHAParams(**vars(params))
        grads = spec_mha_vjp(query, key, value, params, d_out, num_heads=num_heads,
                             num_kv_heads=num_kv_heads, mask=mask, bias=bias, causal=causal,
                             window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
                             **_variants(locals()))
        return (*grads[:3], MHAArrays(**vars(grads[3])), *grads[4:])

    def lsh_attention_vjp(self, x, v, d_out, *, rotations, chunk_length, causal=False, kv_lengths=None,
                          dedup=False, scale=None):
        return spec_lsh_attention_vjp(x, v, d_out, rotations=rotations, chunk_length=chunk_length,
                                      causal=causal, kv_lengths=kv_lengths, dedup=dedup, scale=scale)


def _same(x):
    return x

