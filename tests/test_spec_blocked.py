"""sdpa_blocked, the tiled online-softmax golden: the same function as sdpa, in bounded memory."""

from __future__ import annotations

import importlib
import re
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spec_calls import gqa_call, gqa_strategies

from attnspec import SpecError
from attnspec.spec import sdpa
from attnspec.spec.bad_inputs import SDPA_BAD_INPUTS
from attnspec.spec.blocked import sdpa_blocked

rng = np.random.default_rng(4321)

# Both compute in float64 from the same inputs. They differ in rounding only: matmul blocking,
# scale applied to q instead of to q.k (one rounding of each q entry), exp(s - c) with another
# offset c, the product of rescalings, and the summation order of the denominator. Each weight is
# then off by at most ~(|s|max + log2(m) + a few) ulp relative, about 30 ulp = 7e-15 for the
# logits here (|s| <= ~10) and m <= 64; the output is a convex combination of rows of v. So
# 1e-13 (times max |v| for the output) leaves over a decade; the errors seen are ~1e-15.
RTOL = 1e-13


def qkv(batch=(2,), hq=4, hkv=2, n=13, m=17, dk=8, dv=3, dtype=np.float64):
    q = rng.standard_normal((*batch, hq, n, dk)).astype(dtype)
    k = rng.standard_normal((*batch, hkv, m, dk)).astype(dtype)
    v = rng.standard_normal((*batch, hkv, m, dv)).astype(dtype)
    return q, k, v


def assert_matches_sdpa(q, k, v, block_q, block_k, **kw):
    out, w = sdpa_blocked(q, k, v, return_weights=True, block_q=block_q, block_k=block_k, **kw)
    ref, ref_w = sdpa(q, k, v, return_weights=True, **kw)
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape)
    assert w.shape == ref_w.shape and w.dtype == ref_w.dtype, (w.shape, ref_w.shape)
    v_max = max(1.0, float(np.abs(v[np.isfinite(v)]).max(initial=0.0)))
    np.testing.assert_allclose(out, ref, rtol=0, atol=RTOL * v_max)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=RTOL)
    # the weights pass must not disturb the output
    alone = sdpa_blocked(q, k, v, block_q=block_q, block_k=block_k, **kw)
    np.testing.assert_array_equal(alone, out)
    return out, w


N, M = 13, 17
FEATURES = {
    "plain": {},
    "mask": {"mask": rng.random((2, 4, N, M)) < 0.6},
    "mask_broadcast": {"mask": rng.random((N, M)) < 0.5},
    "bias": {"bias": rng.standard_normal((4, N, M))},
    "bias_neg_inf": {"bias": np.where(rng.random((N, M)) < 0.3, -np.inf, rng.standard_normal((N, M)))},
    "causal_upper_left": {"causal": "upper_left"},
    "causal_lower_right": {"causal": "lower_right"},
    "window": {"window": (2, 3)},
    "window_zero": {"window": (0, 0)},
    "window_lower_right": {"window": (4, 0), "causal": "lower_right"},
    "kv_lengths": {"kv_lengths": np.array([9, 0])},
    "q_lengths": {"q_lengths": np.array([13, 6])},
    "scale": {"scale": 0.25},
    "everything": {
        "mask": rng.random((2, 1, N, M)) < 0.8,
        "bias": np.where(rng.random((N, M)) < 0.1, -np.inf, rng.standard_normal((N, M))),
        "causal": "lower_right",
        "window": (5, 1),
        "kv_lengths": np.array([15, 11]),
        "q_lengths": np.array([10, 13]),
        "scale": 0.7,
    },
}
# one-key tiles; sizes dividing neither n nor m; exactly n x m; larger than n and m
BLOCKS = [(1, 1), (4, 5), (5, 3), (13, 17), (64, 64)]


@pytest.mark.parametrize("blocks", BLOCKS, ids=lambda b: f"bq{b[0]}_bk{b[1]}")
@pytest.mark.parametrize("feature", FEATURES)
def test_equals_sdpa(feature, blocks):
    assert_matches_sdpa(*qkv(), *blocks, **FEATURES[feature])


