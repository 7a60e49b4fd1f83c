"""The golden sdpa: agreement with the loop definition, each decision, and the bad-input catalogue."""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from spec_calls import every_option, gqa_call, gqa_strategies

from attnspec import SpecError
from attnspec.spec import (
    causal_mask,
    padding_mask,
    query_padding_mask,
    sdpa,
    sdpa_loops,
    sinusoidal_positions,
    window_mask,
)
from attnspec.spec.bad_inputs import SDPA_BAD_INPUTS

rng = np.random.default_rng(1234)

# Both implementations compute in float64 with the same max-subtracted softmax, differing only in
# summation order (BLAS matmul vs sequential sums over at most m = 9 terms of magnitude <= ~10).
# Rounding differences are then a few ulp of the largest term: 1e-12 relative leaves ~4 decades.
LOOPS_RTOL = 1e-12


def qkv(batch=(2,), hq=4, hkv=2, n=5, m=7, dk=8, dv=3, dtype=np.float64, scale=1.0):
    q = (rng.standard_normal((*batch, hq, n, dk)) * scale).astype(dtype)
    k = (rng.standard_normal((*batch, hkv, m, dk)) * scale).astype(dtype)
    v = rng.standard_normal((*batch, hkv, m, dv)).astype(dtype)
    return q, k, v


def assert_loops_agree(q, k, v, **kw):
    out, w = sdpa(q, k, v, return_weights=True, **kw)
    ref, ref_w = sdpa_loops(q, k, v, return_weights=True, **kw)
    assert out.shape == ref.shape and w.shape == ref_w.shape
    scale = max(1.0, float(np.abs(v).max(initial=0.0)))
    np.testing.assert_allclose(out, ref, rtol=0, atol=LOOPS_RTOL * scale)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=LOOPS_RTOL)
    return out, w


FEATURES = {
    "plain": {},
    "mask": {"mask": rng.random((2, 4, 5, 7)) < 0.6},
    "mask_broadcast": {"mask": rng.random((5, 7)) < 0.5},
    "bias": {"bias": rng.standard_normal((4, 5, 7))},
    "bias_neg_inf": {"bias": np.where(rng.random((5, 7)) < 0.3, -np.inf, rng.standard_normal((5, 7)))},
    "causal_upper_left": {"causal": "upper_left"},
    "causal_lower_right": {"causal": "lower_right"},
    "window": {"window": (1, 2)},
    "window_lower_right": {"window": (2, 0), "causal": "lower_right"},
    "kv_lengths": {"kv_lengths": np.array([3, 0])},
    "q_lengths": {"q_lengths": np.array([5, 2])},
    "scale": {"scale": 0.25},
    "everything": every_option(rng, 5, 7, window=(3, 1), q_lengths=[4, 5], kv_lengths=[6, 4]),
}


@pytest.mark.parametrize("feature", FEATURES)
def test_vectorized_equals_loops(feature):
    assert_loops_agree(*qkv(), **FEATURES[feature])


@settings(max_examples=60, deadline=None)
@given(**gqa_strategies())
def test_vectorized_equals_loops_hypothesis(batch, hkv, group, n, m, dk, dv, causal, window, seed):
    _, q, k, v, mask = gqa_call(batch, hkv, group, n, m, dk, dv, seed)
    assert_loops_agree(q, k, v, mask=mask, causal=causal, window=window)


def test_by_hand_single_key_and_uniform():
    # One visible key: its weight is exactly 1, so the output is exactly that value row.
    q = rng.standard_normal((3, 4))
    k = rng.standard_normal((1, 4))
    v = np.array([[2.5, -1.0]])
    np.testing.assert_array_equal(sdpa(q, k, v), np.repeat(v, 3, axis=0))
    # Zero queries give equal logits: uniform weights, output = mean of the values.
    v = rng.standard_normal((6, 2))
    out = sdpa(np.zeros((2, 4)), rng.standard_normal((6, 4)), v)
    np.testing.assert_allclose(out, np.broadcast_to(v.mean(axis=0), (2, 2)), rtol=1e-14)


def test_by_hand_two_keys():
    # logits: scale * q.k = (1/sqrt(2)) * [2, 0]; softmax over two keys is a logistic.
    q = np.array([[1.0, 1.0]])
    k = np.array([[1.0, 1.0], [0.0, 0.0]])
    v = np.array([[1.0], [0.0]])
    expected = 1 / (1 + math.exp(-2 / math.sqrt(2)))
    out, w = sdpa(q, k, v, return_weights=True)
    assert out[0, 0] == pytest.approx(expected, rel=1e-15)
    assert w[0].tolist() == pytest.approx([expected, 1 - expected], rel=1e-15)


