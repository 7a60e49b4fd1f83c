"""Conformance properties of the attention variants (issue #15): softcap, ALiBi, sinks, lse,
segment ids, causal="lower_right_lengths" and dropout with a given mask.

Each case is one variant (or all of them, ``variants_combined``) on top of a drawn sdpa case; a
backend declares the variants it lacks through `supports`, and those cases are recorded as
unsupported. Dropout is judged here against the golden with the given mask; a backend that
draws its own mask (``dropout_p`` alone, variant ``dropout_drawn``) is checked statistically in
`attnspec.conformance.test_dropout`.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance.corners import with_corners
from attnspec.conformance.hypothesis_helpers import SDPACase, full_visibility, tag_visibility, variant_cases
from attnspec.conformance.judge import judge_output, plan_of
from attnspec.conformance.pytest_helpers import Verdict, call_sdpa, golden_for
from attnspec.spec.validate import FLOAT_DTYPES

DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES)


@DTYPES
@with_corners
@given(data=st.data())
def test_variants_match_golden(attn_backend, attn_device, judge, dtype, data):
    """Output, weights (when asked) and lse (when asked) equal the golden within the tolerance."""
    case = data.draw(variant_cases(dtype), label="case")
    if data.draw(st.booleans(), label="return_weights"):
        case = case.with_options(return_weights=True)

    judge.sdpa("variants_match_golden", case)


@DTYPES
@with_corners
@given(data=st.data())
def test_softcap_before_bias(attn_backend, attn_device, judge, dtype, data):
    """Softcap with a bias (and ALiBi at times) on top: the cases where capping before or after
    the additive terms differ (decision 12). variants_match_golden draws these only now and then."""
    case = data.draw(
        variant_cases(dtype, ("softcap", "variants_combined"), bases=("bias", "combined")), label="case"
    )

    judge.sdpa("softcap_before_bias", case)


@DTYPES
@with_corners
@given(data=st.data())
def test_alibi_anchor(attn_backend, attn_device, judge, dtype, data):
    """ALiBi on n != m under each alignment (none, lower_right, lower_right_lengths): the cases
    where its anchor i' and its sign show (decision 13). With n == m every anchor agrees, and under
    a causal rule a per-row shift of the distance leaves the softmax unchanged, so the draws lean
    on the non-causal and the lower-right cases."""
    case = data.draw(
        variant_cases(
            dtype,
            ("alibi", "alibi_lower_right_lengths"),
            bases=("plain", "gqa", "kv_lengths", "causal_lower_right", "window_lower_right", "combined"),
        ),
        label="case",
    )

    judge.sdpa("alibi_anchor", case)


@DTYPES
@with_corners
@given(data=st.data())
def test_sink_takes_its_share(attn_backend, attn_device, judge, dtype, data):
    """With sinks, each row's weights sum to 1 - p_sink, p_sink = exp(sink - lse) (0 for a row
    with no visible key): the sink has a logit in the denominator and no value."""
    case = data.draw(variant_cases(dtype, ("sinks",)), label="case").with_options(
        return_weights=True, return_lse=True
    )

    def body():
        out, weights, lse = call_sdpa(attn_backend, case, attn_device)
        verdict = judge_output(attn_backend, attn_device, "sink_share", case, (out, weights, lse))
        if verdict.status == "failed":
            return verdict
        vis = full_visibility(plan_of(case), case.options)
        g = golden_for(case)
        w = attn_backend.to_numpy(weights).astype(np.float64).reshape(vis.shape)
        sink = case.options["sinks"].astype(np.float64)[:, None]  # (Hq, 1)
        p_sink = np.exp(sink - g.lse.reshape(vis.shape[:-1]))  # (..., Hq, n)
        expected = np.where(vis.any(axis=-1), 1.0 - p_sink, 0.0)
        bound = max(vis.shape[-1], 1) * g.allowed_w  # each of m weights may be off by allowed_w
        err = np.abs(w.sum(axis=-1) - expected)
        if (err > bound).any():
            return Verdict(
                "failed",
                verdict.comparisons,
                (
                    f"[{attn_backend.name}] sdpa sink_share: weights do not leave the sink its share: "
                    f"{int((err > bound).sum())} rows' sums differ from 1 - exp(sink - lse) by more than "
                    f"{bound:.3e} (worst {err.max():.3e})\n  case: {case.describe()}"
                ),
            )
        return verdict

    judge("sdpa", "sink_share", case, body)


def _segment_order(ids: np.ndarray, rank: dict[int, int]) -> np.ndarray:
    """Positions of a 1-D id row reordered so whole segments follow ``rank``; padding (-1) last."""
    key = np.array([rank.get(int(i), len(rank)) for i in ids])
    return np.argsort(key, kind="stable")


@DTYPES
@with_corners
@given(data=st.data())
def test_segment_permutation(attn_backend, attn_device, judge, dtype, data):
    """Reordering whole segments (queries and keys together, with their ids) reorders the
    output rows the same way: packed sequences do not see each other."""
    case = data.draw(variant_cases(dtype, ("segments",), bases=("plain", "gqa")), label="case")
    q_ids, kv_ids = case.options["q_segment_ids"], case.options["kv_segment_ids"]
    if q_ids.ndim != 1:  # one order for the whole batch: the ids of batch element 0
        q_ids, kv_ids = q_ids.reshape(-1, q_ids.shape[-1])[0], kv_ids.reshape(-1, kv_ids.shape[-1])[0]
    present = sorted({int(i) for i in q_ids if i >= 0} | {int(i) for i in kv_ids if i >= 0})
    order = data.draw(st.permutations(present), label="segment_order")
    rank = {sid: r for r, sid in enumerate(order)}
    pq, pk = _segment_order(q_ids, rank), _segment_order(kv_ids, rank)
    options = {name: val for name, val in case.options.items() if name != "return_lse"}
    options["q_segment_ids"], options["kv_segment_ids"] = q_ids, kv_ids
    base = SDPACase(case.feature, case.dtype, case.q, case.k, case.v, options, case.tags, case.seed)
    moved = dict(options, q_segment_ids=q_ids[pq], kv_segment_ids=kv_ids[pk])
    tags = set(case.tags)
    tag_visibility(tags, case.q[..., pq, :], case.k[..., pk, :], case.v[..., pk, :], moved)
    permuted = SDPACase(
        case.feature,
        case.dtype,
        case.q[..., pq, :],
        case.k[..., pk, :],
        case.v[..., pk, :],
        moved,
        frozenset(tags),
        case.seed,
    )

    def body():
        out = attn_backend.to_numpy(call_sdpa(attn_backend, permuted, attn_device)).astype(np.float64)
        ref = attn_backend.to_numpy(call_sdpa(attn_backend, base, attn_device)).astype(np.float64)
        g = golden_for(base)
        err = np.abs(out - ref[..., pq, :])
        both_nan = np.isnan(out) & np.isnan(ref[..., pq, :])
        bad = ~both_nan & ~(err <= 2 * g.allowed_out)  # two results, each within allowed of golden
        if bad.any():
            return Verdict(
                "failed",
                message=(
                    f"[{attn_backend.name}] sdpa segment_permutation: reordering whole segments "
                    f"{order} did not reorder the output rows: {int(bad.sum())} elements differ by more "
                    f"than {2 * g.allowed_out:.3e} (worst {np.nanmax(np.where(bad, err, 0)):.3e})\n"
                    f"  case: {permuted.describe()}"
                ),
            )
        return Verdict("passed")

    judge("sdpa", "segment_permutation", permuted, body)


@DTYPES
@with_corners
@given(data=st.data())
def test_dropout_keep_all_rescales(attn_backend, attn_device, judge, dtype, data):
    """A dropout mask that keeps every weight still divides the weights by 1 - p: the output is
    the output without dropout, over 1 - p (the spec's inverted dropout)."""
    case = data.draw(variant_cases(dtype, ("dropout",)), label="case")
    keep_all = np.ones_like(case.options["dropout_mask"])
    case = case.with_options(dropout_mask=keep_all)

    judge.sdpa("dropout_keep_all", case)