@pytest.mark.parametrize(
    ("n", "m"), [(1, 1), (1, 9), (9, 1), (16, 16), (17, 33), (33, 5), (0, 5), (5, 0), (0, 0)]
)
@pytest.mark.parametrize(
    "rule", [{}, {"causal": "upper_left"}, {"causal": "lower_right"}, {"window": (1, 2)}]
)
def test_awkward_sizes(n, m, rule):
    # n > m under lower_right leaves whole leading blocks with no visible key
    assert_matches_sdpa(*qkv(n=n, m=m), 4, 8, **rule)


@settings(max_examples=60, deadline=None)
@given(
    **gqa_strategies(n=(0, 9), m=(0, 9)),
    block_q=st.integers(1, 6),
    block_k=st.integers(1, 6),
    with_lengths=st.booleans(),
    with_bias=st.booleans(),
)
def test_equals_sdpa_hypothesis(
    batch, hkv, group, n, m, dk, dv, causal, window, block_q, block_k, with_lengths, with_bias, seed
):
    r, q, k, v, mask = gqa_call(batch, hkv, group, n, m, dk, dv, seed)
    kw = {"mask": mask, "causal": causal, "window": window}
    if with_lengths:
        kw["q_lengths"] = r.integers(0, n + 1, batch)
        kw["kv_lengths"] = r.integers(0, m + 1, batch)
    if with_bias:
        kw["bias"] = np.where(r.random((n, m)) < 0.2, -np.inf, r.standard_normal((n, m)))
    assert_matches_sdpa(q, k, v, block_q, block_k, **kw)


@pytest.mark.parametrize(
    ("rule", "tiles"),
    [
        ({}, 16),
        ({"causal": "upper_left"}, 1 + 2 + 3 + 4),  # q block b sees key tiles 0..b
        ({"causal": "lower_right", "window": (3, 0)}, 1 + 2 + 2 + 2),  # keys i - 3 .. i
        ({"window": (1, 1)}, 4 * 2),  # rows i0..i0+3 see keys i0-1..i0+4: two tiles
        ({"q_lengths": 6, "kv_lengths": 5}, 2 * 2),  # two q blocks, keys 0..4
    ],
    ids=["none", "causal", "causal_window", "window", "lengths"],
)
def test_tiles_hidden_by_structure_are_skipped(monkeypatch, rule, tiles):
    from attnspec.spec import blocked

    calls = []
    logits = blocked._Head.logits
    monkeypatch.setattr(blocked._Head, "logits", lambda self, *a: calls.append(a[3]) or logits(self, *a))
    q, k, v = qkv(batch=(), hq=1, hkv=1, n=16, m=16)
    out = sdpa_blocked(q, k, v, block_q=4, block_k=4, **rule)
    assert len(calls) == tiles, [(c.start, c.stop) for c in calls]
    np.testing.assert_allclose(out, sdpa(q, k, v, **rule), rtol=0, atol=RTOL * np.abs(v).max())


def test_signature_is_sdpa_plus_block_sizes():
    import inspect

    blocked = inspect.signature(sdpa_blocked).parameters
    spec = inspect.signature(sdpa).parameters
    assert list(blocked) == [*spec, "block_q", "block_k"]
    assert all(blocked[name] == spec[name] for name in spec)


def test_gqa_batch_broadcast_and_dk_ne_dv():
    q = rng.standard_normal((3, 1, 6, 11, 5))  # (3, 1, Hq=6, n, dk)
    k = rng.standard_normal((1, 2, 2, 19, 5))  # (1, 2, Hkv=2, m, dk): G = 3
    v = rng.standard_normal((1, 2, 2, 19, 7))  # dv = 7 != dk
    out, _ = assert_matches_sdpa(q, k, v, 4, 6, causal="lower_right", mask=rng.random((6, 11, 19)) < 0.8)
    assert out.shape == (3, 2, 6, 11, 7)
    # head h reads kv head h // G: the same as repeating kv heads
    expanded = sdpa_blocked(
        q,
        np.repeat(k, 3, axis=-3),
        np.repeat(v, 3, axis=-3),
        causal="lower_right",
        mask=np.ones((6, 11, 19), bool),
        block_q=4,
        block_k=6,
    )
    np.testing.assert_array_equal(sdpa_blocked(q, k, v, causal="lower_right", block_q=4, block_k=6), expanded)