def test_large_logits_do_not_overflow():
    q = np.full((1, 2, 4), 300.0)
    k = np.full((1, 3, 4), 300.0)
    k[0, 1] = -300.0
    v = np.array([[[1.0], [5.0], [3.0]]])
    out, w = sdpa(q, k, v, return_weights=True)
    assert np.isfinite(out).all()
    # keys 0 and 2 tie at logit 90000, key 1 is exp(-180000) ~ 0: output = (1 + 3) / 2.
    np.testing.assert_array_equal(out, np.full((1, 2, 1), 2.0))
    np.testing.assert_array_equal(w[0, 0], [0.5, 0.0, 0.5])


def test_weights_rows_sum_to_one_or_zero():
    q, k, v = qkv()
    mask = rng.random((2, 4, 5, 7)) < 0.3
    mask[0, 1, 2] = False  # a row with no visible key
    _, w = sdpa(q, k, v, mask=mask, return_weights=True)
    sums = w.sum(axis=-1)
    empty = ~mask.any(axis=-1)
    assert empty[0, 1, 2]
    np.testing.assert_allclose(sums[~empty], 1.0, rtol=1e-14)
    np.testing.assert_array_equal(sums[empty], 0.0)


def test_row_with_no_visible_key_is_zero():
    q, k, v = qkv(n=3, m=4)
    mask = np.ones((3, 4), bool)
    mask[1] = False
    out, w = sdpa(q, k, v, mask=mask, return_weights=True)
    assert np.all(out[..., 1, :] == 0) and np.all(w[..., 1, :] == 0)
    assert np.all(out[..., 0, :] != 0)
    # -inf bias on a whole row is the same decision; m = 0 makes every row empty.
    bias = np.where(mask, 0.0, -np.inf)
    np.testing.assert_array_equal(sdpa(q, k, v, bias=bias), out)
    q0, k0, v0 = qkv(n=3, m=0)
    out0, w0 = sdpa(q0, k0, v0, return_weights=True)
    assert out0.shape == (2, 4, 3, 3) and not out0.any() and w0.shape == (2, 4, 3, 0)


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("feature", ["mask", "causal", "kv_lengths", "bias_neg_inf"])
def test_masked_keys_are_absent(poison, feature):
    q, k, v = qkv(n=4, m=6)
    options = {
        "mask": {"mask": np.arange(6) < 4},
        "causal": {"causal": "upper_left"},
        "kv_lengths": {"kv_lengths": np.array([4, 4])},
        "bias_neg_inf": {"bias": np.where(np.arange(6) < 4, 0.0, -np.inf)},
    }[feature]
    clean = sdpa(q, k, v, **options)
    k2, v2 = k.copy(), v.copy()
    if feature == "causal":
        # key 5 is hidden from every row (n=4: rows see keys <= 3); key 3 only from rows 0..2
        k2[..., 5, :] = v2[..., 5, :] = poison
        k2[..., 3, :] = v2[..., 3, :] = poison
        out = sdpa(q, k2, v2, **options)
        np.testing.assert_array_equal(out[..., :3, :], clean[..., :3, :])
        assert not np.isfinite(out[..., 3, :]).all()  # row 3 sees key 3: the poison is visible there
    else:
        k2[..., 4:, :] = poison
        v2[..., 4:, :] = poison
        np.testing.assert_array_equal(sdpa(q, k2, v2, **options), clean)


def test_nan_in_visible_key_poisons_only_rows_that_see_it():
    q, k, v = qkv(n=4, m=4)
    v[..., 2, 0] = np.nan
    out = sdpa(q, k, v, causal="upper_left")
    assert np.isfinite(out[..., :2, :]).all()
    assert np.isnan(out[..., 2:, 0]).all() and np.isfinite(out[..., 2:, 1:]).all()


def test_causal_alignments_by_hand():
    # n=2 queries, m=4 keys. Upper-left: row i sees j <= i. Lower-right: j <= i + 2.
    assert causal_mask(2, 4, "upper_left").astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert causal_mask(2, 4, "lower_right").astype(int).tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    # n > m with lower-right: the first n - m rows see nothing.
    assert causal_mask(3, 2, "lower_right").astype(int).tolist() == [[0, 0], [1, 0], [1, 1]]
    assert window_mask(3, 5, 1, 0).astype(int).tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0]]
    assert window_mask(2, 4, 1, 0, "lower_right").astype(int).tolist() == [[0, 1, 1, 0], [0, 0, 1, 1]]


def test_window_matches_jax_local_window_convention():
    # JAX's local_window_size=(l, r) lets query i see keys [i - l, i + r]: our window with i' = i.
    # (Probed on jax 0.10.2: see spec/README.md.) Here the convention is checked on the mask itself.
    w = window_mask(4, 6, 2, 1)
    for i in range(4):
        assert np.flatnonzero(w[i]).tolist() == [j for j in range(6) if i - 2 <= j <= i + 1]


