"""The golden itself as a backend: `attnspec.spec.sdpa`, `attnspec.spec.sdpa_fp8` and
`attnspec.spec.lsh_attention` on NumPy arrays (bfloat16 and the FP8 dtypes via ml_dtypes).

It runs the spec's own validation and core under the names ``numpy.sdpa`` and ``numpy.mha``, so
its bad-input messages carry the backend's name like every other backend's. Its mha reads the
parameters in float64, as the spec does, whatever their dtype.
"""

from __future__ import annotations

import numpy as np

from attnspec.backends import _lsh_xp, _mha
from attnspec.backends._common import to_reference
from attnspec.backends.arrays import ArrayLibrary
from attnspec.backends.base import VARIANT_FEATURES, Backend, MHAArrays
from attnspec.spec.blocked import blocked_core, check_block
from attnspec.spec.fp8 import FP8_DTYPES, FP8_NUMPY, finish_fp8, golden_fp8, plan_fp8
from attnspec.spec.grads import sdpa_vjp as spec_sdpa_vjp
from attnspec.spec.grads_lsh import lsh_attention_vjp as spec_lsh_attention_vjp
from attnspec.spec.grads_mha import mha_vjp as spec_mha_vjp
from attnspec.spec.lsh import lsh_attention as spec_lsh_attention
from attnspec.spec.mha import MHAParams, mha
from attnspec.spec.options import FP8_OPTIONS, LSH_OPTIONS, take, with_options
from attnspec.spec.sdpa import golden
from attnspec.spec.validate import SDPAExtras

__all__ = ["NumpyBackend"]


_NUMPY = ArrayLibrary()
_info = _NUMPY.info  # refuses anything but a NumPy array, naming the argument


class NumpyBackend(Backend):
    """The golden definition: float64 computation, one rounding to the inputs' dtype."""

    name = "numpy"
    variants = frozenset(VARIANT_FEATURES)
    array_type = _NUMPY.array_type

    def is_array(self, x: object) -> bool:
        return _NUMPY.is_array(x)

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> np.ndarray:
        if dtype in FP8_DTYPES:  # ml_dtypes' cast: out of e4m3fn's range gives NaN, not 448
            return np.asarray(x).astype(FP8_NUMPY[dtype])
        return np.array(to_reference(x, dtype))  # a copy: callers may mutate their input

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    @with_options()
    def sdpa(self, q, k, v, **options):
        o = take("numpy.sdpa", options)
        plan, extras = self._plan_of("numpy.sdpa", q, k, v, o), SDPAExtras.of(o)
        return golden(
            plan, q, k, v, o["mask"], o["bias"], o["return_weights"], extras
        )  # tiled for large inputs

    @with_options(after=("block_q", "block_k"))
    def sdpa_blocked(self, q, k, v, *, block_q=256, block_k=512, **options):
        fn = "numpy.sdpa_blocked"
        o = take(fn, options)
        plan, extras = self._plan_of(fn, q, k, v, o), SDPAExtras.of(o)
        bq, bk = check_block("block_q", block_q, fn), check_block("block_k", block_k, fn)
        return blocked_core(plan, q, k, v, o["mask"], o["bias"], o["return_weights"], bq, bk, extras=extras)

    @with_options(table=FP8_OPTIONS)
    def sdpa_fp8(self, q, k, v, **options):
        fn = "numpy.sdpa_fp8"
        o = take(fn, options, table=FP8_OPTIONS)
        fp = plan_fp8(fn, q, k, v, o)
        return finish_fp8(fp, golden_fp8(fp, q, k, v, o, o["return_weights"]), o["return_weights"])

    @with_options()
    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, **options):
        o = take("numpy.mha", options)
        _mha.validate("numpy.mha", _info, _same, (query, key, value, params, num_heads, num_kv_heads), o)
        if isinstance(params, MHAArrays):
            params = MHAParams(**vars(params))
        return mha(query, key, value, params, num_heads=num_heads, num_kv_heads=num_kv_heads, **o)

    @with_options(table=LSH_OPTIONS)
    def lsh_attention(self, x, v, **options):
        fn = "numpy.lsh_attention"
        _, o = _lsh_xp.plan(fn, _info, _same, x, v, options)  # the spec's checks, under this backend's name
        return spec_lsh_attention(x, v, **o)

    # the golden gradients themselves (attnspec.spec.grads*): analytic, float64
    @with_options(outputs=False)
    def sdpa_vjp(self, q, k, v, d_out, **options):
        return spec_sdpa_vjp(q, k, v, d_out, **take("numpy.sdpa_vjp", options, outputs=False))

    @with_options(outputs=False)
    def mha_vjp(self, query, key, value, params, d_out, *, num_heads, num_kv_heads=None, **options):
        if isinstance(params, MHAArrays):
            params = MHAParams(**vars(params))
        o = take("numpy.mha_vjp", options, outputs=False)
        grads = spec_mha_vjp(
            query, key, value, params, d_out, num_heads=num_heads, num_kv_heads=num_kv_heads, **o
        )
        return (*grads[:3], MHAArrays(**vars(grads[3])), *grads[4:])

    @with_options(outputs=False, table=LSH_OPTIONS)
    def lsh_attention_vjp(self, x, v, d_out, **options):
        o = take("numpy.lsh_attention_vjp", options, outputs=False, table=LSH_OPTIONS)
        return spec_lsh_attention_vjp(x, v, d_out, **o)


def _same(x):
    return x
