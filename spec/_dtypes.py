"""The dtype table: every dtype name the kit uses, its NumPy dtype, its epsilon and the precision
the exact paths compute in. The one copy; the spec, the tolerance rule, the backends and the
suite read it from here."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from attnspec._errors import SpecError

#: the floating-point dtypes of the spec's inputs, narrowest first
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: dtype name -> NumPy dtype (bfloat16 through ml_dtypes)
NUMPY_DTYPES: dict[str, np.dtype] = {
    "bool": np.dtype(bool),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
}


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a dtype name from `NUMPY_DTYPES`."""
    try:
        return NUMPY_DTYPES[name]
    except KeyError:
        raise SpecError(f"asarray: dtype={name!r} is not one of {', '.join(NUMPY_DTYPES)}") from None


def eps(dtype: str) -> float:
    """Machine epsilon (distance from 1 to the next float) of a float dtype name."""
    return float(ml_dtypes.finfo(numpy_dtype(dtype)).eps)


def compute_dtype_name(dtype: str) -> str:
    """Precision of the exact paths: float64 for float64, float32 for every narrower float.

    float16/bfloat16 inputs are exactly representable in float32, and float32 accumulation keeps
    the error at the level of the final rounding to the input dtype (what fused kernels do). The
    log-sum-exp is returned in this precision too.
    """
    return "float64" if dtype == "float64" else "float32"