@pytest.mark.parametrize("align", ["upper_left", "lower_right"])
def test_mask_builders_equal_keywords(align):
    q, k, v = qkv(n=5, m=7)
    np.testing.assert_array_equal(sdpa(q, k, v, mask=causal_mask(5, 7, align)), sdpa(q, k, v, causal=align))
    both = causal_mask(5, 7, align) & window_mask(5, 7, 2, 1, align)
    np.testing.assert_array_equal(sdpa(q, k, v, mask=both), sdpa(q, k, v, causal=align, window=(2, 1)))
    lengths = np.array([3, 6])
    np.testing.assert_array_equal(
        sdpa(q, k, v, mask=padding_mask(lengths, 7)), sdpa(q, k, v, kv_lengths=lengths)
    )
    qlen = np.array([2, 5])
    np.testing.assert_array_equal(
        sdpa(q, k, v, mask=query_padding_mask(qlen, 5)), sdpa(q, k, v, q_lengths=qlen)
    )


def test_gqa_mapping_is_h_floor_div_group():
    q, k, v = qkv(hq=6, hkv=2)  # group = 3: heads 0-2 read kv 0, heads 3-5 read kv 1
    expanded = sdpa(q, np.repeat(k, 3, axis=-3), np.repeat(v, 3, axis=-3))
    np.testing.assert_array_equal(sdpa(q, k, v), expanded)
    tiled = sdpa(q, np.tile(k, (1, 3, 1, 1)), np.tile(v, (1, 3, 1, 1)))  # h % Hkv: a different map
    assert not np.allclose(sdpa(q, k, v), tiled)


def test_rank_2_and_batch_broadcast():
    q = rng.standard_normal((5, 8))
    k = rng.standard_normal((7, 8))
    v = rng.standard_normal((7, 3))
    out, w = sdpa(q, k, v, return_weights=True)
    assert out.shape == (5, 3) and w.shape == (5, 7)
    np.testing.assert_array_equal(out, sdpa(q[None], k[None], v[None])[0])
    qb = rng.standard_normal((3, 1, 5, 8))  # batch 3 against unbatched k, v
    outb = sdpa(qb, k[None], v[None])
    assert outb.shape == (3, 1, 5, 3)
    for b in range(3):
        np.testing.assert_array_equal(outb[b], sdpa(qb[b], k[None], v[None]))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64])
def test_dtype_is_preserved_and_result_is_rounded_golden(dtype):
    q, k, v = qkv(dtype=dtype)
    out, w = sdpa(q, k, v, return_weights=True)
    assert out.dtype == dtype and w.dtype == dtype
    # The golden computes in float64 from the (already rounded) inputs, then rounds once.
    ref = sdpa(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    np.testing.assert_array_equal(out, ref.astype(dtype))


def test_zero_sizes():
    q, k, v = qkv(n=0, m=3)
    assert sdpa(q, k, v).shape == (2, 4, 0, 3)
    q, k, v = qkv(n=2, m=3, dv=0)
    assert sdpa(q, k, v).shape == (2, 4, 2, 0)


def test_default_scale_is_inverse_sqrt_dk():
    q, k, v = qkv(dk=16)
    np.testing.assert_array_equal(sdpa(q, k, v), sdpa(q, k, v, scale=0.25))


@pytest.mark.parametrize("case", SDPA_BAD_INPUTS, ids=lambda c: c.id)
@pytest.mark.parametrize("fn", [sdpa, sdpa_loops], ids=["sdpa", "sdpa_loops"])
def test_bad_input_catalogue(case, fn):
    (q, k, v), options = case.build()
    with pytest.raises(SpecError, match=case.match) as info:
        fn(q, k, v, **options)
    assert str(info.value).startswith(f"{fn.__name__}: ")


def test_non_array_inputs_are_refused_not_coerced():
    with pytest.raises(SpecError, match=re.escape("sdpa: q must be a numpy.ndarray, got list")):
        sdpa([[1.0]], np.ones((1, 1)), np.ones((1, 1)))


def test_mask_builders_refuse_bad_input():
    with pytest.raises(SpecError, match="causal_mask: align=None"):
        causal_mask(2, 2, None)
    with pytest.raises(SpecError, match=r"causal_mask: n=-1 must be an int >= 0"):
        causal_mask(-1, 2)
    with pytest.raises(SpecError, match=r"padding_mask: lengths must lie in \[0, m=3\]"):
        padding_mask(np.array([4]), 3)
    with pytest.raises(SpecError, match=r"window_mask: window=\(1, -2\)"):
        window_mask(2, 2, 1, -2)


def test_sinusoidal_positions_by_hand():
    pe = sinusoidal_positions(3, 4)
    assert pe.shape == (3, 4)
    np.testing.assert_array_equal(pe[0], [0.0, 1.0, 0.0, 1.0])
    # position 1: frequencies 1 and 1/10000**(2/4) = 1/100
    np.testing.assert_allclose(pe[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], rtol=1e-15)
    assert sinusoidal_positions(2, 5).shape == (2, 5)
    with pytest.raises(SpecError, match="sinusoidal_positions: d=-1"):
        sinusoidal_positions(2, -1)
