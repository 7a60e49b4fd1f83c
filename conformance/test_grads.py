"""Conformance properties of sdpa_vjp: the backward pass, tensor by tensor, against the golden.

Cases are `sdpa_cases` plus an upstream gradient d_out drawn from the case's seed, tagged
``vjp`` (so gradient deviations apply only here). Each gradient (dq, dk, dv, dbias when a bias is
given, dsinks when sinks are) has its own tolerance from `attnspec.spec.tolerance_grads`.

The attention variants of issue #15 (softcap, ALiBi, sinks, segment ids, "lower_right_lengths",
dropout with a given mask) are drawn by `variant_cases`: every case of ``variants_match_golden``,
and about half the drawn cases of masked_keys_get_zero, empty_rows_zero_and_finite and deterministic
(``matches_golden`` keeps the plain features). A backend that lacks a variant's backward
declares it in `supports` (recorded as unsupported), as for the forward (test_variants.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance.corners import with_corners
from attnspec.conformance.grads_cases import empty_row_problems, poison_hidden_keys, vjp_case
from attnspec.conformance.hypothesis_helpers import (
    VARIANT_CASE_FEATURES,
    SDPACase,
    case_plan,
    full_visibility,
    sdpa_cases,
    variant_cases,
)
from attnspec.conformance.judge import explicit_mask_case, plan_of
from attnspec.conformance.pytest_helpers import Verdict, check_metadata, comparison_lines, repro, to_backend
from attnspec.spec.grads import sdpa_vjp
from attnspec.spec.sdpa import sdpa
from attnspec.spec.tolerance import Comparison, compare
from attnspec.spec.tolerance_grads import grad_names, reference_sdpa_vjp, sdpa_vjp_allowed
from attnspec.spec.validate import FLOAT_DTYPES

DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES)
#: the variants with a backward: return_lse ("lse") is a forward output, sdpa_vjp has none
VJP_VARIANTS = tuple(f for f in VARIANT_CASE_FEATURES if f != "lse")
#: the sdpa features the empty-row property draws (its variant cases are drawn on top of them)
EMPTY_ROW_FEATURES = ("no_visible_rows", "q_lengths", "bias_neg_inf")


def _draw_case(data, dtype: str, features=None):
    """A drawn sdpa case, or (about half the time) one with a variant on top of it."""
    if data.draw(st.booleans(), label="variants"):
        strategy = (
            variant_cases(dtype, VJP_VARIANTS)
            if features is None
            else variant_cases(dtype, VJP_VARIANTS, features)
        )
        return data.draw(strategy, label="case")
    return data.draw(sdpa_cases(dtype) if features is None else sdpa_cases(dtype, features), label="case")


def _f64(options: dict) -> dict:
    return {
        k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype.name in FLOAT_DTYPES else v
        for k, v in options.items()
    }


def golden_vjp(case: SDPACase, d_out: np.ndarray):
    """(golden gradients float64, allowed per gradient name) for one case."""
    o = case.options
    f64 = _f64(o)
    q64, k64, v64, d64 = (x.astype(np.float64) for x in (case.q, case.k, case.v, d_out))
    golden = sdpa_vjp(q64, k64, v64, d64, **f64)
    plan, extras = case_plan(case.q, case.k, case.v, o)
    ref = reference_sdpa_vjp(plan, case.q, case.k, case.v, d_out, o.get("mask"), o.get("bias"), extras)
    names = grad_names(o.get("bias"), o.get("sinks"))
    err_ref = {name: compare(r, g, np.inf).max_abs_err for name, r, g in zip(names, ref, golden)}
    undropped = {k: v for k, v in f64.items() if k not in ("dropout_mask", "dropout_p")}
    _, weights = sdpa(q64, k64, v64, **undropped, return_weights=True)  # P before dropout
    vis = full_visibility(plan, o)
    allowed = sdpa_vjp_allowed(
        plan, case.q, case.k, case.v, d_out, o.get("bias"), vis, weights, err_ref, extras
    )
    return golden, allowed


def call_vjp(backend, case: SDPACase, d_out: np.ndarray, device):
    (q, k, v), opts = to_backend(backend, case, device)
    opts.pop("return_weights", None)
    return backend.sdpa_vjp(q, k, v, backend.asarray(d_out, device=device), **opts)


def _message(backend_name: str, prop: str, case: SDPACase, device, comparisons, problems) -> str:
    lines = [f"[{backend_name}] sdpa_vjp {prop}: {case.describe()} device={device}"]
    lines += [f"  {p}" for p in problems]
    lines += comparison_lines(comparisons)
    lines.append("  reproduce with (the forward; the vjp takes d_out = the same seed's normal draw):")
    lines += ["    " + line for line in repro(backend_name, case, device).splitlines()]
    return "\n".join(lines)


def judge_grads(
    backend, device, prop, case, d_out, grads, golden_case=None, extra_problems=(), empty_rows=None
) -> Verdict:
    """The verdict on ``grads``, what ``backend``'s sdpa_vjp returned for ``case`` and ``d_out``,
    against the golden of ``golden_case`` (default ``case``); with ``empty_rows``, the (*batch, Hq,
    n) rows that see no key, also that every gradient is finite and dq is 0 on those rows."""
    golden, allowed = golden_vjp(golden_case or case, d_out)
    names = grad_names(case.options.get("bias"), case.options.get("sinks"))
    problems = list(extra_problems)
    if not isinstance(grads, tuple) or len(grads) != len(golden):
        problems.append(
            f"returned {type(grads).__name__} of {len(grads) if isinstance(grads, tuple) else '?'} "
            f"arrays, but should return a tuple ({', '.join(names)})"
        )
        return Verdict("failed", {}, _message(backend.name, prop, case, device, {}, problems))
    if empty_rows is not None:
        arrays = {name: backend.to_numpy(g).astype(np.float64) for name, g in zip(names, grads)}
        problems += empty_row_problems(arrays, "dq", empty_rows, "rows with no visible key")
    comparisons: dict[str, Comparison] = {}
    for name, g, want in zip(names, grads, golden):
        problems += [
            p.replace("out.", f"{name}.") for p in check_metadata(backend, g, want.shape, case.dtype, device)
        ]
        comparisons[name] = compare(backend.to_numpy(g).astype(np.float64), want, allowed[name])
    if problems or not all(c.ok for c in comparisons.values()):
        return Verdict(
            "failed", comparisons, _message(backend.name, prop, case, device, comparisons, problems)
        )
    return Verdict("passed", comparisons)


def _judge_vjp(judge, backend, device, prop: str, case, d_out, **checks) -> None:
    """Judge the backend's sdpa_vjp on ``case`` and ``d_out`` as property ``prop`` (`judge_grads`,
    which takes ``checks``)."""

    def body():
        return judge_grads(
            backend, device, prop, case, d_out, call_vjp(backend, case, d_out, device), **checks
        )

    judge("sdpa_vjp", prop, case, body)


@DTYPES
@with_corners
@given(data=st.data())
def test_vjp_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """dq, dk, dv (and dbias) each equal the golden within the gradient tolerance rule."""
    case, d_out = vjp_case(data.draw(sdpa_cases(dtype), label="case"))
    _judge_vjp(judge, attn_backend, attn_device, "matches_golden", case, d_out)


@DTYPES
@with_corners
@given(data=st.data())
def test_vjp_variants_match_golden(attn_backend, attn_device, judge, dtype, data):
    """With a variant (softcap, ALiBi, sinks, segments, "lower_right_lengths", dropout) or all of
    them: dq, dk, dv, dbias and dsinks each equal the golden within the gradient tolerance rule."""
    case, d_out = vjp_case(data.draw(variant_cases(dtype, VJP_VARIANTS), label="case"))
    _judge_vjp(judge, attn_backend, attn_device, "variants_match_golden", case, d_out)


@DTYPES
@with_corners
@given(data=st.data())
def test_vjp_masked_keys_get_zero(attn_backend, attn_device, judge, dtype, data):
    """Keys no row may see, even holding NaN or inf, get dk = dv = 0 exactly and change no gradient."""
    base = _draw_case(data, dtype)
    base = explicit_mask_case(base) if "variants" not in base.tags else base
    m = base.k.shape[-2]
    hidden = np.asarray(data.draw(st.lists(st.booleans(), min_size=m, max_size=m), label="hidden"), bool)
    poison = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4]), label="poison")
    clean, d_out, poisoned = poison_hidden_keys(base, hidden, poison)

    def body():
        grads = call_vjp(attn_backend, poisoned, d_out, attn_device)
        problems = []
        if isinstance(grads, tuple) and len(grads) >= 3:
            for name, g in (("dk", grads[1]), ("dv", grads[2])):
                got = attn_backend.to_numpy(g).astype(np.float64)[..., hidden, :]
                if got.size and not (got == 0).all():
                    problems.append(
                        f"{name} of the {int(hidden.sum())} hidden keys is not exactly 0: "
                        f"max |{name}| = {np.nanmax(np.abs(got), initial=0):.3e}, "
                        f"{int((~(got == 0)).sum())} nonzero or NaN entries"
                    )
        return judge_grads(
            attn_backend, attn_device, "masked_keys_get_zero", poisoned, d_out, grads, clean, problems
        )

    judge("sdpa_vjp", "masked_keys_get_zero", poisoned, body)


@DTYPES
@with_corners
@given(data=st.data())
def test_vjp_empty_rows_zero_and_finite(attn_backend, attn_device, judge, dtype, data):
    """A query row with no visible key gets dq = 0 (and dbias = 0); every gradient is finite."""
    case, d_out = vjp_case(_draw_case(data, dtype, EMPTY_ROW_FEATURES))
    empty = ~full_visibility(plan_of(case), case.options).any(axis=-1)  # (*batch, Hq, n)
    _judge_vjp(judge, attn_backend, attn_device, "empty_rows_zero_and_finite", case, d_out, empty_rows=empty)


def _with_head_shape(shape):
    return (1, *shape) if len(shape) == 2 else shape


@DTYPES
@with_corners
@given(data=st.data())
def test_vjp_deterministic(attn_backend, attn_device, judge, dtype, data):
    """Two identical sdpa_vjp calls give bit-identical gradients (NaN where NaN)."""
    case, d_out = vjp_case(_draw_case(data, dtype))

    def body():
        a = call_vjp(attn_backend, case, d_out, attn_device)
        b = call_vjp(attn_backend, case, d_out, attn_device)
        diffs = []
        for name, x, y in zip(grad_names(case.options.get("bias"), case.options.get("sinks")), a, b):
            x, y = (attn_backend.to_numpy(t).astype(np.float64) for t in (x, y))
            if not (x.shape == y.shape and np.array_equal(x, y, equal_nan=True)):
                diffs.append(f"{name}: max |a - b| = {np.nanmax(np.abs(x - y), initial=0):.3e}")
        if diffs:
            return Verdict(
                "failed",
                message=(
                    f"[{attn_backend.name}] sdpa_vjp deterministic: {case.describe()}\n"
                    "  two identical calls differ: " + "; ".join(diffs)
                ),
            )
        return Verdict("passed")

    judge("sdpa_vjp", "deterministic", case, body)
