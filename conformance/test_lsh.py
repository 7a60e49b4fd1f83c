"""Conformance properties of lsh_attention: every backend that implements it, every dtype.

Buckets are compared with the golden's except at low-margin positions, and outputs only on batch
elements without one (see `attnspec.conformance.lsh_cases` for both thresholds); the counts go
into each verdict's ``reason``. The exactness, dedup and causal properties check the spec's
statements against dense computations written here, not against the golden's code.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance import lsh_cases as lc
from attnspec.conformance.lsh_cases import LSH_BAD_INPUTS, LSHCase, lsh_cases
from attnspec.conformance.pytest_helpers import Verdict, bad_input_verdict, check_metadata, comparison_lines
from attnspec.spec.lsh import NORM_EPS, SELF_LOGIT, lsh_rotations
from attnspec.spec.tolerance import compare
from attnspec.spec.validate import FLOAT_DTYPES

DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES)
FN = "lsh_attention"


def call_lsh(backend, case: LSHCase, device, return_buckets: bool = False):
    x, v, options = lc.backend_inputs(backend, case, device)
    return backend.lsh_attention(x, v, return_buckets=return_buckets, **options)


def _fail(backend, prop: str, case: LSHCase, device, lines: list[str], comparisons=None) -> Verdict:
    snippet = "\n".join("    " + line for line in case.repro(backend.name, device).splitlines())
    text = "\n".join(
        [
            f"[{backend.name}] {FN} {prop}: {case.describe()} device={device}",
            *(f"  {line}" for line in lines),
            "  reproduce with:",
            snippet,
        ]
    )
    return Verdict("failed", comparisons or {}, text)


def _judge_against(backend, device, prop, case, out, expected, buckets, rep=None, golden_case=None):
    """Compare ``out`` with ``expected`` (float64) within the LSH tolerance of ``golden_case``
    (default ``case``) sorted by ``buckets``: on every batch element, or with a margins report
    ``rep`` on those it does not exclude (its text then goes with the verdict)."""
    allowed = lc.allowed(golden_case or case, expected, buckets)
    keep = ... if rep is None else ~rep.excluded
    margin_text = "" if rep is None else rep.text
    problems = check_metadata(backend, out, expected.shape, case.dtype, device)
    got = backend.to_numpy(out).astype(np.float64)
    if problems:
        return _fail(backend, prop, case, device, problems)
    c = compare(got[keep], expected[keep], allowed)
    if not c.ok:
        lines = [line.strip() for line in comparison_lines({"out": c})]
        return _fail(backend, prop, case, device, [*lines, margin_text], {"out": c})
    return Verdict("passed", {"out": c}, reason=margin_text)


@DTYPES
@given(data=st.data())
def test_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """Buckets equal the golden's (low-margin positions aside); outputs within the LSH tolerance."""
    case = data.draw(lsh_cases(dtype), label="case")

    def body():
        g_out, g_buckets = lc.golden(case)
        rep = lc.margins(case)
        out, buckets = call_lsh(attn_backend, case, attn_device, return_buckets=True)
        b = attn_backend.to_numpy(buckets)
        if tuple(b.shape) != g_buckets.shape:
            return _fail(
                attn_backend,
                "matches_golden",
                case,
                attn_device,
                [f"buckets.shape={tuple(b.shape)}, but should be {g_buckets.shape}"],
            )
        wrong = (b.astype(np.int64) != g_buckets) & ~rep.low
        if wrong.any():
            where = tuple(int(i) for i in np.argwhere(wrong)[0])
            return _fail(
                attn_backend,
                "matches_golden",
                case,
                attn_device,
                [
                    f"buckets: {int(wrong.sum())} of {wrong.size} differ from the golden's away from low "
                    f"margins; first at (*batch, round, position) {where}: {int(b[where])} vs {int(g_buckets[where])}",
                    rep.text,
                ],
            )
        return _judge_against(attn_backend, attn_device, "matches_golden", case, out, g_out, g_buckets, rep)

    judge(FN, "matches_golden", case, body)


