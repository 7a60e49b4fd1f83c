"""Conformance of ``sdpa_fp8`` (issue #27): FP8 q, k, v with descales equal the golden
(`attnspec.spec.sdpa_fp8`) within the FP8 tolerance (`attnspec.spec.tolerance_fp8`), judged by
the P precision the backend claims (``fp8_p_precision``).

Parametrised over the FP8 storage dtypes, not FLOAT_DTYPES: a backend without sdpa_fp8 refuses
every case at once (``supports``: "does not implement sdpa_fp8"). The fixed corner cases of
`attnspec.conformance.corners` (-inf biases, NaN and inf keys) are not FP8 inputs, so this
property runs no corners. Under ``attnspec check`` (``ATTNSPEC_TOUR=1``) it tours every FP8
feature once in bfloat16 out, FA3's (`with_corners` tours those that `tour_features` names,
`with_fp8_tours` the rest: ``wide_q``, ``peaked`` and ``out_float32``), so a function checked
through a convention that passes descales (``flash3_fp8``) meets each feature it can express.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance.causes import fp8_causes
from attnspec.conformance.corners import NotThisProperty, Tour, run_tour, with_corners
from attnspec.conformance.fp8_cases import EXTRA_TOUR_FEATURES, FP8Case, fp8_cases
from attnspec.conformance.pytest_helpers import Verdict, check_metadata, failure_message, to_backend
from attnspec.spec.fp8 import FP8_DTYPES, plan_fp8
from attnspec.spec.tolerance import compare
from attnspec.spec.tolerance_fp8 import fp8_golden


def with_fp8_tours(test):
    """Under ``ATTNSPEC_TOUR=1``, tour `EXTRA_TOUR_FEATURES` (judged like `with_corners`' tours,
    in its ``corner`` phase), then run ``test`` (``with_corners``: its tours, the drawn examples).
    The first failure is raised after both."""
    inner = test.hypothesis.inner_test

    @functools.wraps(test)
    def run(*args, **kwargs):
        failed = None
        state = getattr(kwargs["judge"], "state", None)
        if os.environ.get("ATTNSPEC_TOUR") == "1":
            if state is not None and state.phase != "sweep":
                state.phase = "corner"
            for i, feature in enumerate(EXTRA_TOUR_FEATURES):
                try:
                    exc = run_tour(inner, args, kwargs, Tour(feature, 7919 * i + 29))
                except NotThisProperty:
                    continue
                failed = failed or exc
            if state is not None and state.phase == "corner":
                state.phase = "drawn"
        test(*args, **kwargs)
        if failed is not None:
            raise failed

    return run


@pytest.mark.parametrize("dtype", FP8_DTYPES)
@with_fp8_tours
@with_corners(kinds=())
@given(data=st.data())
def test_fp8_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """Output (and lse when asked) of FP8 inputs equal the dequantised golden within the FP8
    tolerance, in the requested out_dtype and on the case's device."""
    case = data.draw(fp8_cases(dtype), label="case")

    def body():
        return judge_fp8(attn_backend, attn_device, "matches_golden", case)

    feature_case = {"dtypes": case.wide_dtypes, "q_dtype": case.q.dtype.name}
    judge("sdpa_fp8", "matches_golden", case, body, feature_case=feature_case)


def judge_fp8(backend, device, prop: str, case: FP8Case) -> Verdict:
    """Run ``case`` on ``backend`` and judge each result: shape, dtype and device first, then the
    values under `attnspec.spec.tolerance_fp8` with the backend's P precision claim."""
    (q, k, v), opts = to_backend(backend, case, device)
    result = backend.sdpa_fp8(q, k, v, **opts)
    parts = list(result) if isinstance(result, tuple) else [result]
    fp = plan_fp8("sdpa_fp8", case.q, case.k, case.v, case.options)
    claim = getattr(backend, "fp8_p_precision", "float32")
    g = fp8_golden(case.q, case.k, case.v, p_precision=claim, **case.options)
    expected: list[tuple[str, Any, Any, tuple[int, ...], str]] = [
        ("out", g.out, g.allowed_out, fp.sdpa.out_shape, fp.out_dtype)
    ]
    if fp.sdpa.return_lse:
        expected.append(("lse", g.lse, g.allowed_lse, fp.sdpa.lse_shape, fp.lse_dtype))
    if len(parts) != len(expected):
        problem = (
            f"returned {len(parts)} arrays, but should return {len(expected)} "
            f"({', '.join(e[0] for e in expected)})"
        )
        return Verdict(
            "failed", message=failure_message(backend.name, prop, case, device, {}, [problem], fn="sdpa_fp8")
        )
    problems, comparisons = [], {}
    for got, (what, gold, allowed, shape, out_dtype) in zip(parts, expected):
        meta = check_metadata(backend, got, shape, out_dtype, device, what)
        problems += meta
        if not meta:
            comparisons[what] = compare(backend.to_numpy(got), gold, allowed)
    if problems or not all(c.ok for c in comparisons.values()):
        causes = (
            []
            if problems
            else fp8_causes(
                case.q, case.k, case.v, case.options, backend.to_numpy(parts[0]), g.allowed_out, claim
            )
        )
        problems.append(f"judged as a float32 kernel whose P is {claim} (its fp8_p_precision)")
        return Verdict(
            "failed",
            comparisons,
            failure_message(
                backend.name, prop, case, device, comparisons, problems, fn="sdpa_fp8", causes=causes
            ),
        )
    return Verdict("passed", comparisons)
