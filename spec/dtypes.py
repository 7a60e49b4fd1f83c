"""The dtype table: every dtype name the kit uses, its NumPy dtype, its epsilon and the precision
the exact paths compute in. The one copy; the spec, the tolerance rule, the backends and the
suite read it from here."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from attnspec.errors import SpecError

#: the floating-point dtypes of the spec's inputs, narrowest first
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

#: every dtype name a backend names its arrays by (`Backend.dtype_name`), FP8 aside
#: (`attnspec.spec.fp8.FP8_DTYPES`)
DTYPE_NAMES = (
    "bool",
    *(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)),
    *FLOAT_DTYPES,
    "complex64",
    "complex128",
)

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


def round_to(x: np.ndarray, dtype: np.dtype | str) -> np.ndarray:
    """``x`` (float64) rounded once, to nearest even, to ``dtype``: decision 9's one rounding.

    NumPy's casts are correctly rounded for float16 and float32, but ml_dtypes casts float64 to
    bfloat16 through float32, which rounds twice: 1 + 2**-8 + 2**-40 becomes 1, not the nearest
    bfloat16 1 + 2**-7. So bfloat16 goes through float32 rounded to *odd* (truncate, then set the
    last bit when inexact): float32 keeps 16 more bits than bfloat16, so that rounding holds the
    sticky information and the final float32 -> bfloat16 cast rounds correctly (overflow to inf,
    subnormals and NaN included)."""
    dt = numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    if dt != NUMPY_DTYPES["bfloat16"]:
        return np.asarray(x).astype(dt)
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t = x.astype(np.float32)
        beyond = np.abs(t.astype(np.float64)) > np.abs(x)  # rounded away from zero: step back
        t = np.where(beyond, np.nextafter(t, np.float32(0)), t)
        inexact = np.isfinite(x) & (t.astype(np.float64) != x)
        bits = t.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32).astype(dt)
