"""The golden LSH attention: agreement with the loop definition, its exact properties, bad input."""

from __future__ import annotations

import re
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec import SpecError
from attnspec.spec._lsh_loops import _lsh_attention_loops
from attnspec.spec.lsh import (
    NORM_EPS,
    SELF_LOGIT,
    lsh_attention,
    lsh_bucket_margins,
    lsh_buckets,
    lsh_rotations,
)

# Both implementations compute in float64 with max-subtracted softmaxes, differing only in
# summation order (BLAS vs sequential sums over at most nh * 2C = 32 terms of magnitude <= ~10).
# Rounding differences are a few ulp of the largest term: 1e-12 leaves ~3 decades of headroom.
# The same bound serves the properties below, whose references are float64 NumPy too.
RTOL = 1e-12


def inputs(seed, batch=(), L=8, d=5, dv=3, magnitude=1.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*batch, L, d)) * magnitude
    v = rng.standard_normal((*batch, L, dv))
    return x, v


def assert_close(out, ref, v):
    assert out.shape == ref.shape, f"out.shape={out.shape}, but should be {ref.shape}"
    atol = RTOL * max(1.0, float(np.abs(v).max(initial=0.0)))
    np.testing.assert_allclose(out, ref, rtol=0, atol=atol)


def masked_attention(x, v, visible, scale=1.0):
    """Dense shared-QK attention of one element (x (L, d)), self logit replaced: the reference."""
    k_hat = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), NORM_EPS)
    s = scale * (x @ k_hat.T)  # (L, L)
    np.fill_diagonal(s, SELF_LOGIT)
    s = np.where(visible, s, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=-1, keepdims=True)
    return (e / np.where(total == 0, 1, total)) @ v


def base_visibility(L, causal, kv):
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    vis = (j < kv) & (i < kv)
    return vis & (j <= i) if causal else vis


