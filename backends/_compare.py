"""Comparing a backend's result with the golden, with a tolerance derived per case.

Used by the kit's tests and by the deviation probes; a backend author can use it the same way.

The rule (FlashAttention / PyTorch SDPA test style): a backend may be at most ``K`` times as far
from the float64 golden as a same-precision reference is, plus a floor.

* The same-precision reference is the golden's own algorithm (`attention_core`) computed in
  float32 (float64 for float64 inputs) with every stored intermediate rounded to the input
  dtype: the error an honest implementation in that precision makes *on these inputs*.
  ``K = 4`` leaves room for a different summation order or a fused kernel's blocking.
* The floor covers what the reference does not: both results are rounded once to the dtype
  (``2 u`` relative, u the unit roundoff of the dtype), and the backend's own accumulation in
  its compute precision (unit roundoff ``uc``): a dot product of dk terms is off by at most
  ``dk uc |q||k|`` (the standard gamma_n bound), which moves a softmax weight by twice that
  relative, on logits bounded by ``L = scale max|q_i| max|k_j| + max|bias|``; the weighted sum
  of m values adds ``m uc``. So ``floor = max(1, max|v|) (2 u + (m + 2 dk L) uc)``.
  For float64 that is ~1e-15 relative to max|v| at the kit's sizes; for float32 ~1e-5.

For weights the same rule holds with max|v| replaced by 1. NaN must appear exactly where the
golden has NaN, and infinities must match exactly.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from attnspec.spec._validate import numpy_info, validate_sdpa
from attnspec.spec.sdpa import attention_core, finish

K = 4
UNIT_ROUNDOFF = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_NUMPY = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def golden_and_reference(q, k, v, **options):
    """(golden, same-precision reference) of one call on NumPy inputs; each (out, weights)."""
    fn = "compare"
    plan = validate_sdpa(
        fn, numpy_info(fn, "q", q), numpy_info(fn, "k", k), numpy_info(fn, "v", v),
        mask=None if options.get("mask") is None else numpy_info(fn, "mask", options["mask"]),
        bias=None if options.get("bias") is None else numpy_info(fn, "bias", options["bias"]),
        **{key: options.get(key) for key in ("causal", "window", "scale", "q_lengths", "kv_lengths")},
    )
    mask, bias = options.get("mask"), options.get("bias")
    with np.errstate(all="ignore"):  # NaN/inf cases are on purpose
        gold = attention_core(plan, q, k, v, mask, bias, np.float64, lambda x: x)
    dtype = _NUMPY[plan.dtype]
    compute = np.float64 if plan.dtype == "float64" else np.float32

    def rnd(x):
        return x.astype(dtype).astype(compute)

    with np.errstate(all="ignore"):
        ref = attention_core(plan, q, k, v, mask, bias, compute, rnd)
    return (finish(plan, *gold, q.dtype, True), finish(plan, *ref, q.dtype, True), plan)


def tolerance(golden: np.ndarray, reference: np.ndarray, dtype: str, magnitude: float,
              m: int, dk: int, logit_bound: float) -> float:
    """``K * |reference - golden| + floor``, as derived in the module docstring."""
    g, r = golden.astype(np.float64), reference.astype(np.float64)
    both = np.isfinite(g) & np.isfinite(r)
    err_ref = float(np.abs(r - g)[both].max(initial=0.0))
    uc = UNIT_ROUNDOFF["float64" if dtype == "float64" else "float32"]
    floor = max(1.0, magnitude) * (2 * UNIT_ROUNDOFF[dtype] + (m + 2 * dk * logit_bound) * uc)
    return K * err_ref + floor


def _logit_bound(q, k, plan, bias) -> float:
    def biggest(x):
        x = np.abs(x.astype(np.float64))
        x = x[np.isfinite(x)]
        return float(x.max(initial=0.0))

    qn = np.sqrt((np.nan_to_num(q.astype(np.float64), posinf=0, neginf=0) ** 2).sum(-1)).max(initial=0.0)
    kn = np.sqrt((np.nan_to_num(k.astype(np.float64), posinf=0, neginf=0) ** 2).sum(-1)).max(initial=0.0)
    return plan.scale * float(qn) * float(kn) + (0.0 if bias is None else biggest(bias))


def compare(actual, q, k, v, *, return_weights: bool = False, **options) -> list[str]:
    """Problems of ``actual`` (NumPy out, or (out, weights)) against the golden; [] if none."""
    (gold_out, gold_w), (ref_out, ref_w), plan = golden_and_reference(q, k, v, **options)
    pairs = [("out", actual[0] if return_weights else actual, gold_out, ref_out)]
    if return_weights:
        pairs.append(("weights", actual[1], gold_w, ref_w))
    v_fin = np.abs(v.astype(np.float64))
    magnitude = float(v_fin[np.isfinite(v_fin)].max(initial=0.0))
    bound = _logit_bound(q, k, plan, options.get("bias"))
    problems = []
    for what, got, gold, ref in pairs:
        got = np.asarray(got)
        if got.shape != gold.shape:
            problems.append(f"{what}.shape={got.shape}, but should be {gold.shape}")
            continue
        if got.dtype != gold.dtype:
            problems.append(f"{what}.dtype={got.dtype}, but should be {gold.dtype}")
            continue
        g64, a64 = gold.astype(np.float64), got.astype(np.float64)
        nan_diff = np.isnan(g64) != np.isnan(a64)
        if nan_diff.any():
            idx = tuple(int(i) for i in np.argwhere(nan_diff)[0])
            problems.append(f"{what}[{idx}]={a64[idx]}, but should be {g64[idx]} (NaN pattern differs "
                            f"at {int(nan_diff.sum())} places)")
            continue
        inf_diff = (np.isinf(g64) | np.isinf(a64)) & (g64 != a64)
        if inf_diff.any():
            idx = tuple(int(i) for i in np.argwhere(inf_diff)[0])
            problems.append(f"{what}[{idx}]={a64[idx]}, but should be {g64[idx]}")
            continue
        tol = tolerance(gold, ref, plan.dtype, magnitude if what == "out" else 1.0, plan.m, plan.dk, bound)
        finite = np.isfinite(g64)
        err = np.abs(a64 - g64)[finite]
        worst = float(err.max(initial=0.0))
        if not worst <= tol:
            idx = tuple(int(i) for i in np.argwhere(finite)[int(np.argmax(err))])
            problems.append(f"{what}[{idx}]={a64[idx]!r}, but should be {g64[idx]!r}: error {worst:.3g} "
                            f"> tolerance {tol:.3g} ({plan.dtype})")
    return problems


def relative_error(actual: np.ndarray, golden: np.ndarray) -> float:
    """max |actual - golden| / max(1, max |golden|) over finite entries (for probes)."""
    a, g = actual.astype(np.float64), golden.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(g)
    scale = max(1.0, float(np.abs(g[finite]).max(initial=0.0)))
    return float(np.abs(a - g)[finite].max(initial=0.0)) / scale if finite.any() else math.inf
