"""Judging one sdpa call against the golden, under the kit's one tolerance rule.

The rule is `attnspec.spec.tolerance`'s, derived there: a result may be ``K * err_ref + floor``
from the float64 golden, where ``err_ref`` is the error of the golden's own algorithm run in the
inputs' precision and ``floor = eps(D) * V * (1 + sqrt(m) + 2 sqrt(dk) L)``; non-finite entries
must match exactly. This module applies it to a call given as NumPy arrays, so the conformance
suite (`attnspec.conformance.pytest_helpers.golden_for`), the kit's own backend tests, the
deviation probes and a plugin's tests all judge with the same numbers:

    sdpa_golden(q, k, v, **options) -> Golden        the golden and the allowed errors
    compare(actual, q, k, v, **options) -> [str]     problems of a result; [] when it conforms
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.spec.dtypes import FLOAT_DTYPES, numpy_dtype
from attnspec.spec.sdpa import BLOCKED_MIN_LOGITS, attention_core, plan_numpy, sdpa
from attnspec.spec.tolerance import (
    Comparison,
    lse_allowed,
    reference_sdpa,
    sdpa_allowed,
    visibility_view,
)
from attnspec.spec.tolerance import compare as compare_arrays
from attnspec.spec.validate import SDPAExtras, SDPAPlan, finish, numpy_info, validate_sdpa

__all__ = ["Golden", "compare", "golden_and_reference", "relative_error", "sdpa_golden", "sdpa_plan"]


@dataclass
class Golden:
    """The float64 golden of one sdpa call (before the final rounding) and what each result may
    differ from it by."""

    out: np.ndarray
    weights: np.ndarray | None  # None for a large call that did not ask for weights
    allowed_out: float
    allowed_w: float | None
    lse: np.ndarray | None = None  # when the call asks for it (return_lse)
    allowed_lse: float | None = None


def sdpa_plan(q, k, v, options: dict[str, Any]) -> tuple[SDPAPlan, SDPAExtras]:
    """(plan, extras) of an sdpa call on NumPy arrays: the spec's validated plan and the
    variants' arrays."""
    o = options
    extras = SDPAExtras(
        o.get("alibi_slopes"),
        o.get("sinks"),
        o.get("q_segment_ids"),
        o.get("kv_segment_ids"),
        o.get("dropout_mask"),
    )
    plan = plan_numpy(
        "sdpa",
        q,
        k,
        v,
        o.get("mask"),
        o.get("bias"),
        o.get("causal"),
        o.get("window"),
        o.get("scale"),
        o.get("q_lengths"),
        o.get("kv_lengths"),
        extras,
        o.get("softcap"),
        o.get("dropout_p"),
        bool(o.get("return_lse")),
    )
    return plan, extras


def sdpa_golden(q, k, v, **options) -> Golden:
    """The float64 golden of ``sdpa(q, k, v, **options)`` and the allowed errors of
    `attnspec.spec.tolerance` (``sdpa_allowed``, ``lse_allowed``).

    Large calls (batch * Hq * n * m >= `BLOCKED_MIN_LOGITS`) get weights only when they ask for
    them: golden and reference then run tiled or in row blocks, with no (n, m) array.
    """
    f64: dict[str, Any] = {  # sdpa's keywords, as the caller gave them (float arrays in float64)
        name: x.astype(np.float64) if isinstance(x, np.ndarray) and x.dtype.name in FLOAT_DTYPES else x
        for name, x in options.items()
        if name != "return_weights"
    }
    plan, extras = sdpa_plan(q, k, v, options)
    want_w = bool(options.get("return_weights")) or math.prod(plan.full_weights_shape) < BLOCKED_MIN_LOGITS
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    result = sdpa(q64, k64, v64, **f64, return_weights=want_w)
    result = list(result) if isinstance(result, tuple) else [result]
    out, w, lse = result[0], result[1] if want_w else None, result[-1] if plan.return_lse else None
    mask, bias = options.get("mask"), options.get("bias")
    ref = reference_sdpa(plan, q, k, v, mask, bias, want_w, extras)
    ref = list(ref) if isinstance(ref, tuple) else [ref]
    vis = visibility_view(plan, mask, bias, extras)

    def allowed(ref_x, gold_x, value_scale=None):
        err_ref = compare_arrays(ref_x, gold_x, np.inf).max_abs_err
        return sdpa_allowed(plan, q, k, v, bias, vis, err_ref, value_scale=value_scale, extras=extras)

    allowed_w = allowed(ref[1], w, value_scale=1.0) if want_w else None
    allowed_lse = None
    if lse is not None:
        err_lse = compare_arrays(ref[-1], lse, np.inf).max_abs_err
        allowed_lse = lse_allowed(plan, q, k, bias, vis, err_lse, lse, extras)
    return Golden(out, w, allowed(ref[0], out), allowed_w, lse, allowed_lse)