def window_union(x, rotations, C, kv):
    """(L, L) bool: key j lies in some window of query i. Steps 3, 5 and 9 written out again."""
    L = x.shape[0]
    nh, nb = rotations.shape[1], 2 * rotations.shape[2]
    Lp = -(-L // C) * C
    raw = lsh_buckets(x, rotations)  # (nh, L)
    flat = []
    for r in range(nh):
        flat += sorted(range(Lp), key=lambda t: (raw[r, t] if t < kv else nb, t))
    nc = len(flat) // C
    union = np.zeros((L, L), bool)
    for f, i in enumerate(flat):
        c = f // C
        for j in flat[((c - 1) % nc) * C : ((c - 1) % nc + 1) * C] + flat[c * C : (c + 1) * C]:
            if i < L and j < L:
                union[i, j] = True
    return union


# ---------------------------------------------------------------- vectorized == loops

CONFIGS = {
    "plain": dict(L=8, C=2, nh=1, nb=4),
    "two_rounds": dict(L=8, C=2, nh=2, nb=4),
    "four_rounds": dict(L=9, C=3, nh=4, nb=8),
    "causal": dict(L=10, C=2, nh=3, nb=4, causal=True),
    "kv_lengths": dict(batch=(3,), L=8, C=2, nh=2, nb=4, kv_lengths=np.array([8, 5, 0])),
    "dedup": dict(L=8, C=2, nh=3, nb=4, dedup=True),
    "L_not_multiple": dict(L=7, C=3, nh=2, nb=6),
    "chunk_longer_than_L": dict(L=3, C=4, nh=2, nb=2),
    "one_chunk_per_round": dict(L=4, C=4, nh=3, nb=4, dedup=True),
    "two_buckets": dict(L=6, C=1, nh=2, nb=2, causal=True),
    "batch_dims": dict(batch=(2, 3), L=6, C=2, nh=2, nb=4, kv_lengths=np.array([[6], [3]])),
    "scale": dict(L=8, C=2, nh=2, nb=4, scale=0.5),
    "everything": dict(
        batch=(2, 2),
        L=11,
        C=3,
        nh=4,
        nb=6,
        causal=True,
        dedup=True,
        scale=2.0,
        kv_lengths=np.array([11, 7])[:, None],
    ),
}


def run_both(cfg, seed=0, magnitude=1.0):
    cfg = dict(cfg)
    batch, L, C, nh, nb = cfg.pop("batch", ()), cfg.pop("L"), cfg.pop("C"), cfg.pop("nh"), cfg.pop("nb")
    x, v = inputs(seed, batch, L, magnitude=magnitude)
    kw = dict(rotations=lsh_rotations(seed, x.shape[-1], nh, nb), chunk_length=C, return_buckets=True, **cfg)
    out, buckets = lsh_attention(x, v, **kw)
    ref, ref_buckets = _lsh_attention_loops(x, v, **kw)
    np.testing.assert_array_equal(buckets, ref_buckets)
    assert_close(out, ref, v)
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_vectorized_equals_loops(name):
    run_both(CONFIGS[name])


@given(
    L=st.integers(1, 10),
    C=st.integers(1, 4),
    nh=st.integers(1, 4),
    half=st.integers(1, 3),
    causal=st.booleans(),
    dedup=st.booleans(),
    kv=st.integers(0, 10),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_vectorized_equals_loops_random(L, C, nh, half, causal, dedup, kv, seed):
    if nh * -(-L // C) < 2:
        C = L if nh > 1 else max(1, L - 1)
    if nh * -(-L // C) < 2:
        return  # L = 1 with one round has no valid chunking
    run_both(
        dict(
            batch=(2,),
            L=L,
            C=C,
            nh=nh,
            nb=2 * half,
            causal=causal,
            dedup=dedup,
            kv_lengths=np.array([min(kv, L), L]),
        ),
        seed=seed,
    )


# ---------------------------------------------------------------- exact properties


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_two_chunks_equal_full_attention(data):
    """One round with L in (C, 2C], or two rounds with L <= C: every window holds every key."""
    draw = data.draw
    C = draw(st.integers(1, 4))
    nh = draw(st.sampled_from([1, 2]))
    L = draw(st.integers(C + 1, 2 * C) if nh == 1 else st.integers(1, C))
    d, dv, nb = draw(st.integers(1, 5)), draw(st.integers(1, 3)), draw(st.sampled_from([2, 4, 8]))
    causal, dedup, kv = draw(st.booleans()), draw(st.booleans()), draw(st.integers(0, L))
    scale = draw(st.sampled_from([None, 0.5, 3.0]))
    x, v = inputs(draw(st.integers(0, 2**32 - 1)), (), L, d, dv, draw(st.sampled_from([1e-3, 1.0, 30.0])))
    # any rotations: a wild scale included, since the buckets must not matter here
    scale = np.float32(draw(st.sampled_from([1e-3, 1, 1e3])))
    rotations = lsh_rotations(draw(st.integers(0, 2**16)), d, nh, nb) * scale
    out = lsh_attention(
        x, v, rotations=rotations, chunk_length=C, causal=causal, kv_lengths=kv, dedup=dedup, scale=scale
    )
    ref = masked_attention(x, v, base_visibility(L, causal, kv), 1.0 if scale is None else scale)
    assert_close(out, ref, v)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(L=8, C=2, nh=2, nb=4, causal=False, kv=8),
        dict(L=10, C=2, nh=3, nb=4, causal=True, kv=10),
        dict(L=11, C=3, nh=4, nb=6, causal=False, kv=7),
        dict(L=6, C=4, nh=3, nb=2, causal=True, kv=6),
        dict(L=12, C=1, nh=4, nb=8, causal=True, kv=9),
    ],
    ids=str,
)
def test_dedup_is_softmax_over_union_of_windows(cfg):
    x, v = inputs(5, (), cfg["L"])
    rotations = lsh_rotations(5, x.shape[-1], cfg["nh"], cfg["nb"])
    kw = dict(rotations=rotations, chunk_length=cfg["C"], causal=cfg["causal"], kv_lengths=cfg["kv"])
    union = window_union(x, rotations, cfg["C"], cfg["kv"])
    ref = masked_attention(x, v, union & base_visibility(cfg["L"], cfg["causal"], cfg["kv"]))
    assert_close(lsh_attention(x, v, dedup=True, **kw), ref, v)
    # the property is not vacuous: without dedup the duplicates count twice and the result moves
    assert np.abs(lsh_attention(x, v, dedup=False, **kw) - ref).max() > 1e-6


def test_dedup_is_a_no_op_with_one_round():
    x, v = inputs(2, (2,), 9)
    kw = dict(rotations=lsh_rotations(2, 5, 1, 4), chunk_length=2, causal=True)
    np.testing.assert_array_equal(lsh_attention(x, v, dedup=True, **kw), lsh_attention(x, v, **kw))


@pytest.mark.parametrize("dedup", [False, True])
def test_causal_later_values_and_keys_never_reach_earlier_rows(dedup):
    x, v = inputs(3, (2,), 12)
    kw = dict(
        rotations=lsh_rotations(3, 5, 3, 4), chunk_length=2, causal=True, dedup=dedup, return_buckets=True
    )
    out, buckets = lsh_attention(x, v, **kw)
    for p in range(11):
        x2, v2 = x.copy(), v.copy()
        x2[:, p + 1 :] *= 4.0  # a power of two: later keys change, later buckets and windows do not
        v2[:, p + 1 :] = np.nan
        out2, buckets2 = lsh_attention(x2, v2, **kw)
        np.testing.assert_array_equal(buckets2, buckets)
        np.testing.assert_allclose(out2[:, : p + 1], out[:, : p + 1], rtol=0, atol=1e-14)
        assert np.isnan(out2[:, p + 1 :]).all()  # a visible NaN (each row's own value) propagates


def test_causal_hash_order_of_later_positions_can_move_earlier_windows():
    """The documented caveat: later *hashes* move chunk boundaries (Reformer's design)."""
    x, v = inputs(0, (), 16, 4)
    kw = dict(rotations=lsh_rotations(3, 4, 1, 8), chunk_length=2, causal=True, return_buckets=True)
    out, buckets = lsh_attention(x, v, **kw)
    x2 = x.copy()
    x2[15] = -x2[15]
    out2, buckets2 = lsh_attention(x2, v, **kw)
    assert (buckets2[:, :15] == buckets[:, :15]).all() and buckets2[0, 15] != buckets[0, 15]
    assert np.abs(out2[:15] - out[:15]).max() > 0.1


def test_self_only_when_nothing_else_is_visible():
    x, v = inputs(4, (3,), 8)
    kw = dict(rotations=lsh_rotations(4, 5, 2, 4), chunk_length=2)
    # causal: position 0 sees only itself, in every round
    np.testing.assert_allclose(lsh_attention(x, v, causal=True, **kw)[:, 0], v[:, 0], rtol=0, atol=1e-15)
    # kv_length 1: the one unpadded query sees only itself
    np.testing.assert_allclose(lsh_attention(x, v, kv_lengths=1, **kw)[:, 0], v[:, 0], rtol=0, atol=1e-15)
    # one round, L = 2C: with other keys visible the self weight is exactly 0 in float64
    kw1 = dict(rotations=lsh_rotations(4, 5, 1, 4), chunk_length=4)
    no_self = ~np.eye(8, dtype=bool)
    for b in range(3):
        assert_close(lsh_attention(x[b], v[b], **kw1), masked_attention(x[b], v[b], no_self), v)


def test_padded_content_never_reaches_unpadded_rows():
    x, v = inputs(6, (3,), 10)
    kv = np.array([10, 6, 3])
    kw = dict(
        rotations=lsh_rotations(6, 5, 3, 4), chunk_length=2, kv_lengths=kv, dedup=True, return_buckets=True
    )
    out, buckets = lsh_attention(x, v, **kw)
    x2, v2 = x.copy(), v.copy()
    for b, n in enumerate(kv):
        x2[b, n:] = [np.nan, np.inf, -np.inf, 1e300, 0.0]
        v2[b, n:] = np.nan
        assert (out[b, n:] == 0).all()  # padded query rows produce exactly 0
        assert (buckets[b, :, n:] == 4).all()  # and sort after every real bucket
    out2, buckets2 = lsh_attention(x2, v2, **kw)
    np.testing.assert_array_equal(buckets2, buckets)
    np.testing.assert_array_equal(out2, out)


def test_kv_length_zero_gives_zeros():
    x, v = inputs(1, (), 6)
    out = lsh_attention(x, v, rotations=lsh_rotations(1, 5, 2, 2), chunk_length=3, kv_lengths=0)
    assert (out == 0).all()


def test_scale_multiplies_the_logits():
    x, v = inputs(7, (2,), 8)
    kw = dict(rotations=lsh_rotations(7, 5, 2, 4), chunk_length=2, causal=True)
    # default 1: the keys are unit length, so no 1/sqrt(d)
    np.testing.assert_array_equal(lsh_attention(x, v, **kw), lsh_attention(x, v, scale=1.0, **kw))
    # 2x leaves buckets and unit keys bit-identical and doubles every logit exactly
    np.testing.assert_array_equal(lsh_attention(x, v, scale=2.0, **kw), lsh_attention(2 * x, v, **kw))


# ---------------------------------------------------------------- rotations and buckets


def test_rotations_are_deterministic_float32_standard_normal():
    r = lsh_rotations(42, 6, 3, 8)
    assert r.dtype == np.float32 and r.shape == (6, 3, 4)
    np.testing.assert_array_equal(r, lsh_rotations(42, 6, 3, 8))
    np.testing.assert_array_equal(r, np.random.default_rng(42).standard_normal((6, 3, 4), dtype=np.float32))
    assert not np.array_equal(r, lsh_rotations(43, 6, 3, 8))


def test_buckets_of_a_seeded_example():
    x, _ = inputs(8, (2, 3), 10, 6)
    rotations = lsh_rotations(8, 6, 3, 8)
    buckets = lsh_buckets(x, rotations)
    assert buckets.dtype == np.int64 and buckets.shape == (2, 3, 3, 10)
    assert buckets.min() >= 0 and buckets.max() < 8
    p = np.einsum("...ld,dhk->...hlk", x, rotations.astype(np.float64))  # (2, 3, nh, L, K)
    np.testing.assert_array_equal(buckets, np.argmax(np.concatenate([p, -p], axis=-1), axis=-1))
    # one hash serves queries and keys: the buckets lsh_attention sorts by are these, n_buckets
    # marking padded positions
    _, used = lsh_attention(
        x,
        x[..., :2],
        rotations=rotations,
        chunk_length=2,
        kv_lengths=np.array([10, 7, 4]),
        return_buckets=True,
    )
    padded = np.arange(10) >= np.array([10, 7, 4])[:, None, None]  # (3, 1, L)
    np.testing.assert_array_equal(used, np.where(padded, 8, buckets))


def test_bucket_symmetries_and_margins():
    x, _ = inputs(9, (4,), 12, 5)
    rotations = lsh_rotations(9, 5, 2, 6)
    buckets, margins = lsh_buckets(x, rotations), lsh_bucket_margins(x, rotations)
    assert margins.shape == buckets.shape and (margins > 0).all()
    np.testing.assert_array_equal(lsh_buckets(8 * x, rotations), buckets)
    np.testing.assert_array_equal(lsh_buckets(-x, rotations), (buckets + 3) % 6)
    p = np.einsum("...ld,dhk->...hlk", x, rotations.astype(np.float64))
    top2 = np.sort(np.concatenate([p, -p], axis=-1), axis=-1)[..., -2:]
    # einsum and matmul sum in different orders: a few ulp of sum |x_i R_ik| <= ~10 apart
    np.testing.assert_allclose(margins, top2[..., 1] - top2[..., 0], rtol=0, atol=1e-14)
    # two buckets: the margin is |p - (-p)|
    r2 = lsh_rotations(9, 5, 1, 2)
    p2 = (x @ r2.astype(np.float64)[:, 0, :])[..., 0]  # (4, L)
    np.testing.assert_allclose(lsh_bucket_margins(x, r2)[:, 0], 2 * np.abs(p2), rtol=1e-15)
    # a zero vector ties everywhere: first index, margin 0
    zero = np.zeros((3, 5))
    assert (lsh_buckets(zero, rotations) == 0).all() and (lsh_bucket_margins(zero, rotations) == 0).all()


# ---------------------------------------------------------------- dtypes, sizes, memory


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_low_precision_is_the_golden_of_the_rounded_inputs(dtype):
    x, v = (a.astype(dtype) for a in inputs(10, (2,), 8))
    kw = dict(
        rotations=lsh_rotations(10, 5, 2, 4), chunk_length=2, causal=True, dedup=True, return_buckets=True
    )
    out, buckets = lsh_attention(x, v, **kw)
    assert out.dtype == np.dtype(dtype)
    ref, ref_buckets = lsh_attention(x.astype(np.float64), v.astype(np.float64), **kw)
    np.testing.assert_array_equal(out.astype(np.float64), ref.astype(dtype).astype(np.float64))
    np.testing.assert_array_equal(buckets, ref_buckets)


def test_float64_rotations_hold_the_same_values():
    x, v = inputs(11, (), 8)
    r = lsh_rotations(11, 5, 2, 4)
    np.testing.assert_array_equal(
        lsh_attention(x, v, rotations=r, chunk_length=2),
        lsh_attention(x, v, rotations=r.astype(np.float64), chunk_length=2),
    )


@pytest.mark.parametrize(
    "x_shape, v_shape, out_shape",
    [
        ((2, 0, 4), (2, 0, 3), (2, 0, 3)),  # L = 0
        ((0, 6, 4), (0, 6, 3), (0, 6, 3)),  # an empty batch
        ((6, 4), (6, 0), (6, 0)),  # dv = 0
        ((2, 1, 6, 4), (1, 3, 6, 2), (2, 3, 6, 2)),  # x and v broadcast
    ],
)
def test_shapes(x_shape, v_shape, out_shape):
    rng = np.random.default_rng(0)
    x, v = rng.standard_normal(x_shape), rng.standard_normal(v_shape)
    out, buckets = lsh_attention(
        x, v, rotations=lsh_rotations(0, 4, 2, 4), chunk_length=3, return_buckets=True
    )
    assert out.shape == out_shape and buckets.shape == (*out_shape[:-2], 2, out_shape[-2])


def test_memory_is_linear_in_L():
    L = 4096
    x, v = inputs(12, (), L, 8, 4)
    tracemalloc.start()
    lsh_attention(x, v, rotations=lsh_rotations(12, 8, 2, 8), chunk_length=8, causal=True, dedup=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # nh * L * 2C = 131072 entries, ~1 MiB per float64 array of that shape; one L x L float64
    # array alone would be 128 MiB
    assert peak < 8 * L * L / 4, f"peak {peak / 2**20:.1f} MiB"


# ---------------------------------------------------------------- bad input


def call(
    x_shape=(2, 8, 4),
    v_shape=(2, 8, 3),
    dtypes=("float32", "float32"),
    rot_shape=(4, 2, 2),
    rot_dtype="float32",
    **options,
):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(dtypes[0])
    v = rng.standard_normal(v_shape).astype(dtypes[1])
    options.setdefault("chunk_length", 2)
    return lsh_attention(x, v, rotations=rng.standard_normal(rot_shape).astype(rot_dtype), **options)


BAD = [
    (
        "x_not_array",
        lambda: lsh_attention([[1.0, 2.0]], np.ones((1, 1)), rotations=np.ones((2, 1, 1)), chunk_length=1),
        r"x must be a numpy\.ndarray, got list",
    ),
    ("x_rank_1", lambda: call(x_shape=(4,)), r"x\.ndim=1 must be >= 2"),
    ("v_rank_1", lambda: call(v_shape=(8,)), r"v\.ndim=1 must be >= 2"),
    ("x_int", lambda: call(dtypes=("int32", "int32")), r"x\.dtype=int32 must be one of"),
    ("mixed_dtypes", lambda: call(dtypes=("float32", "float64")), r"x\.dtype=float32, v\.dtype=float64"),
    ("length_mismatch", lambda: call(v_shape=(2, 7, 3)), r"v\.shape\[-2\]=7 must equal x\.shape\[-2\]=8"),
    (
        "batch_not_broadcast",
        lambda: call(v_shape=(3, 8, 3)),
        r"batch dims do not broadcast: x \(2,\), v \(3,\)",
    ),
    ("d_zero", lambda: call(x_shape=(2, 8, 0), rot_shape=(0, 2, 2)), r"x\.shape\[-1\]=0 .* must be >= 1"),
    (
        "rotations_d_mismatch",
        lambda: call(x_shape=(2, 8, 32), rot_shape=(16, 2, 2)),
        r"rotations\.shape\[0\]=16 must equal x\.shape\[-1\]=32",
    ),
    ("rotations_rank", lambda: call(rot_shape=(4, 2)), r"rotations\.ndim=2 must be 3"),
    (
        "rotations_dtype",
        lambda: call(rot_dtype="float16"),
        r"rotations\.dtype=float16 must be float32 or float64",
    ),
    ("no_hashes", lambda: call(rot_shape=(4, 0, 2)), r"rotations\.shape\[1\]=0 \(n_hashes\) must be >= 1"),
    ("no_buckets", lambda: call(rot_shape=(4, 2, 0)), r"rotations\.shape\[2\]=0 .*even number >= 2"),
    ("chunk_zero", lambda: call(chunk_length=0), r"chunk_length=0 must be an int >= 1"),
    ("chunk_negative", lambda: call(chunk_length=-2), r"chunk_length=-2 must be an int >= 1"),
    ("chunk_float", lambda: call(chunk_length=2.0), r"chunk_length=2\.0 must be an int >= 1"),
    ("chunk_bool", lambda: call(chunk_length=True), r"chunk_length=True must be an int >= 1"),
    (
        "one_chunk",
        lambda: call(rot_shape=(4, 1, 2), chunk_length=8),
        r"1 \* ceil\(8 / 8\) = 1 chunk\(s\), expected >= 2",
    ),
    (
        "one_long_chunk",
        lambda: call(rot_shape=(4, 1, 2), chunk_length=20),
        r"1 \* ceil\(8 / 20\) = 1 chunk\(s\), expected >= 2",
    ),
    ("causal_string", lambda: call(causal="upper_left"), r"causal='upper_left' must be a bool"),
    ("causal_none", lambda: call(causal=None), r"causal=None must be a bool"),
    ("dedup_int", lambda: call(dedup=1), r"dedup=1 must be a bool"),
    ("kv_negative", lambda: call(kv_lengths=-1), r"kv_lengths must lie in \[0, L=8\]"),
    ("kv_too_long", lambda: call(kv_lengths=np.array([9, 1])), r"kv_lengths must lie in \[0, L=8\]"),
    (
        "kv_float",
        lambda: call(kv_lengths=np.array(3.0)),
        r"kv_lengths\.dtype=float64 must be an integer dtype",
    ),
    (
        "kv_not_broadcast",
        lambda: call(kv_lengths=np.array([1, 2, 3])),
        r"kv_lengths\.shape=\(3,\) must broadcast to the batch shape \(2,\)",
    ),
    ("scale_zero", lambda: call(scale=0.0), r"scale=0\.0 must be finite and > 0"),
    ("scale_nan", lambda: call(scale=float("nan")), r"scale=nan must be finite and > 0"),
    ("scale_str", lambda: call(scale="1"), r"scale must be a real number or None, got str"),
    (
        "rotations_odd_buckets",
        lambda: lsh_rotations(0, 4, 2, 5),
        r"^lsh_rotations: n_buckets=5 must be an even int >= 2",
    ),
    ("rotations_zero_buckets", lambda: lsh_rotations(0, 4, 2, 0), r"n_buckets=0 must be an even int >= 2"),
    (
        "rotations_negative_buckets",
        lambda: lsh_rotations(0, 4, 2, -2),
        r"n_buckets=-2 must be an even int >= 2",
    ),
    ("rotations_zero_hashes", lambda: lsh_rotations(0, 4, 0, 4), r"n_hashes=0 must be an int >= 1"),
    ("rotations_zero_d", lambda: lsh_rotations(0, 0, 2, 4), r"d=0 must be an int >= 1"),
    ("rotations_negative_seed", lambda: lsh_rotations(-1, 4, 2, 4), r"seed=-1 must be an int >= 0"),
    ("rotations_float_seed", lambda: lsh_rotations(1.5, 4, 2, 4), r"seed=1\.5 must be an int >= 0"),
    (
        "buckets_d_mismatch",
        lambda: lsh_buckets(np.ones((8, 3)), np.ones((4, 2, 2))),
        r"^lsh_buckets: rotations\.shape\[0\]=4 must equal x\.shape\[-1\]=3",
    ),
    (
        "margins_rank_1",
        lambda: lsh_bucket_margins(np.ones(3), np.ones((3, 2, 2))),
        r"^lsh_bucket_margins: x\.ndim=1 must be >= 2",
    ),
]


@pytest.mark.parametrize("make, match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_spec_error(make, match):
    with pytest.raises(SpecError, match=match) as info:
        make()
    message = str(info.value)
    assert re.match(r"^(lsh_attention|lsh_rotations|lsh_buckets|lsh_bucket_margins): ", message), message


def test_loops_reference_validates_the_same_way():
    x, v = inputs(0, (), 8)
    with pytest.raises(SpecError, match=r"^_lsh_attention_loops: chunk_length=0 must be an int >= 1"):
        _lsh_attention_loops(x, v, rotations=lsh_rotations(0, 5, 1, 2), chunk_length=0)