def test_rank_2():
    q, k, v = rng.standard_normal((9, 4)), rng.standard_normal((10, 4)), rng.standard_normal((10, 2))
    out, w = assert_matches_sdpa(q, k, v, 4, 3, causal="upper_left")
    assert out.shape == (9, 2) and w.shape == (9, 10)
    np.testing.assert_array_equal(
        out, sdpa_blocked(q[None], k[None], v[None], causal="upper_left", block_q=4, block_k=3)[0]
    )


def test_dv_zero_and_hq_zero():
    assert_matches_sdpa(*qkv(dv=0), 4, 4)
    out = sdpa_blocked(*qkv(hq=0, hkv=1))
    assert out.shape == (2, 0, 13, 3)


@pytest.mark.parametrize("logit_scale", [0.01, 10.0, 100.0], ids=lambda s: f"x{s:g}")
@pytest.mark.parametrize("shift", [0.0, -1000.0, 1000.0], ids=lambda s: f"shift{s:g}")
def test_large_and_far_from_zero_logits(logit_scale, shift):
    # The offset c is 0 while a row's max is within [-32, 32], and the max itself beyond it.
    # x10 and x100 cross between both regimes within a row; the shifts sit far outside.
    q, k, v = qkv(batch=(), hq=2, hkv=1, n=20, m=30, dk=4)
    q = q * logit_scale
    bias = np.full((20, 30), shift)
    out, w = sdpa_blocked(q, k, v, bias=bias, return_weights=True, block_q=7, block_k=4)
    ref, ref_w = sdpa(q, k, v, bias=bias, return_weights=True)
    # Both round each logit s to ~|s| eps absolute, and a weight's relative error follows its
    # logits' absolute error: so the tolerance grows with |s|max = scale * dk * |q| |k| + |shift|.
    s_max = 0.5 * 4 * float(np.abs(q).max() * np.abs(k).max()) + abs(shift)
    tol = max(RTOL, 30 * s_max * np.finfo(np.float64).eps)
    np.testing.assert_allclose(out, ref, rtol=0, atol=tol * np.abs(v).max())
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=tol)
    assert np.isfinite(out).all()


def test_large_logits_by_hand():
    # Logits 45000, -45000, 45000 in three one-key tiles: the rescaling runs at every step.
    q = np.full((1, 2, 4), 300.0)
    k = np.full((1, 3, 4), 300.0)
    k[0, 1] = -300.0
    v = np.array([[[1.0], [5.0], [3.0]]])
    out, w = sdpa_blocked(q, k, v, return_weights=True, block_k=1)
    np.testing.assert_array_equal(out, np.full((1, 2, 1), 2.0))
    np.testing.assert_array_equal(w[0, 0], [0.5, 0.0, 0.5])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_dtype_is_preserved(dtype):
    q, k, v = qkv(dtype=dtype)
    bias = rng.standard_normal((N, M)).astype(dtype)
    out, w = sdpa_blocked(q, k, v, bias=bias, return_weights=True, block_q=4, block_k=5)
    ref, ref_w = sdpa(q, k, v, bias=bias, return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    # Both round a float64 result once; values ~1e-15 apart can round to neighbours: <= 1 ulp.
    ulp = float(ml_dtypes.finfo(dtype).eps)
    for got, want in ((out, ref), (w, ref_w)):
        got, want = got.astype(np.float64), want.astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=ulp, atol=float(ml_dtypes.finfo(dtype).smallest_subnormal))