def compare(actual, q, k, v, **options) -> list[str]:
    """Problems of ``actual`` against the golden of ``sdpa(q, k, v, **options)``; [] if none.

    ``actual`` is what sdpa returns for these options, as NumPy: out, then weights when
    ``return_weights``, then lse when ``return_lse``. Each is checked for shape, dtype (the
    inputs' dtype; lse float32, or float64 for float64 inputs) and values under the rule.
    """
    g = sdpa_golden(q, k, v, **options)
    plan, _ = sdpa_plan(q, k, v, options)
    parts = list(actual) if isinstance(actual, tuple) else [actual]
    expected = [("out", g.out, g.allowed_out, plan.dtype)]
    if options.get("return_weights"):
        assert g.weights is not None and g.allowed_w is not None  # asked for, so the golden has them
        expected.append(("weights", g.weights, g.allowed_w, plan.dtype))
    if plan.return_lse:
        assert g.lse is not None and g.allowed_lse is not None  # planned, so the golden has them
        expected.append(("lse", g.lse, g.allowed_lse, plan.lse_dtype))
    if len(parts) != len(expected):
        return [
            f"returned {len(parts)} arrays, but should return {len(expected)} "
            f"({', '.join(e[0] for e in expected)})"
        ]
    problems = []
    for got, (what, gold, allowed, dtype) in zip(parts, expected):
        got = np.asarray(got)
        if got.shape != gold.shape:
            problems.append(f"{what}.shape={got.shape}, but should be {gold.shape}")
        elif got.dtype.name != dtype:
            problems.append(f"{what}.dtype={got.dtype.name}, but should be {dtype}")
        else:
            c = compare_arrays(got, gold, allowed)
            if not c.ok:
                problems.append(describe(what, got, gold, c, plan.dtype))
    return problems


def describe(what: str, got: np.ndarray, gold: np.ndarray, c: Comparison, dtype: str) -> str:
    """One line for a failed `Comparison`: the worst element, its error, the allowed error."""
    idx = c.worst_index
    at = "" if idx is None else f"{what}[{idx}]={got[idx].item()!r}, but should be {gold[idx].item()!r}: "
    return (
        f"{at}error {c.max_abs_err:.3g} > allowed {c.allowed:.3g} ({dtype}); "
        f"{100 * c.out_of_tolerance:.1f}% of elements out of tolerance, "
        f"{c.nonfinite_mismatch} NaN/inf mismatches"
    )


def golden_and_reference(q, k, v, **options):
    """(golden, same-precision reference, plan) of one call on NumPy inputs; golden and
    reference are each (out, weights), rounded to the inputs' dtype (for the deviation probes)."""
    fn = "compare"
    plan = validate_sdpa(
        fn,
        numpy_info(fn, "q", q),
        numpy_info(fn, "k", k),
        numpy_info(fn, "v", v),
        mask=None if options.get("mask") is None else numpy_info(fn, "mask", options["mask"]),
        bias=None if options.get("bias") is None else numpy_info(fn, "bias", options["bias"]),
        **{key: options.get(key) for key in ("causal", "window", "scale", "q_lengths", "kv_lengths")},
    )
    mask, bias = options.get("mask"), options.get("bias")
    with np.errstate(all="ignore"):  # NaN/inf cases are on purpose
        gold_out, gold_w = attention_core(plan, q, k, v, mask, bias, np.float64, lambda x: x)  # no lse
        ref = reference_sdpa(plan, q, k, v, mask, bias, return_weights=True)
    return finish(plan, gold_out, gold_w, numpy_dtype(plan.dtype), True), ref, plan


def relative_error(actual: np.ndarray, golden: np.ndarray) -> float:
    """max |actual - golden| / max(1, max |golden|) over finite entries (for probes)."""
    a, g = actual.astype(np.float64), golden.astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(g)
    scale = max(1.0, float(np.abs(g[finite]).max(initial=0.0)))
    return float(np.abs(a - g)[finite].max(initial=0.0)) / scale if finite.any() else math.inf
