"""Conformance properties of sdpa: every backend, every feature, every dtype it supports."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance.corners import CORNERS, EDGE_CORNERS, with_corners
from attnspec.conformance.hypothesis_helpers import (
    SDPACase,
    full_visibility,
    sdpa_cases,
    tag_visibility,
)
from attnspec.conformance.judge import explicit_mask_case, judge_output, plan_of
from attnspec.conformance.pytest_helpers import (
    Verdict,
    bad_input_verdict,
    call_sdpa,
    golden_for,
    to_backend,
)
from attnspec.spec.bad_inputs import ALL_SDPA_BAD_INPUTS
from attnspec.spec.validate import FLOAT_DTYPES

DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES)


@DTYPES
@with_corners(kinds=(*CORNERS, *EDGE_CORNERS))
@given(data=st.data())
def test_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """Output (and, when asked, weights) equal the golden within the tolerance rule."""
    case = data.draw(sdpa_cases(dtype), label="case")
    return_weights = data.draw(st.booleans(), label="return_weights")
    if return_weights:
        weighted = case.with_options(return_weights=True)
        # a backend that returns no weights (most real ones) has the output judged alone rather
        # than the case refused: half of every feature's cases would otherwise never reach it
        # (mutation testing found torch_sdpa's is_causal path left unchecked that way)
        if not _refuses(attn_backend, attn_device, weighted) or _refuses(attn_backend, attn_device, case):
            case = weighted

    judge.sdpa("matches_golden", case)


@DTYPES
@with_corners
@given(data=st.data())
def test_weights_rows_sum_to_one_or_zero(attn_backend, attn_device, judge, dtype, data):
    """Returned weights match the golden; each row sums to 1, or exactly 0 with no visible key."""
    case = data.draw(sdpa_cases(dtype), label="case").with_options(return_weights=True)

    def body():
        out, weights = call_sdpa(attn_backend, case, attn_device)
        verdict = judge_output(attn_backend, attn_device, "weights_rows", case, (out, weights))
        if verdict.status == "failed":
            return verdict
        vis = full_visibility(plan_of(case), case.options)
        w = attn_backend.to_numpy(weights).astype(np.float64).reshape(vis.shape)
        sums = w.sum(axis=-1)
        empty = ~vis.any(axis=-1)
        g = golden_for(case)
        # each of m weights may be off by allowed_w, so a row sum by m * allowed_w
        bound = max(vis.shape[-1], 1) * g.allowed_w
        bad_full = np.abs(sums[~empty] - 1) > bound
        bad_empty = sums[empty] != 0
        if bad_full.any() or bad_empty.any():
            msg = (
                f"[{attn_backend.name}] sdpa weights_rows: {case.describe()}\n"
                f"  {int(bad_full.sum())} rows with visible keys do not sum to 1 within {bound:.3e}"
                f" (worst {np.abs(sums[~empty] - 1).max(initial=0):.3e}); {int(bad_empty.sum())} rows "
                "with no visible key do not sum to exactly 0"
            )
            return Verdict("failed", verdict.comparisons, msg)
        return verdict

    judge("sdpa", "weights_rows", case, body)


def _refuses(backend, device, case: SDPACase) -> list[str]:
    """Why ``backend`` refuses ``case`` before calling (as the judge asks it)."""
    return backend.supports(
        "sdpa",
        dtype=case.dtype,
        device=device,
        q_shape=case.q.shape,
        k_shape=case.k.shape,
        v_shape=case.v.shape,
        **case.options,
    )


def _folded(case: SDPACase) -> SDPACase:
    """The case with its visibility folded into one explicit mask; weights asked for stay asked."""
    return explicit_mask_case(case, keep=("bias", "scale", "return_weights"))


@DTYPES
@with_corners
@given(data=st.data())
def test_masked_keys_are_absent(attn_backend, attn_device, judge, dtype, data):
    """Changing keys/values that no row may see, even to NaN or inf, changes nothing."""
    case = _folded(data.draw(sdpa_cases(dtype), label="case"))
    m = case.k.shape[-2]
    hidden = np.asarray(data.draw(st.lists(st.booleans(), min_size=m, max_size=m), label="hidden"), bool)
    poison = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4]), label="poison")
    options = {**case.options, "mask": case.options["mask"] & ~hidden}
    if "bias" in options and m:
        # with a bias, every other hidden key is hidden by a -inf bias alone, not by the mask: a
        # -inf logit is absent too, and its value must not reach the row as 0 * NaN
        by_bias = hidden & (np.arange(m) % 2 == 1)
        bias = np.array(np.broadcast_to(options["bias"], (*options["bias"].shape[:-1], m)))
        bias[..., by_bias] = -np.inf
        options["bias"] = bias
        options["mask"] = case.options["mask"] & ~(hidden & ~by_bias)
    k, v = case.k.copy(), case.v.copy()
    k[..., hidden, :] = poison
    v[..., hidden, :] = poison
    # hiding keys can empty a row: the tags (and so the deviations that apply) follow the new case
    tags = set(case.tags)
    tag_visibility(tags, case.q, k, v, options)
    clean = SDPACase(case.feature, case.dtype, case.q, case.k, case.v, options, frozenset(tags), case.seed)
    poisoned = SDPACase(clean.feature, clean.dtype, case.q, k, v, options, clean.tags, clean.seed)

    judge.sdpa("masked_keys_are_absent", poisoned, golden_case=clean)


@DTYPES
@with_corners
@given(data=st.data())
def test_key_permutation(attn_backend, attn_device, judge, dtype, data):
    """Permuting keys and values together with their mask and bias leaves the output unchanged."""
    case = _folded(data.draw(sdpa_cases(dtype), label="case"))
    m = case.k.shape[-2]
    perm = np.asarray(data.draw(st.permutations(range(m)), label="perm"), dtype=np.int64)
    opts = dict(case.options)
    opts["mask"] = opts["mask"][..., perm]
    if "bias" in opts:
        opts["bias"] = np.broadcast_to(opts["bias"], opts["bias"].shape[:-1] + (m,))[..., perm]
    permuted = SDPACase(
        case.feature,
        case.dtype,
        case.q,
        case.k[..., perm, :],
        case.v[..., perm, :],
        opts,
        case.tags,
        case.seed,
    )

    judge.sdpa("key_permutation", permuted, golden_case=case)


@DTYPES
@with_corners
@given(data=st.data())
def test_deterministic(attn_backend, attn_device, judge, dtype, data):
    """Two identical calls give bit-identical results (NaN where NaN)."""
    case = data.draw(sdpa_cases(dtype), label="case")

    def body():
        a = attn_backend.to_numpy(call_sdpa(attn_backend, case, attn_device)).astype(np.float64)
        b = attn_backend.to_numpy(call_sdpa(attn_backend, case, attn_device)).astype(np.float64)
        if a.shape == b.shape and np.array_equal(a, b, equal_nan=True):
            return Verdict("passed")
        diff = np.abs(a - b)
        return Verdict(
            "failed",
            message=(
                f"[{attn_backend.name}] sdpa deterministic: {case.describe()}\n"
                f"  two identical calls differ: max |a - b| = {np.nanmax(diff, initial=0):.3e}, "
                f"{int((~((a == b) | (np.isnan(a) & np.isnan(b)))).sum())} elements differ"
            ),
        )

    judge("sdpa", "deterministic", case, body)


@pytest.mark.parametrize("bad", ALL_SDPA_BAD_INPUTS, ids=lambda b: b.id)
def test_bad_input_raises_spec_error(attn_backend, attn_device, judge, bad):
    """Every entry of the spec's bad-input catalogue raises SpecError from the backend too."""
    (q, k, v), options = bad.build()
    dtype = bad.dtypes[0] if bad.dtypes[0] in FLOAT_DTYPES else "float32"
    case = SDPACase("bad_input", dtype, q, k, v, options, frozenset({"bad_input", bad.id}), 0)

    def body():
        (bq, bk, bv), opts = to_backend(attn_backend, case, attn_device)
        return bad_input_verdict(
            attn_backend.name, "sdpa", bad.id, bad.match, lambda: attn_backend.sdpa(bq, bk, bv, **opts)
        )

    # a backend without one of the case's dtypes cannot even build its arrays (bias_dtype's float64)
    judge(
        "sdpa",
        "bad_input",
        case,
        body,
        feature_case={
            "bad_input": True,
            "dtypes": tuple(d for d in bad.dtypes if d in FLOAT_DTYPES)
            + tuple(
                x.dtype.name
                for x in options.values()
                if isinstance(x, np.ndarray) and x.dtype.name in FLOAT_DTYPES
            ),
        },
    )
