"""The attention variants of issue #15: softcap, ALiBi, sinks, lse, segment ids, the
"lower_right_lengths" alignment and dropout, in the vectorized golden, the loop definition, the
tiled path and the vjp; hand-derived cases; the variants' bad-input catalogue."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec import SpecError
from attnspec.spec import (
    causal_mask,
    padding_mask,
    query_anchor,
    sdpa,
    sdpa_blocked,
    sdpa_loops,
    sdpa_vjp,
    segment_ids_from_cu_seqlens,
    segment_mask,
    window_mask,
)
from attnspec.spec.bad_inputs import SDPA_VARIANT_BAD_INPUTS
from attnspec.spec.sdpa import _identity, attention_core, plan_numpy
from attnspec.spec.validate import finish

rng = np.random.default_rng(1515)

# As in test_spec_sdpa: the vectorized golden and the loops both compute in float64, and differ
# only in summation order over <= 9 terms of size <= ~10 (tanh, |i' - j| and the sink add exactly
# rounded terms): a few ulp. 1e-12 (times max |v| for the output) leaves ~4 decades.
LOOPS_ATOL = 1e-12
# As in test_spec_blocked: the tiled path differs by its offset, rescalings and the scale folded
# into q, ~30 ulp of each weight for |s| <= ~10; 1e-13 leaves over a decade.
BLOCKED_ATOL = 1e-13

B, HQ, HKV, N, M = 2, 4, 2, 5, 7


def qkv(batch=(B,), hq=HQ, hkv=HKV, n=N, m=M, dk=8, dv=3, r=rng):
    q = r.standard_normal((*batch, hq, n, dk))
    k = r.standard_normal((*batch, hkv, m, dk))
    v = r.standard_normal((*batch, hkv, m, dv))
    return q, k, v


def _close(a, b, atol):
    """Equal where non-finite (same infinities, NaN for NaN), within atol elsewhere."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    fin = np.isfinite(a) & np.isfinite(b)
    np.testing.assert_array_equal(np.where(fin, 0, a), np.where(fin, 0, b))
    np.testing.assert_allclose(np.where(fin, a, 0), np.where(fin, b, 0), rtol=0, atol=atol)


def assert_loops_agree(q, k, v, **kw):
    out, w, lse = sdpa(q, k, v, return_weights=True, return_lse=True, **kw)
    ref, ref_w, ref_lse = sdpa_loops(q, k, v, return_weights=True, return_lse=True, **kw)
    v_max = max(1.0, float(np.abs(v).max(initial=0.0)))
    _close(out, ref, LOOPS_ATOL * v_max)
    _close(w, ref_w, LOOPS_ATOL)
    _close(lse, ref_lse, LOOPS_ATOL * max(1.0, float(np.abs(ref_lse[np.isfinite(ref_lse)]).max(initial=0))))
    assert lse.dtype == ref_lse.dtype
    return out, w, lse


def assert_blocked_agrees(q, k, v, block_q, block_k, **kw):
    got = sdpa_blocked(q, k, v, return_weights=True, return_lse=True, block_q=block_q, block_k=block_k, **kw)
    ref = sdpa(q, k, v, return_weights=True, return_lse=True, **kw)
    v_max = max(1.0, float(np.abs(v).max(initial=0.0)))
    for a, b, scale in zip(got, ref, (v_max, 1.0, 10.0)):
        assert a.dtype == b.dtype
        _close(a, b, BLOCKED_ATOL * scale)
    alone = sdpa_blocked(q, k, v, block_q=block_q, block_k=block_k, **kw)
    np.testing.assert_array_equal(alone, got[0])  # the weights pass must not disturb the output


def _keep(shape, r=rng, p=0.3):
    return r.random(shape) >= p


Q_IDS = np.array([[0, 0, 1, 1, -1], [0, 1, 1, 1, 1]])  # (B, n); -1 is padding
KV_IDS = np.array([[0, 0, 0, 1, 1, 1, 2], [0, 0, 1, 1, 1, 1, 1]])  # (B, m); id 2 has no query