HIDDEN = {  # keys 10.. of m = 17 are hidden from every row, each time by a different rule
    "mask": {"mask": np.arange(M) < 10},
    "bias_neg_inf": {"bias": np.where(np.arange(M) < 10, 0.0, -np.inf)},
    "kv_lengths": {"kv_lengths": np.array([10, 10])},
}
BLOCK_PAIRS = pytest.mark.parametrize("blocks", [(4, 3), (13, 17)], ids=["tiled", "one_tile"])


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("hidden_by", HIDDEN)
@BLOCK_PAIRS
def test_hidden_non_finite_keys_never_reach_an_output(poison, hidden_by, blocks):
    q, k, v = qkv()
    kw = {**HIDDEN[hidden_by], "block_q": blocks[0], "block_k": blocks[1]}
    clean = sdpa_blocked(q, k, v, **kw)
    k2, v2 = k.copy(), v.copy()
    k2[..., 10:, :] = poison
    v2[..., 10:, :] = poison
    out, w = sdpa_blocked(q, k2, v2, return_weights=True, **kw)
    np.testing.assert_array_equal(out, clean)
    assert not w[..., 10:].any() and np.isfinite(w).all()


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@BLOCK_PAIRS
def test_causally_hidden_non_finite_keys_reach_only_later_rows(poison, blocks):
    # lower-right, n=13, m=17: row i sees j <= i + 4, so key 16 is hidden from rows 0..11, in
    # tiles skipped by structure (tiled) or masked inside the one tile
    q, k, v = qkv()
    kw = {"causal": "lower_right", "block_q": blocks[0], "block_k": blocks[1]}
    k2, v2 = k.copy(), v.copy()
    k2[..., 16, :] = v2[..., 16, :] = poison
    out = sdpa_blocked(q, k2, v2, **kw)
    np.testing.assert_array_equal(out[..., :12, :], sdpa_blocked(q, k, v, **kw)[..., :12, :])
    assert not np.isfinite(out[..., 12, :]).all()  # row 12 sees key 16


def test_padded_queries_are_zero_whatever_they_hold():
    q, k, v = qkv()
    q[..., 10:, :] = np.nan  # rows at or past q_lengths=10 see no key
    out = sdpa_blocked(q, k, v, q_lengths=10, block_q=4, block_k=5)
    assert not out[..., 10:, :].any()
    np.testing.assert_array_equal(out[..., :10, :], sdpa_blocked(q[..., :10, :], k, v, block_q=4, block_k=5))


def test_visible_non_finite_values_match_sdpa_exactly():
    # Every case of sum_j w_ij v_j with non-finite v: +inf, -inf, both (NaN), NaN, and an inf on
    # a visible key whose weight underflows to 0 (0 * inf = NaN), each in some columns only.
    q = np.array([[1.0], [1.0], [0.0], [1.0]])  # (n=4, dk=1)
    k = np.array([[0.0], [-1000.0], [1.0], [2.0], [0.5]])  # key 1's weight underflows for rows 0, 1, 3
    v = rng.standard_normal((5, 4))
    v[1, 0] = np.inf  # weight 0 for rows 0, 1, 3: NaN there; row 2 (q = 0) gives it weight 1/5
    v[2, 1] = np.inf
    v[3, 1] = -np.inf  # inf and -inf in column 1: NaN for rows that see both
    v[4, 2] = np.nan
    mask = np.ones((4, 5), bool)
    mask[3, 3] = False  # row 3: column 1 is +inf only
    mask[0, 4] = False  # row 0: column 2 is clean
    for blocks in [(1, 1), (2, 2), (4, 5)]:
        out = sdpa_blocked(q, k, v, mask=mask, scale=1.0, block_q=blocks[0], block_k=blocks[1])
        ref = sdpa(q, k, v, mask=mask, scale=1.0)
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        np.testing.assert_array_equal(np.isposinf(out), np.isposinf(ref))
        np.testing.assert_array_equal(np.isneginf(out), np.isneginf(ref))
        finite = np.isfinite(ref)
        np.testing.assert_allclose(out[finite], ref[finite], rtol=0, atol=RTOL * 3)
    assert np.isnan(ref[0, 0]) and ref[2, 0] == np.inf and np.isnan(ref[2, 1]) and ref[3, 1] == np.inf
    assert np.isfinite(ref[0, 2]) and np.isnan(ref[1, 2]) and np.isfinite(ref[:, 3]).all()


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_visible_non_finite_logit_makes_the_whole_row_nan(poison):
    # sdpa: a NaN or +inf row max makes every weight of the row NaN, hidden keys included, and
    # so the row's output. Causal with small blocks: the row's skipped tiles must follow too.
    q, k, v = qkv(n=12, m=12)
    k[0, 0, :, 0] = np.abs(k[0, 0, :, 0])  # positive, so that inf * k is +inf, not -inf
    q[1, :, :, 0] = np.abs(q[1, :, :, 0])
    q[0, 1, 5, 0] = poison
    k[1, 0, 2, 0] = poison  # seen (causal) by rows 2.. of batch 1, heads 0 and 1
    out, w = assert_matches_sdpa(q, k, v, 3, 4, causal="upper_left")
    assert np.isnan(w[0, 1, 5]).all() and np.isnan(out[0, 1, 5]).all()
    assert np.isnan(w[1, :2, 2:]).all() and np.isfinite(w[1, :2, :2]).all()
    assert np.isfinite(out[0, 1, :5]).all() and np.isfinite(out[0, 1, 6:]).all()