def _dense_full(case: LSHCase) -> np.ndarray:
    """Full shared-QK attention, float64: keys x / max(|x|, eps), self only when alone, absent keys."""
    x, v = case.x.astype(np.float64), case.v.astype(np.float64)
    scale = case.options.get("scale") or 1.0
    L = x.shape[-2]
    k_hat = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), NORM_EPS)
    s = scale * x @ np.swapaxes(k_hat, -1, -2)  # (..., L, L)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    s = np.where(i == j, SELF_LOGIT, s)
    n = lc.lengths(case)[..., None, None]
    vis = (j < n) & (i < n)
    if case.options.get("causal"):
        vis = vis & (j <= i)
    s = np.where(vis, s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    den = e.sum(-1, keepdims=True)
    return (e / np.where(den == 0, 1, den)) @ v


@st.composite
def _exact_cases(draw, dtype: str) -> LSHCase:
    case = draw(lsh_cases(dtype, ("plain", "causal", "kv_lengths", "scale", "dedup", "batch_broadcast")))
    C = case.options["chunk_length"]
    rng = np.random.default_rng(case.seed)
    batch = case.x.shape[:-2]
    L, d, dv = 2 * C, case.x.shape[-1], case.v.shape[-1]
    x = rng.standard_normal((*batch, L, d)).astype(case.x.dtype)
    v = rng.standard_normal((*case.v.shape[:-2], L, dv)).astype(case.v.dtype)
    kind = draw(st.sampled_from(["random", "zeros", "huge"]))
    rot = lsh_rotations(case.seed % 2**31, d, 1, draw(st.sampled_from(lc.BUCKETS)))
    rot = {"random": rot, "zeros": np.zeros_like(rot), "huge": rot * np.float32(1e6)}[kind]
    opts = dict(case.options)
    if "kv_lengths" in opts:
        opts["kv_lengths"] = rng.integers(0, L + 1, size=np.broadcast_shapes(batch, v.shape[:-2]))
    return LSHCase(case.feature, dtype, x, v, rot, opts, case.tags | {f"rotations_{kind}"}, case.seed)


@DTYPES
@given(data=st.data())
def test_one_round_two_chunks_is_full_attention(attn_backend, attn_device, judge, dtype, data):
    """n_hashes = 1 and L = 2C: every window holds every key, so the result is full shared-QK
    attention with the same self rule, whatever the rotations (random, all zero, huge)."""
    case = data.draw(_exact_cases(dtype), label="case")

    def body():
        expected = _dense_full(case)
        _, g_buckets = lc.golden(case)
        out = call_lsh(attn_backend, case, attn_device)
        return _judge_against(attn_backend, attn_device, "one_round_is_full", case, out, expected, g_buckets)

    judge(FN, "one_round_is_full", case, body)


def _union_softmax(case: LSHCase, buckets: np.ndarray) -> np.ndarray:
    """Softmax over the union of each query's nh windows, each key once (float64, dense)."""
    counts = lc.window_counts(buckets, 2 * case.rotations.shape[2], case.options["chunk_length"])
    L = case.x.shape[-2]
    union = counts.sum(-3)[..., :L, :L] > 0  # (*batch, L, L)
    x, v = case.x.astype(np.float64), case.v.astype(np.float64)
    batch = union.shape[:-2]
    x = np.broadcast_to(x, (*batch, *x.shape[-2:]))
    scale = case.options.get("scale") or 1.0
    k_hat = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), NORM_EPS)
    s = scale * x @ np.swapaxes(k_hat, -1, -2)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    s = np.where(i == j, SELF_LOGIT, s)
    n = lc.lengths(case)[..., None, None]
    vis = union & (j < n) & (i < n)
    if case.options.get("causal"):
        vis &= j <= i
    s = np.where(vis, s, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    den = e.sum(-1, keepdims=True)
    return (e / np.where(den == 0, 1, den)) @ v


@DTYPES
@given(data=st.data())
def test_dedup_is_softmax_over_window_union(attn_backend, attn_device, judge, dtype, data):
    """dedup=True: the output is the softmax over the union of the query's windows, each key once."""
    case = data.draw(lsh_cases(dtype, ("plain", "causal", "hashes", "ragged", "kv_lengths")), label="case")
    case = case.with_options(dedup=True)

    def body():
        _, g_buckets = lc.golden(case)
        rep = lc.margins(case)
        expected = _union_softmax(case, g_buckets)
        out = call_lsh(attn_backend, case, attn_device)
        return _judge_against(attn_backend, attn_device, "dedup_union", case, out, expected, g_buckets, rep)

    judge(FN, "dedup_union", case, body)


@DTYPES
@given(data=st.data())
def test_causal_later_values_never_reach_earlier_rows(attn_backend, attn_device, judge, dtype, data):
    """causal=True: changing v at positions > t (even to NaN/inf) leaves rows <= t bit-identical.

    Later keys are absent for earlier rows and absent keys get weight exactly 0 (spec step 6),
    so their values add exact zeros. x is not perturbed: a later x moves chunk boundaries by
    its hash, so earlier rows may legitimately change (the spec page's causality caveat).
    """
    case = data.draw(lsh_cases(dtype, ("causal", "hashes", "ragged", "dedup", "combined")), label="case")
    case = case.with_options(causal=True)
    L = case.x.shape[-2]
    t = data.draw(st.integers(0, max(L - 2, 0)), label="t")
    poison = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4]), label="poison")
    v = case.v.copy()
    v[..., t + 1 :, :] = poison
    poisoned = LSHCase(
        case.feature,
        case.dtype,
        case.x,
        v,
        case.rotations,
        case.options,
        case.tags | {"masked_nonfinite"},
        case.seed,
    )

    def body():
        a = attn_backend.to_numpy(call_lsh(attn_backend, case, attn_device)).astype(np.float64)
        b = attn_backend.to_numpy(call_lsh(attn_backend, poisoned, attn_device)).astype(np.float64)
        a, b = a[..., : t + 1, :], b[..., : t + 1, :]
        if np.array_equal(a, b, equal_nan=True):
            return Verdict("passed")
        return _fail(
            attn_backend,
            "causal_values",
            poisoned,
            attn_device,
            [
                f"setting v[..., {t + 1}:, :] = {poison} changed rows <= {t}: max |diff| "
                f"{np.nanmax(np.abs(a - b), initial=0):.3e}, "
                f"{int((~((a == b) | (np.isnan(a) & np.isnan(b)))).sum())} elements differ"
            ],
        )

    judge(FN, "causal_values", poisoned, body)