FEATURES = {
    "softcap": {"softcap": 1.5},
    "softcap_small": {"softcap": 0.1},
    "alibi": {"alibi_slopes": rng.random(HQ)},
    "alibi_batched": {"alibi_slopes": rng.random((B, HQ))},
    "alibi_lower_right": {"alibi_slopes": rng.random(HQ), "causal": "lower_right"},
    "sinks": {"sinks": rng.standard_normal(HQ)},
    "sinks_large": {"sinks": np.array([5.0, -5.0, 40.0, -40.0])},
    "sinks_empty_rows": {"sinks": rng.standard_normal(HQ), "q_lengths": np.array([3, 0])},
    "segments": {"q_segment_ids": Q_IDS, "kv_segment_ids": KV_IDS},
    "segments_unbatched": {"q_segment_ids": Q_IDS[1], "kv_segment_ids": KV_IDS[1]},
    "lower_right_lengths": {
        "causal": "lower_right_lengths",
        "kv_lengths": np.array([4, 7]),
        "q_lengths": np.array([5, 2]),
    },
    "lower_right_lengths_plain": {"causal": "lower_right_lengths"},
    "lower_right_lengths_window": {
        "causal": "lower_right_lengths",
        "window": (2, 0),
        "kv_lengths": np.array([6, 3]),
    },
    "lower_right_lengths_segments": {
        "causal": "lower_right_lengths",
        "q_segment_ids": Q_IDS,
        "kv_segment_ids": KV_IDS,
        "kv_lengths": np.array([6, 7]),
    },
    "window_only_lengths": {"window": (1, 1), "causal": None, "kv_lengths": np.array([6, 3])},
    "dropout": {"dropout_mask": _keep((B, HQ, N, M)), "dropout_p": 0.3},
    "dropout_broadcast": {"dropout_mask": _keep((N, M)), "dropout_p": 0.5},
    "dropout_p_zero": {"dropout_mask": _keep((N, M)), "dropout_p": 0.0},
    "everything": {
        "softcap": 2.0,
        "alibi_slopes": rng.random((B, HQ)),
        "bias": rng.standard_normal((N, M)),
        "sinks": rng.standard_normal(HQ),
        "q_segment_ids": Q_IDS,
        "kv_segment_ids": KV_IDS,
        "causal": "lower_right_lengths",
        "window": (3, 1),
        "kv_lengths": np.array([6, 7]),
        "q_lengths": np.array([4, 5]),
        "mask": rng.random((B, 1, N, M)) < 0.9,
        "dropout_mask": _keep((B, HQ, N, M)),
        "dropout_p": 0.25,
        "scale": 0.7,
    },
}


@pytest.mark.parametrize("feature", FEATURES)
def test_vectorized_equals_loops(feature):
    assert_loops_agree(*qkv(), **FEATURES[feature])


@pytest.mark.parametrize("blocks", [(1, 1), (2, 3), (5, 7), (64, 64)], ids=lambda b: f"bq{b[0]}_bk{b[1]}")
@pytest.mark.parametrize("feature", FEATURES)
def test_blocked_equals_sdpa(feature, blocks):
    assert_blocked_agrees(*qkv(), *blocks, **FEATURES[feature])


@st.composite
def variant_cases(draw):
    """Shapes and every variant keyword, each present or not, with random values."""
    seed = draw(st.integers(0, 2**16))
    r = np.random.default_rng(seed)
    batch = draw(st.lists(st.integers(1, 2), max_size=1).map(tuple))
    hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    hq = hkv * group
    n, m = draw(st.integers(0, 5)), draw(st.integers(0, 6))
    q, k, v = qkv(batch, hq, hkv, n, m, draw(st.integers(1, 3)), draw(st.integers(0, 2)), r)
    kw = {
        "causal": draw(st.sampled_from([None, "upper_left", "lower_right", "lower_right_lengths"])),
        "window": draw(st.none() | st.tuples(st.integers(0, 3), st.integers(0, 3))),
    }
    if draw(st.booleans()):
        kw["softcap"] = draw(st.sampled_from([0.5, 1.0, 3.0]))
    if draw(st.booleans()):
        kw["alibi_slopes"] = r.random((*batch, hq)) if draw(st.booleans()) else r.random(hq)
    if draw(st.booleans()):
        kw["sinks"] = r.standard_normal(hq) * 2
    if draw(st.booleans()):
        kw["bias"] = np.where(r.random((n, m)) < 0.1, -np.inf, r.standard_normal((n, m)))
    if draw(st.booleans()):
        kw["q_segment_ids"] = r.integers(-1, 3, (*batch, n))
        kw["kv_segment_ids"] = np.sort(r.integers(-1, 3, (*batch, m)), axis=-1)
    if draw(st.booleans()):
        kw["q_lengths"] = r.integers(0, n + 1, batch)
        kw["kv_lengths"] = r.integers(0, m + 1, batch)
    if draw(st.booleans()):
        kw["dropout_mask"] = r.random((*batch, hq, n, m)) < 0.7
        kw["dropout_p"] = 0.3
    return q, k, v, kw, draw(st.integers(1, 4)), draw(st.integers(1, 4))