@pytest.mark.parametrize("name", ["block_q", "block_k"])
@pytest.mark.parametrize("value", [0, -3, 2.0, True, None, "4", np.int64(0)], ids=repr)
def test_bad_block_sizes(name, value):
    message = f"sdpa_blocked: {name}={value!r} must be an int >= 1"
    with pytest.raises(SpecError, match=re.escape(message)):
        sdpa_blocked(*qkv(), **{name: value})


def test_numpy_int_block_sizes_are_accepted():
    q, k, v = qkv()
    np.testing.assert_array_equal(
        sdpa_blocked(q, k, v, block_q=np.int64(4), block_k=np.uint8(5)),
        sdpa_blocked(q, k, v, block_q=4, block_k=5),
    )


@pytest.mark.parametrize("case", SDPA_BAD_INPUTS, ids=lambda c: c.id)
def test_bad_input_catalogue(case):
    (q, k, v), options = case.build()
    with pytest.raises(SpecError, match=case.match) as info:
        sdpa_blocked(q, k, v, **options)
    assert str(info.value).startswith("sdpa_blocked: ")


def test_peak_memory_is_far_below_n_by_m():
    n = m = 4096
    d = 64
    q, k, v = (rng.standard_normal((1, L, d)) for L in (n, m, m))
    tracemalloc.start()
    try:
        sdpa_blocked(q, k, v, causal="upper_left")  # default tiles: block_q=256, block_k=512
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # What sdpa_blocked allocates (float64, one head): the output n*dv*8 = 2 MiB, v with a column
    # of ones m*(dv+1)*8 = 2.1 MB (k is float64 and contiguous: used in place), one logits tile
    # 256*512*8 = 1 MiB, a bool hidden-key tile and its causal comparison (2 * 128 KiB), and
    # O(256 * (dk + dv)) of row state: about 5.5 MB. The (n, m) logits alone would be 134 MB;
    # allowing a tenth of that (13.4 MB) leaves room for allocator and NumPy temporaries.
    assert peak < n * m * 8 / 10, f"peak traced memory {peak / 2**20:.1f} MiB"


# -- sdpa's dispatch, and the row-blocked tolerance reference ----------------------------------