@DTYPES
@given(data=st.data())
def test_padded_positions_are_absent(attn_backend, attn_device, judge, dtype, data):
    """x and v at positions >= kv_length, set to NaN/inf/1e4, change neither buckets nor output."""
    case = data.draw(lsh_cases(dtype, ("kv_lengths", "causal", "hashes", "dedup", "ragged")), label="case")
    batch = np.broadcast_shapes(case.x.shape[:-2], case.v.shape[:-2])
    L = case.x.shape[-2]
    rng = np.random.default_rng(case.seed)
    kv = rng.integers(0, L + 1, size=batch)
    clean = case.with_options(kv_lengths=kv)
    poison = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4]), label="poison")
    hidden = np.arange(L) >= kv[..., None]  # (*batch, L)
    x = np.where(hidden[..., None], poison, np.broadcast_to(case.x, (*batch, *case.x.shape[-2:])))
    v = np.where(hidden[..., None], poison, np.broadcast_to(case.v, (*batch, *case.v.shape[-2:])))
    poisoned = LSHCase(
        case.feature,
        dtype,
        x.astype(case.x.dtype),
        v.astype(case.v.dtype),
        case.rotations,
        clean.options,
        case.tags | {"kv_lengths", "masked_nonfinite"},
        case.seed,
    )

    def body():
        g_out, g_buckets = lc.golden(clean)
        rep = lc.margins(clean)
        out, buckets = call_lsh(attn_backend, poisoned, attn_device, return_buckets=True)
        padded = np.broadcast_to(hidden[..., None, :], g_buckets.shape)
        got_b = attn_backend.to_numpy(buckets).astype(np.int64)
        if not (got_b[padded] == 2 * case.rotations.shape[2]).all():
            return _fail(
                attn_backend,
                "padded_absent",
                poisoned,
                attn_device,
                ["buckets of padded positions are not n_buckets"],
            )
        return _judge_against(
            attn_backend,
            attn_device,
            "padded_absent",
            poisoned,
            out,
            g_out,
            g_buckets,
            rep,
            golden_case=clean,
        )

    judge(FN, "padded_absent", poisoned, body)


@DTYPES
@given(data=st.data())
def test_deterministic(attn_backend, attn_device, judge, dtype, data):
    """Two identical calls give bit-identical outputs and buckets."""
    case = data.draw(lsh_cases(dtype), label="case")

    def body():
        a, ab = call_lsh(attn_backend, case, attn_device, return_buckets=True)
        b, bb = call_lsh(attn_backend, case, attn_device, return_buckets=True)
        a, b = (attn_backend.to_numpy(r).astype(np.float64) for r in (a, b))
        same_b = np.array_equal(attn_backend.to_numpy(ab), attn_backend.to_numpy(bb))
        if np.array_equal(a, b, equal_nan=True) and same_b:
            return Verdict("passed")
        return _fail(
            attn_backend,
            "deterministic",
            case,
            attn_device,
            [
                f"two identical calls differ: max |a - b| = {np.nanmax(np.abs(a - b), initial=0):.3e}, "
                f"buckets equal: {same_b}"
            ],
        )

    judge(FN, "deterministic", case, body)


@pytest.mark.parametrize("bad", LSH_BAD_INPUTS, ids=lambda b: b.id)
def test_bad_input_raises_spec_error(attn_backend, attn_device, judge, bad):
    """Every entry of the LSH bad-input catalogue raises SpecError from the backend too."""
    (x, v, rot), options = bad.build()
    dtype = bad.dtypes[0]
    case = LSHCase("bad_input", dtype, x, v, rot, options, frozenset({"bad_input", bad.id}), 0)

    def body():
        conv = {
            k: attn_backend.asarray(a, device=attn_device) if isinstance(a, np.ndarray) else a
            for k, a in options.items()
        }
        args = [attn_backend.asarray(a, device=attn_device) for a in (x, v, rot)]
        return bad_input_verdict(
            attn_backend.name,
            FN,
            bad.id,
            bad.match,
            lambda: attn_backend.lsh_attention(args[0], args[1], rotations=args[2], **conv),
            named=f"{FN}:",
        )

    judge(FN, "bad_input", case, body, feature_case={"bad_input": True})
