"""The golden itself as a backend: `attnspec.spec.sdpa` on NumPy arrays (bfloat16 via ml_dtypes).

It runs the spec's own validation and core under the name ``numpy.sdpa``, so its bad-input
messages carry the backend's name like every other backend's.
"""

from __future__ import annotations

import numpy as np

from attnspec.backends._base import Backend
from attnspec.backends._common import refuse, to_reference
from attnspec.spec._validate import ArrayInfo, validate_sdpa
from attnspec.spec.sdpa import attention_core, finish

__all__ = ["NumpyBackend"]


def _info(fn: str, name: str, x: object) -> ArrayInfo:
    if not isinstance(x, np.ndarray):
        raise refuse(fn, name, x, "numpy.ndarray")
    return ArrayInfo(tuple(x.shape), x.dtype.name)


class NumpyBackend(Backend):
    """The golden definition: float64 computation, one rounding to the inputs' dtype."""

    name = "numpy"

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> np.ndarray:
        return np.array(to_reference(x, dtype))  # a copy: callers may mutate their input

    def to_numpy(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x)

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, return_weights=False):
        fn = "numpy.sdpa"
        plan = validate_sdpa(
            fn, _info(fn, "q", q), _info(fn, "k", k), _info(fn, "v", v),
            mask=None if mask is None else _info(fn, "mask", mask),
            bias=None if bias is None else _info(fn, "bias", bias),
            causal=causal, window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths,
        )
        out, weights = attention_core(plan, q, k, v, mask, bias, np.float64, _identity)
        return finish(plan, out, weights, q.dtype, return_weights)


def _identity(x: np.ndarray) -> np.ndarray:
    return x