@pytest.mark.parametrize("return_weights", [False, True])
def test_sdpa_computes_tile_by_tile_from_the_threshold_on(monkeypatch, return_weights):
    sdpa_module = importlib.import_module("attnspec.spec.sdpa")  # the package exports the function

    calls = []
    real = sdpa_module.blocked_core
    monkeypatch.setattr(sdpa_module, "blocked_core", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = qkv(batch=(), hq=4, hkv=2, n=64, m=64, dk=4, dv=2)
    monkeypatch.setattr(sdpa_module, "BLOCKED_MIN_LOGITS", 4 * 64 * 64 + 1)
    below = sdpa(q, k, v, causal="upper_left", return_weights=return_weights)
    assert calls == []
    monkeypatch.setattr(sdpa_module, "BLOCKED_MIN_LOGITS", 4 * 64 * 64)  # batch * Hq * n * m
    at = sdpa(q, k, v, causal="upper_left", return_weights=return_weights)
    assert calls == [1]
    # the same bits as sdpa_blocked with the golden's tiles, and sdpa's values to rounding
    bq, bk = sdpa_module.GOLDEN_TILES
    direct = sdpa_blocked(q, k, v, causal="upper_left", return_weights=return_weights, block_q=bq, block_k=bk)
    for got, want, ref in zip(*(x if return_weights else (x,) for x in (at, direct, below))):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, ref, rtol=0, atol=RTOL * max(1.0, np.abs(v).max()))


def test_numpy_backend_sdpa_dispatches_like_the_golden(monkeypatch):
    from attnspec.backends import get

    sdpa_module = importlib.import_module("attnspec.spec.sdpa")
    monkeypatch.setattr(sdpa_module, "BLOCKED_MIN_LOGITS", 1)
    q, k, v = qkv()
    bq, bk = sdpa_module.GOLDEN_TILES
    np.testing.assert_array_equal(
        get("numpy").sdpa(q, k, v, window=(2, 1)),
        sdpa_blocked(q, k, v, window=(2, 1), block_q=bq, block_k=bk),
    )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "feature",
    ["plain", "everything", "causal_lower_right", "window_lower_right", "q_lengths", "mask_broadcast"],
)
def test_reference_in_row_blocks_equals_the_whole(monkeypatch, dtype, feature):
    # rows are independent: the tolerance's reference run block by block (the structural rules
    # folded into each block's mask) is the same computation, up to the summation order inside
    # the two matmuls, which BLAS may choose by the number of rows
    from attnspec.spec import tolerance
    from attnspec.spec.sdpa import plan_numpy

    np_dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    q, k, v = (x.astype(np_dt) for x in qkv())
    v[0, 1, 3, 0] = np.nan  # non-finite values take their own path
    kw = {name: (x.astype(np_dt) if name == "bias" else x) for name, x in FEATURES[feature].items()}
    args = (q, k, v, kw.get("mask"), kw.get("bias"))
    plan = plan_numpy(
        "sdpa",
        *args,
        kw.get("causal"),
        kw.get("window"),
        kw.get("scale"),
        kw.get("q_lengths"),
        kw.get("kv_lengths"),
    )
    whole = tolerance.reference_sdpa(plan, *args)
    vis = tolerance.visibility_view(plan, kw.get("mask"), kw.get("bias"))
    allowed = tolerance.sdpa_allowed(plan, q, k, v, kw.get("bias"), vis, 0.0)
    monkeypatch.setattr(tolerance, "ROW_BLOCK_LOGITS", 2 * 4 * M)  # blocks of 2 rows (batch 2, 4 heads)
    blocked = tolerance.reference_sdpa(plan, *args)
    assert blocked.dtype == whole.dtype and blocked.shape == whole.shape
    np.testing.assert_array_equal(np.isnan(blocked.astype(np.float64)), np.isnan(whole.astype(np.float64)))
    # Reordering the dk-term sums of q k^T moves a logit by <= dk eps L (L: the logit scale), so
    # a weight by <= 2 dk eps L relative; reordering the m-term sum of w v moves the output by
    # <= m eps V; one more rounding of the result: eps V (1 + m + 2 dk L), the floor's worst case.
    eps = float(ml_dtypes.finfo(np_dt).eps)
    V = float(np.nanmax(np.abs(v.astype(np.float64))))
    L = tolerance._logit_scale(plan, q, k, kw.get("bias"), vis)
    bound = eps * V * (1 + plan.m + 2 * plan.dk * L)
    np.testing.assert_allclose(blocked.astype(np.float64), whole.astype(np.float64), rtol=0, atol=bound)
    # the logit scale behind the tolerance floor is a max: exact in row blocks too
    assert tolerance.sdpa_allowed(plan, q, k, v, kw.get("bias"), vis, 0.0) == allowed