@settings(max_examples=60, deadline=None)
@given(case=variant_cases())
def test_combinations_hypothesis(case):
    q, k, v, kw, block_q, block_k = case
    assert_loops_agree(q, k, v, **kw)
    assert_blocked_agrees(q, k, v, block_q, block_k, **kw)


def test_large_inputs_dispatch_to_the_tiled_path_with_the_same_result():
    # 1 * 4 * 512 * 512 = 2**20 logits: sdpa takes the tiled core; compare with the vectorized one
    n = m = 512
    q, k, v = qkv(batch=(1,), hq=4, hkv=2, n=n, m=m, dk=4, dv=2)
    kw = {
        "softcap": 3.0,
        "alibi_slopes": rng.random(4) * 0.1,
        "sinks": rng.standard_normal(4),
        "q_segment_ids": np.repeat(np.arange(4), n // 4),
        "kv_segment_ids": np.repeat(np.arange(4), m // 4),
        "causal": "lower_right_lengths",
        "window": (40, 0),
        "dropout_mask": _keep((n, m)),
        "dropout_p": 0.1,
    }
    out, lse = sdpa(q, k, v, return_lse=True, **kw)
    keys = ("alibi_slopes", "sinks", "q_segment_ids", "kv_segment_ids", "dropout_mask")
    from attnspec.spec.validate import SDPAExtras

    extras = SDPAExtras(*(kw[name] for name in keys))
    plan = plan_numpy(
        "sdpa",
        q,
        k,
        v,
        None,
        None,
        kw["causal"],
        kw["window"],
        None,
        None,
        None,
        extras,
        kw["softcap"],
        kw["dropout_p"],
        True,
    )
    ref = attention_core(plan, q, k, v, None, None, np.float64, _identity, extras, with_lse=True)
    ref_out, ref_lse = finish(plan, ref[0], ref[1], q.dtype, False, ref[2])
    _close(out, ref_out, BLOCKED_ATOL * float(np.abs(v).max()))
    _close(lse, ref_lse, BLOCKED_ATOL * 10)


# -- hand-derived cases -------------------------------------------------------------------------


def _seen(w):
    """For each row of (n, m) weights, the keys with nonzero weight."""
    return [np.flatnonzero(row).tolist() for row in w]


def test_lower_right_lengths_measured_example():
    # n = 2, m = 6, kv_lengths = [4]: FlashAttention aligns on the actual lengths.
    q, k, v = qkv(batch=(1,), hq=1, hkv=1, n=2, m=6)
    kl = np.array([4])
    _, w = sdpa(q, k, v, causal="lower_right", kv_lengths=kl, return_weights=True)
    assert _seen(w[0, 0]) == [[0, 1, 2, 3], [0, 1, 2, 3]]  # j <= i + 6 - 2, and j < 4
    _, w = sdpa(q, k, v, causal="lower_right_lengths", kv_lengths=kl, return_weights=True)
    assert _seen(w[0, 0]) == [[0, 1, 2], [0, 1, 2, 3]]  # j <= i + 4 - 2
    assert query_anchor(2, 6, "lower_right_lengths", kv_lengths=kl).tolist() == [[2, 3]]
    built = causal_mask(2, 6, "lower_right_lengths", kv_lengths=kl) & padding_mask(kl, 6)
    np.testing.assert_array_equal(
        sdpa(q, k, v, mask=built), sdpa(q, k, v, causal="lower_right_lengths", kv_lengths=kl)
    )


def test_lower_right_lengths_packed_example():
    q_ids = np.array([0, 0, 0, 1, 1])
    kv_ids = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    q, k, v = qkv(batch=(), hq=1, hkv=1, n=5, m=10)
    _, w = sdpa(
        q, k, v, causal="lower_right_lengths", q_segment_ids=q_ids, kv_segment_ids=kv_ids, return_weights=True
    )
    # segment 0: 3 queries, 4 keys, i' = i + 1; segment 1: 2 queries, 6 keys, i' = i + 10 - 5
    assert _seen(w[0]) == [[0, 1], [0, 1, 2], [0, 1, 2, 3], [4, 5, 6, 7, 8], [4, 5, 6, 7, 8, 9]]
    built = causal_mask(
        5, 10, "lower_right_lengths", q_segment_ids=q_ids, kv_segment_ids=kv_ids
    ) & segment_mask(q_ids, kv_ids)
    np.testing.assert_array_equal(
        sdpa(q, k, v, mask=built),
        sdpa(q, k, v, causal="lower_right_lengths", q_segment_ids=q_ids, kv_segment_ids=kv_ids),
    )
    # the same with a window anchored on it: query 3 (i' = 8) and left = 1 sees keys 7, 8
    _, w = sdpa(
        q,
        k,
        v,
        causal="lower_right_lengths",
        window=(1, 0),
        q_segment_ids=q_ids,
        kv_segment_ids=kv_ids,
        return_weights=True,
    )
    assert _seen(w[0])[3] == [7, 8]
    wm = window_mask(5, 10, 1, 0, "lower_right_lengths", q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    assert wm.shape == (5, 10) and np.flatnonzero(wm[3]).tolist() == [7, 8]


def test_negative_segment_ids_are_padding_and_match_nothing():
    q, k, v = qkv(batch=(), hq=1, hkv=1, n=3, m=3)
    q_ids, kv_ids = np.array([-1, 0, -2]), np.array([-1, 0, -2])
    out, w = sdpa(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids, return_weights=True)
    assert _seen(w[0]) == [[], [1], []]  # -1 does not match -1
    np.testing.assert_array_equal(out[0, [0, 2]], 0.0)
    np.testing.assert_array_equal(out[0, 1], v[0, 1])  # one visible key: weight exactly 1


def test_segment_ids_from_cu_seqlens_by_hand():
    assert segment_ids_from_cu_seqlens(np.array([0, 3, 3, 5]), 7).tolist() == [0, 0, 0, 2, 2, -1, -1]
    assert segment_ids_from_cu_seqlens([0], 2).tolist() == [-1, -1]
    assert segment_ids_from_cu_seqlens(np.array([0, 2], np.int32), 2).dtype == np.int64
    for bad, match in [
        (np.array([1, 3]), r"cu_seqlens\[0\]=1 must be 0"),
        (np.array([0, 3, 2]), r"cu_seqlens=\[0, 3, 2\] must be non-decreasing"),
        (np.array([0, 9]), r"cu_seqlens\[-1\]=9 must be <= total=7"),
        (np.array([0.0, 2.0]), r"cu_seqlens must be a 1-D integer array, got dtype float64"),
        (np.array([[0, 2]]), r"cu_seqlens\.shape=\(1, 2\) must be \(S \+ 1,\)"),
        ("0,2", r"cu_seqlens must be a 1-D integer array, got str"),
    ]:
        with pytest.raises(SpecError, match="segment_ids_from_cu_seqlens: " + match):
            segment_ids_from_cu_seqlens(bad, 7)
    with pytest.raises(SpecError, match=r"segment_ids_from_cu_seqlens: total=-1 must be an int >= 0"):
        segment_ids_from_cu_seqlens(np.array([0]), -1)


def test_varlen_equals_separate_calls():
    # packed sequences of lengths (2, 3) queries over (3, 4) keys, each aligned lower-right
    cu_q, cu_k = np.array([0, 2, 5]), np.array([0, 3, 7])
    q, k, v = qkv(batch=(), hq=2, hkv=1, n=6, m=8)  # one query and one key of padding at the end
    out = sdpa(
        q,
        k,
        v,
        causal="lower_right_lengths",
        q_segment_ids=segment_ids_from_cu_seqlens(cu_q, 6),
        kv_segment_ids=segment_ids_from_cu_seqlens(cu_k, 8),
    )
    for s in range(2):
        qs, ks = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        alone = sdpa(q[:, qs], k[:, ks], v[:, ks], causal="lower_right")
        np.testing.assert_allclose(out[:, qs], alone, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(out[:, 5], 0.0)


def test_softcap_is_applied_before_bias():
    # scaled q.k = 4 for key 0 and 0 for key 1; bias (0, 1.5); softcap 1.
    # cap, then bias: logits (tanh 4, 1.5): key 1 wins. Bias, then cap: (tanh 4, tanh 1.5): key 0 wins.
    q = np.array([[2.0, 0.0]])
    k = np.array([[2.0 * math.sqrt(2.0), 0.0], [0.0, 1.0]])  # scale 1/sqrt(2): logits 4 and 0
    v = np.array([[1.0], [0.0]])
    bias = np.array([[0.0, 1.5]])
    out, w = sdpa(q, k, v, bias=bias, softcap=1.0, return_weights=True)
    w0 = 1.0 / (1.0 + math.exp(1.5 - math.tanh(4.0)))
    assert w[0].tolist() == pytest.approx([w0, 1.0 - w0], rel=1e-14)
    assert out[0, 0] == pytest.approx(w0, rel=1e-14) and w0 < 0.5
    other_order = 1.0 / (1.0 + math.exp(math.tanh(1.5) - math.tanh(4.0)))
    assert other_order > 0.5  # so the order is visible


def test_softcap_by_hand_and_large_logits_stay_finite():
    q = np.array([[1.0, 0.0]])
    k = np.array([[1e300, 0.0], [0.0, 0.0]])  # logits ~7e299 and 0: capped to 5 and 0
    v = np.array([[1.0], [0.0]])
    out, lse = sdpa(q, k, v, softcap=5.0, return_lse=True)
    assert out[0, 0] == pytest.approx(1.0 / (1.0 + math.exp(-5.0)), rel=1e-14)
    assert lse[0] == pytest.approx(math.log(math.exp(5.0) + 1.0), rel=1e-14)


def test_alibi_by_hand():
    # zero queries: every scaled logit is 0, so the logits are -slope * |i' - j| alone
    q = np.zeros((1, 2, 2))  # Hq = 1, n = 2
    k = rng.standard_normal((1, 3, 2))
    v = np.eye(3)[None]  # out = the weights
    slope = np.array([0.5])
    out = sdpa(q, k, v, alibi_slopes=slope)
    for i, dists in enumerate([[0, 1, 2], [1, 0, 1]]):  # i' = i
        e = [math.exp(-0.5 * d) for d in dists]
        np.testing.assert_allclose(out[0, i], [x / sum(e) for x in e], rtol=1e-14)
    out = sdpa(q, k, v, alibi_slopes=slope, causal="lower_right")  # i' = i + 1, keys j <= i'
    np.testing.assert_allclose(
        out[0, 0], [math.exp(-0.5) / (1 + math.exp(-0.5)), 1 / (1 + math.exp(-0.5)), 0], rtol=1e-14
    )


def test_alibi_matches_the_flash_causal_form():
    # FlashAttention's causal ALiBi adds slope * (j - (m - 1)): for visible j <= i' = i + m - n
    # it differs from -slope * (i' - j) by slope * (i' - m + 1), a constant per row.
    q, k, v = qkv(batch=(2,), hq=4, hkv=2, n=3, m=6)
    slopes = np.array([0.5, 0.25, 0.125, 0.0625])
    flash_bias = slopes[:, None, None] * (np.arange(6) - 5.0)  # (Hq, 1, m)
    np.testing.assert_allclose(
        sdpa(q, k, v, alibi_slopes=slopes, causal="lower_right"),
        sdpa(q, k, v, bias=np.broadcast_to(flash_bias, (4, 3, 6)), causal="lower_right"),
        rtol=0,
        atol=1e-14,
    )
    # without causality the FlashAttention form |i + m - n - j| is lower-right anchored, which
    # the spec expresses through an explicit bias (alibi with causal=None anchors at i' = i)
    flash = sdpa(q, k, v, bias=np.broadcast_to(flash_bias, (4, 3, 6)))
    assert not np.allclose(sdpa(q, k, v, alibi_slopes=slopes), flash)


def test_sinks_by_hand():
    # one key with logit s, a sink c: w = e^s / (e^s + e^c), lse = log(e^s + e^c)
    q = np.array([[[1.0, 1.0]]])  # (Hq=1, n=1, dk=2)
    k = np.array([[[1.0, 1.0]]])
    v = np.array([[[3.0]]])
    s, c = 2.0 / math.sqrt(2.0), 0.5
    out, w, lse = sdpa(q, k, v, sinks=np.array([c]), return_weights=True, return_lse=True)
    expected = math.exp(s) / (math.exp(s) + math.exp(c))
    assert w[0, 0, 0] == pytest.approx(expected, rel=1e-14)
    assert out[0, 0, 0] == pytest.approx(3.0 * expected, rel=1e-14)
    assert lse[0, 0] == pytest.approx(math.log(math.exp(s) + math.exp(c)), rel=1e-14)


def test_sink_with_no_visible_key():
    q, k, v = qkv(batch=(), hq=2, hkv=1, n=3, m=4)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    sinks = np.array([0.7, -3.0])
    for fn in (sdpa, sdpa_loops, sdpa_blocked):
        out, w, lse = fn(q, k, v, mask=mask, sinks=sinks, return_weights=True, return_lse=True)
        np.testing.assert_array_equal(out[:, 1], 0.0)
        np.testing.assert_array_equal(w[:, 1], 0.0)
        np.testing.assert_array_equal(lse[:, 1], sinks)
        assert np.all(w.sum(axis=-1)[:, [0, 2]] < 1)  # the sink takes its share
        # m = 0: every row is empty
        out0, lse0 = fn(q, k[:, :0], v[:, :0], sinks=sinks, return_lse=True)
        np.testing.assert_array_equal(out0, 0.0)
        np.testing.assert_array_equal(lse0, np.broadcast_to(sinks[:, None], (2, 3)))


def test_lse_by_hand_dtype_and_shape():
    q, k, v = qkv(batch=(), hq=1, hkv=1, n=3, m=4)
    logits = (q[0] @ k[0].T) / math.sqrt(8)
    expected = np.log(np.exp(logits).sum(axis=-1))
    _, lse = sdpa(q[0], k[0], v[0], return_lse=True)  # rank 2: lse (n,)
    assert lse.shape == (3,) and lse.dtype == np.float64
    np.testing.assert_allclose(lse, expected, rtol=1e-14)
    out, w, lse32 = sdpa(
        q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), return_weights=True, return_lse=True
    )
    assert lse32.shape == (1, 3) and lse32.dtype == np.float32 and out.dtype == w.dtype == np.float32
    for dt in (np.float16, "bfloat16"):
        import ml_dtypes

        dt = ml_dtypes.bfloat16 if dt == "bfloat16" else dt
        _, lse16 = sdpa(q.astype(dt), k.astype(dt), v.astype(dt), return_lse=True)
        assert lse16.dtype == np.float32
    mask = np.zeros((3, 4), bool)
    _, lse_empty = sdpa(q, k, v, mask=mask, return_lse=True)
    np.testing.assert_array_equal(lse_empty, -np.inf)


def test_dropout_by_hand():
    q, k, v = qkv(batch=(), hq=2, hkv=2, n=3, m=4)
    keep = _keep((2, 3, 4))
    p = 0.4
    out0, w0, lse0 = sdpa(q, k, v, return_weights=True, return_lse=True)
    out, w, lse = sdpa(q, k, v, dropout_mask=keep, dropout_p=p, return_weights=True, return_lse=True)
    np.testing.assert_allclose(w, w0 * keep / (1 - p), rtol=1e-15)
    np.testing.assert_allclose(out, w @ v, rtol=0, atol=1e-14)  # returned weights are post-dropout
    np.testing.assert_array_equal(lse, lse0)  # lse ignores dropout
    # p = 0 without a mask is no dropout at all
    np.testing.assert_array_equal(sdpa(q, k, v, dropout_p=0.0), out0)


# -- gradients ----------------------------------------------------------------------------------
# Central differences as in test_spec_grads (see fd_tolerance there): step H = 1e-6, error
# <= rounding (64 ulp of max|v| * sum|d_out| / H) + truncation (H^2/6 * 16 u^3 * ...). softcap
# only lowers the third derivative (|d^k tanh| <= 2 for k <= 3, divided by softcap^(k-1) >= 1 here),
# a sink is one more logit, ALiBi a constant shift, dropout a constant factor <= 1/(1-p) = 2 on v.
H = 1e-6
EPS = np.finfo(np.float64).eps


def _fd_tol(q, k, v, d_out, factor=2.0):
    u = max(1.0, np.abs(q).max() * np.abs(k).max())
    weight = max(1.0, np.abs(v).max()) * np.abs(d_out).sum() * factor
    return (64 * EPS / H + H**2 / 6 * 16 * u**3) * weight


def _check_fd(q, k, v, **kw):
    d_out = rng.standard_normal(sdpa(q, k, v, **kw).shape)
    names = ["q", "k", "v"] + [x for x in ("bias", "sinks") if x in kw]
    args = {"q": q, "k": k, "v": v, **{x: kw[x] for x in names[3:]}}
    rest = {key: val for key, val in kw.items() if key not in args}
    grads = sdpa_vjp(q, k, v, d_out, **{x: args[x] for x in names[3:]}, **rest)
    assert len(grads) == len(names)
    tol = _fd_tol(q, k, v, d_out)
    assert tol < 1e-5

    def loss(a):
        return float(np.sum(sdpa(a["q"], a["k"], a["v"], **{x: a[x] for x in names[3:]}, **rest) * d_out))

    for name, g in zip(names, grads):
        x = args[name]
        assert g.shape == x.shape and g.dtype == x.dtype, name
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            if not np.isfinite(x[idx]):
                continue
            plus, minus = dict(args), dict(args)
            plus[name], minus[name] = x.copy(), x.copy()
            plus[name][idx] += H
            minus[name][idx] -= H
            fd[idx] = (loss(plus) - loss(minus)) / (2 * H)
        err = float(np.abs(g - fd).max(initial=0))
        assert err <= tol, f"{name}: max |vjp - fd| = {err:.3g} > {tol:.3g}"
        assert np.abs(fd).max(initial=0) > 1e-3 or name == "sinks"  # the check is not vacuous
    return grads


def _small(**kw):
    return qkv(batch=(2,), hq=2, hkv=1, n=3, m=4, dk=3, dv=2, **kw)


GRAD_CASES = {
    "softcap": {"softcap": 1.2},
    "softcap_bias": {"softcap": 0.8, "bias": rng.standard_normal((2, 3, 4))},
    "alibi": {"alibi_slopes": rng.random((2, 2)), "causal": "lower_right"},
    "sinks": {"sinks": rng.standard_normal(2)},
    "sinks_empty_rows": {"sinks": rng.standard_normal(2), "q_lengths": np.array([3, 1])},
    "dropout": {"dropout_mask": _keep((2, 2, 3, 4)), "dropout_p": 0.5},
    "segments_lower_right_lengths": {
        "q_segment_ids": np.array([0, 0, 1]),
        "kv_segment_ids": np.array([0, 1, 1, 1]),
        "causal": "lower_right_lengths",
    },
    "everything": {
        "softcap": 1.5,
        "alibi_slopes": rng.random(2),
        "sinks": rng.standard_normal(2),
        "bias": rng.standard_normal((3, 4)),
        "q_segment_ids": np.array([[0, 0, 1], [0, 1, 1]]),
        "kv_segment_ids": np.array([0, 0, 1, 1]),
        "causal": "lower_right_lengths",
        "window": (1, 1),
        "dropout_mask": _keep((2, 2, 3, 4)),
        "dropout_p": 0.5,
    },
}


@pytest.mark.parametrize("case", GRAD_CASES)
def test_vjp_matches_finite_differences(case):
    _check_fd(*_small(), **GRAD_CASES[case])


def test_dsinks_by_hand_and_return_order():
    # dsink = -sum_i p_sink_i (dO_i . O_i), with p_sink = exp(sink - lse)
    q, k, v = _small()
    sinks, bias = rng.standard_normal(2), rng.standard_normal((3, 4))
    out, lse = sdpa(q, k, v, sinks=sinks, bias=bias, return_lse=True)
    d_out = rng.standard_normal(out.shape)
    grads = sdpa_vjp(q, k, v, d_out, sinks=sinks, bias=bias)
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (3, 4), (2,)]  # dq dk dv dbias dsinks
    expected = -(np.exp(sinks[:, None] - lse) * (d_out * out).sum(-1)).sum(axis=(0, 2))
    np.testing.assert_allclose(grads[-1], expected, rtol=1e-13)


def test_vjp_dropped_keys_still_get_dk_but_no_dv():
    # a key dropped from every row adds nothing to the output (dv = 0) but still takes part in
    # each row's softmax denominator, so its logit has a gradient (dk != 0)
    q, k, v = _small()
    keep = np.ones((2, 2, 3, 4), bool)
    keep[..., 2] = False
    _, dk, dv = sdpa_vjp(q, k, v, rng.standard_normal((2, 2, 3, 2)), dropout_mask=keep, dropout_p=0.5)
    assert np.all(dv[..., 2, :] == 0) and np.all(dk[..., 2, :] != 0)


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", SDPA_VARIANT_BAD_INPUTS, ids=lambda c: c.id)
@pytest.mark.parametrize("fn", ["sdpa", "sdpa_loops", "sdpa_blocked", "sdpa_vjp"])
def test_bad_input_catalogue(case, fn):
    (q, k, v), options = case.build()
    if fn == "sdpa_vjp" and "return_lse" in options:
        pytest.skip("sdpa_vjp differentiates the output alone: it has no return_lse")
    call = {
        "sdpa": sdpa,
        "sdpa_loops": sdpa_loops,
        "sdpa_blocked": sdpa_blocked,
        "sdpa_vjp": lambda q, k, v, **o: sdpa_vjp(q, k, v, np.zeros(1, q.dtype), **o),
    }[fn]
    with pytest.raises(SpecError, match=case.match) as info:
        call(q, k, v, **options)
    assert str(info.value).startswith(f"{fn}: ")
    name = case.id.split("_")[0]
    assert name in str(info.value) or case.id.startswith(("q_segment", "kv_segment", "causal"))


def test_mask_builders_refuse_bad_per_sequence_input():
    with pytest.raises(SpecError, match=r"causal_mask: lengths and segment ids only shape"):
        causal_mask(2, 3, "lower_right", kv_lengths=np.array([2]))
    with pytest.raises(SpecError, match=r"causal_mask: kv_lengths must lie in \[0, m=3\]"):
        causal_mask(2, 3, "lower_right_lengths", kv_lengths=np.array([4]))
    with pytest.raises(SpecError, match=r"window_mask: unexpected keyword 'lengths'"):
        window_mask(2, 3, 1, 1, "lower_right_lengths", lengths=np.array([2]))
    with pytest.raises(
        SpecError, match=r"segment_mask: q_segment_ids\.dtype=float64 must be an integer dtype"
    ):
        segment_mask(np.zeros(2), np.zeros(3, np.int32))
    with pytest.raises(
        SpecError, match=r"causal_mask: q_segment_ids and kv_segment_ids must be given together"
    ):
        causal_mask(2, 3, "lower_right_lengths", q_segment_ids=np.zeros(2, np.int32))


def test_plan_stays_hashable():
    q, k, v = qkv()
    plan = plan_numpy(
        "sdpa",
        q,
        k,
        v,
        None,
        None,
        "lower_right_lengths",
        None,
        None,
        None,
        None,
        softcap=2.0,
        dropout_p=0.0,
        return_lse=True,
    )
    assert hash(plan) == hash(plan) and plan.softcap == 2.0 and plan.return_lse
    assert plan.lse_shape == (B, HQ, N) and plan.lse_dtype == "float64"


def test_tolerance_reference_runs_the_variants_through_rnd():
    # In float64 the reference is the golden's algorithm with identity rounding: equal results.
    # In float16 every stored step is rounded, so it differs from the golden by a few float16 ulp
    # of the output (|out| <= max|v| ~ 3), and not at all in structure (hidden keys, empty rows).
    from attnspec.spec.tolerance import reference_sdpa
    from attnspec.spec.validate import SDPAExtras

    kw = FEATURES["everything"]
    keys = ("alibi_slopes", "sinks", "q_segment_ids", "kv_segment_ids", "dropout_mask")
    for dtype, atol in ((np.float64, 0.0), (np.float16, 50 * np.finfo(np.float16).eps)):
        q, k, v = (x.astype(dtype) for x in qkv())
        extras = SDPAExtras(*(kw[name] if name != "sinks" else kw[name].astype(dtype) for name in keys))
        bias = kw["bias"].astype(dtype)
        plan = plan_numpy(
            "sdpa",
            q,
            k,
            v,
            kw["mask"],
            bias,
            kw["causal"],
            kw["window"],
            kw["scale"],
            None,
            kw["kv_lengths"],
            extras,
            kw["softcap"],
            kw["dropout_p"],
            True,
        )
        ref_out, ref_lse = reference_sdpa(plan, q, k, v, kw["mask"], bias, False, extras)
        golden = sdpa(
            q, k, v, **{**kw, "bias": bias, "sinks": extras.sinks, "q_lengths": None}, return_lse=True
        )
        assert ref_out.dtype == golden[0].dtype and ref_lse.dtype == golden[1].dtype
        _close(ref_out, golden[0], atol * 4)
        _close(ref_lse, golden[1], atol * 8)
