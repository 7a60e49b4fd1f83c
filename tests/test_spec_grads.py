"""The golden backward pass: finite differences, absent data, torch and jax autograd, bad input."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spec_calls import every_option, gqa_call, gqa_strategies

from attnspec import SpecError
from attnspec.spec import causal_mask, sdpa, window_mask
from attnspec.spec.bad_inputs import SDPA_BAD_INPUTS
from attnspec.spec.grads import sdpa_vjp

rng = np.random.default_rng(4321)
EPS = np.finfo(np.float64).eps

# Central differences with step H: error <= H**2 / 6 * |L'''| + delta / H, where delta bounds the
# rounding error of one evaluation of L = sum(sdpa(...) * d_out).
# - Rounding: each output entry is a weighted mean of m values whose weights carry the error of
#   dk-term dot products and an m-term softmax sum; for these shapes (dk, m <= 6, logits <= ~10)
#   that is under 64 ulp of max|v|, so delta <= 64 * EPS * max|v| * sum|d_out|.
# - Truncation: along one input coordinate the logits move by a vector u (|u| <= scale * max|q|
#   or max|k|, or 1 for a bias entry), and d^3 out / dt^3 is a fourth joint cumulant of (u, v)
#   under the weights, at most 16 * max|u|**3 * max|v| per row.
# With H = 1e-6 the rounding term dominates (~1e-8 per unit of max|v| * sum|d_out|); observed
# errors are ~1e-9 relative to the gradients, and any formula error is O(0.1) or more.
H = 1e-6
FD_ULPS = 64


def fd_tolerance(q, k, v, d_out, scale, has_bias):
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    u = max(1.0 if has_bias else 0.0, scale * np.abs(q).max(initial=0), scale * np.abs(k).max(initial=0))
    weight = max(1.0, np.abs(v).max(initial=0)) * np.abs(d_out).sum()
    return (FD_ULPS * EPS / H + H**2 / 6 * 16 * max(1.0, u) ** 3) * weight


def central_differences(f, args: list[np.ndarray], which: int) -> np.ndarray:
    x = args[which]
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        if not np.isfinite(x[idx]):
            continue  # a -inf bias entry: the key is absent and L does not depend on it
        plus, minus = [a.copy() for a in args], [a.copy() for a in args]
        plus[which][idx] += H
        minus[which][idx] -= H
        grad[idx] = (f(*plus) - f(*minus)) / (2 * H)
    return grad


def assert_matches_fd(q, k, v, **options):
    out_shape = sdpa(q, k, v, **options).shape
    d_out = rng.standard_normal(out_shape)
    bias = options.pop("bias", None)
    args = [q, k, v] + ([] if bias is None else [bias])

    def loss(q, k, v, bias=None):
        return float(np.sum(sdpa(q, k, v, bias=bias, **options) * d_out))

    grads = sdpa_vjp(q, k, v, d_out, bias=bias, **options)
    assert len(grads) == len(args)
    tol = fd_tolerance(q, k, v, d_out, options.get("scale"), bias is not None)
    assert tol < 1e-5  # keeps the check sharp: every gradient below is O(0.1) or larger
    worst = 0.0
    for i, (name, g) in enumerate(zip(["dq", "dk", "dv", "dbias"], grads)):
        assert g.shape == args[i].shape and g.dtype == args[i].dtype, name
        fd = central_differences(loss, args, i)
        err = float(np.abs(g - fd).max(initial=0))
        assert err <= tol, f"{name}: max |vjp - fd| = {err:.3g} > tol {tol:.3g}"
        worst = max(worst, err)
    return grads, worst


def qkv(batch=(2,), hq=2, hkv=2, n=3, m=4, dk=3, dv=2, dtype=np.float64):
    q = rng.standard_normal((*batch, hq, n, dk)).astype(dtype)
    k = rng.standard_normal((*batch, hkv, m, dk)).astype(dtype)
    v = rng.standard_normal((*batch, hkv, m, dv)).astype(dtype)
    return q, k, v


def _row_without_keys(shape):
    mask = rng.random(shape) < 0.6
    mask[..., 1, :] = False  # a row that sees nothing: its gradients are 0
    return mask


FD_CASES = {
    "plain": (qkv(), {}),
    "mask": (qkv(), {"mask": _row_without_keys((2, 2, 3, 4))}),
    "mask_broadcast": (qkv(), {"mask": rng.random((3, 4)) < 0.6}),
    "bias": (qkv(), {"bias": rng.standard_normal((2, 2, 3, 4))}),
    "bias_broadcast_neg_inf": (
        qkv(),
        {"bias": np.where(rng.random((2, 1, 4)) < 0.3, -np.inf, rng.standard_normal((2, 1, 4)))},
    ),
    "causal_upper_left": (qkv(n=3, m=5), {"causal": "upper_left"}),
    "causal_lower_right": (qkv(n=3, m=5), {"causal": "lower_right"}),
    "causal_lower_right_n_gt_m": (qkv(n=4, m=2), {"causal": "lower_right"}),
    "window": (qkv(n=4, m=5), {"window": (1, 1)}),
    "window_lower_right": (qkv(n=3, m=5), {"window": (1, 0), "causal": "lower_right"}),
    "kv_lengths": (qkv(), {"kv_lengths": np.array([2, 0])}),
    "q_lengths": (qkv(), {"q_lengths": np.array([1, 3])}),
    "gqa": (qkv(hq=4, hkv=2), {}),
    "mqa_causal": (qkv(hq=3, hkv=1, n=3, m=3), {"causal": "upper_left"}),
    "batch_broadcast": (
        (
            rng.standard_normal((2, 1, 2, 3, 3)),
            rng.standard_normal((3, 1, 4, 3)),
            rng.standard_normal((1, 3, 1, 4, 2)),
        ),
        {"bias": rng.standard_normal((3, 1, 3, 4))},
    ),
    "rank_2": (
        (rng.standard_normal((3, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))),
        {"bias": rng.standard_normal((3, 4))},
    ),
    "rank_2_kv_gqa": (
        (rng.standard_normal((2, 3, 3)), rng.standard_normal((4, 3)), rng.standard_normal((4, 2))),
        {},
    ),
    "scale": (qkv(), {"scale": 0.5}),
    "everything": (
        qkv(hq=4, hkv=2, n=3, m=5),
        every_option(rng, 3, 5, window=(2, 1), q_lengths=[2, 3], kv_lengths=[5, 4]),
    ),
}


@pytest.mark.parametrize("case", FD_CASES)
def test_vjp_matches_finite_differences(case):
    (q, k, v), options = FD_CASES[case]
    assert_matches_fd(q, k, v, **dict(options))


@settings(max_examples=30, deadline=None)
@given(
    **gqa_strategies(batch_dims=1, group=2, n=(1, 3), m=(1, 4), dk=3, dv=(1, 2), window=2),
    with_bias=st.booleans(),
)
def test_vjp_matches_finite_differences_hypothesis(
    batch, hkv, group, n, m, dk, dv, causal, window, with_bias, seed
):
    r, q, k, v, mask = gqa_call(batch, hkv, group, n, m, dk, dv, seed)
    options = {"mask": mask, "causal": causal, "window": window}
    if with_bias:
        options["bias"] = r.standard_normal((hkv * group, 1, m))
    assert_matches_fd(q, k, v, **options)


def test_dbias_rows_sum_to_zero():
    # softmax is shift invariant: adding c to a row's visible logits changes nothing, so the
    # gradient along that direction, sum_j dS[i, j], is 0 (up to rounding of O(1) terms).
    q, k, v = qkv(hq=4, hkv=2, n=5, m=6)
    bias = rng.standard_normal((2, 4, 5, 6))
    d_out = rng.standard_normal((2, 4, 5, 2))
    *_, dbias = sdpa_vjp(q, k, v, d_out, bias=bias, causal="upper_left")
    np.testing.assert_allclose(dbias.sum(axis=-1), 0.0, atol=1e-14 * np.abs(dbias).sum(axis=-1).max())
    assert np.all(dbias[..., ~causal_mask(5, 6, "upper_left")] == 0)  # hidden keys: exactly 0


# Structural identities: two float64 computations of the same sums in a different order; each
# entry sums <= 24 terms of size <= ~10, so they agree to well within 1e-12.
STRUCT_ATOL = 1e-12


def test_gqa_equals_repeated_kv_summed_over_group():
    q, k, v = qkv(hq=6, hkv=2, n=3, m=4)
    d_out = rng.standard_normal((2, 6, 3, 2))
    dq, dk, dv = sdpa_vjp(q, k, v, d_out, causal="lower_right")
    rq, rk, rv = sdpa_vjp(q, np.repeat(k, 3, axis=-3), np.repeat(v, 3, axis=-3), d_out, causal="lower_right")
    np.testing.assert_allclose(dq, rq, rtol=0, atol=STRUCT_ATOL)
    rk = rk.reshape(2, 2, 3, 4, 3)  # (B, Hq, m, dk) -> (B, Hkv, G, m, dk)
    rv = rv.reshape(2, 2, 3, 4, 2)  # (B, Hq, m, dv) -> (B, Hkv, G, m, dv)
    np.testing.assert_allclose(dk, rk.sum(axis=2), rtol=0, atol=STRUCT_ATOL)
    np.testing.assert_allclose(dv, rv.sum(axis=2), rtol=0, atol=STRUCT_ATOL)


def test_broadcast_batch_equals_explicit_broadcast_summed():
    q = rng.standard_normal((3, 1, 2, 3, 4))
    k = rng.standard_normal((2, 2, 5, 4))
    v = rng.standard_normal((1, 2, 2, 5, 2))
    bias = rng.standard_normal((1, 2, 3, 5))
    d_out = rng.standard_normal((3, 2, 2, 3, 2))
    dq, dk, dv, db = sdpa_vjp(q, k, v, d_out, bias=bias)
    full = (3, 2, 2)
    q_f, k_f, v_f = (np.broadcast_to(x, (*full, *x.shape[-2:])).copy() for x in (q, k, v))
    ref = sdpa_vjp(q_f, k_f, v_f, d_out, bias=np.broadcast_to(bias, (*full, 3, 5)).copy())
    rq, rk, rv, rb = ref  # each (3, 2, 2, L, d): summed back over the axes each input broadcast
    np.testing.assert_allclose(dq, rq.sum(axis=1, keepdims=True), rtol=0, atol=STRUCT_ATOL)  # (3, 1, 2, 3, 4)
    np.testing.assert_allclose(dk, rk.sum(axis=0), rtol=0, atol=STRUCT_ATOL)  # (2, 2, 5, 4)
    np.testing.assert_allclose(dv, rv.sum(axis=0, keepdims=True), rtol=0, atol=STRUCT_ATOL)  # (1, 2, 2, 5, 2)
    np.testing.assert_allclose(db, rb.sum(axis=(0, 1))[None], rtol=0, atol=STRUCT_ATOL)  # (1, 2, 3, 5)


ABSENT = {
    "mask": {"mask": np.arange(6) < 4},
    "kv_lengths": {"kv_lengths": np.array([4, 4])},
    "bias_neg_inf": {"bias": np.where(np.arange(6) < 4, 0.0, -np.inf)},
}


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("feature", ABSENT)
def test_absent_keys_get_exactly_zero_and_change_nothing(poison, feature):
    q, k, v = qkv(hq=4, hkv=2, n=4, m=6)
    d_out = rng.standard_normal((2, 4, 4, 2))
    clean = sdpa_vjp(q, k, v, d_out, **ABSENT[feature])
    k2, v2 = k.copy(), v.copy()
    k2[..., 4:, :] = v2[..., 4:, :] = poison  # keys 4 and 5 are hidden from every row
    grads = sdpa_vjp(q, k2, v2, d_out, **ABSENT[feature])
    _, dk, dv = grads[:3]
    assert np.all(dk[..., 4:, :] == 0) and np.all(dv[..., 4:, :] == 0)
    for got, want in zip(grads, clean):  # the poison changes no bit of any gradient
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_causal_poison_reaches_only_rows_that_see_it(poison):
    q, k, v = qkv(n=4, m=6)
    d_out = rng.standard_normal((2, 2, 4, 2))
    clean = sdpa_vjp(q, k, v, d_out, causal="upper_left")
    k2, v2 = k.copy(), v.copy()
    k2[..., 4:, :] = v2[..., 4:, :] = poison  # upper-left, n = 4: keys 4, 5 hidden from every row
    k2[..., 3, :] = v2[..., 3, :] = poison  # key 3 is seen by row 3 only
    dq, dk, dv = sdpa_vjp(q, k2, v2, d_out, causal="upper_left")
    assert np.all(dk[..., 4:, :] == 0) and np.all(dv[..., 4:, :] == 0)
    np.testing.assert_array_equal(dq[..., :3, :], clean[0][..., :3, :])
    assert not np.isfinite(dq[..., 3, :]).any()  # row 3 sees the poison (decision 3)


def test_nan_in_visible_value_poisons_only_rows_that_see_it():
    q, k, v = qkv(n=4, m=4)
    v[..., 2, 0] = np.nan
    d_out = rng.standard_normal((2, 2, 4, 2))
    dq, _, dv = sdpa_vjp(q, k, v, d_out, causal="upper_left")
    assert np.isfinite(dq[..., :2, :]).all() and np.isnan(dq[..., 2:, :]).all()
    assert np.isfinite(dv).all()  # dv = P^T dO never reads v


@pytest.mark.parametrize("how", ["q_lengths", "mask_row", "bias_row", "causal_lower_right"])
def test_rows_without_keys_get_zero_dq_and_contribute_nothing(how):
    q, k, v = qkv(n=4, m=3)
    d_out = rng.standard_normal((2, 2, 4, 2))
    bias = rng.standard_normal((4, 3))
    if how == "q_lengths":
        options, dead = {"q_lengths": np.array([2, 2])}, [2, 3]
    elif how == "mask_row":
        options, dead = {"mask": np.array([True, False, True, False])[:, None]}, [1, 3]
    elif how == "bias_row":
        bias[[0, 2]] = -np.inf
        options, dead = {}, [0, 2]
    else:  # n=4 > m=3 under lower-right: row 0 sees nothing
        options, dead = {"causal": "lower_right"}, [0]
    clean = sdpa_vjp(q, k, v, d_out, bias=bias, **options)
    q2, d_out2 = q.copy(), d_out.copy()
    q2[..., dead, 0] = np.nan  # padded rows are often uninitialized memory
    d_out2[..., dead, 1] = np.inf
    grads = sdpa_vjp(q2, k, v, d_out2, bias=bias, **options)
    assert np.all(grads[0][..., dead, :] == 0)  # dq of a dead row
    assert np.all(grads[3][..., dead, :] == 0)  # its dbias
    for got, want in zip(grads, clean):  # its q and d_out reach no gradient
        np.testing.assert_array_equal(got, want)


def test_zero_sizes():
    for n, m in [(0, 3), (3, 0), (0, 0)]:
        q, k, v = qkv(n=n, m=m, dtype=np.float32)
        d_out = np.ones((2, 2, n, 2), np.float32)
        bias = np.zeros((n, m), np.float32)
        grads = sdpa_vjp(q, k, v, d_out, bias=bias)
        for g, x in zip(grads, (q, k, v, bias)):
            assert g.shape == x.shape and g.dtype == np.float32 and not g.any()
    q, k, v = qkv(dv=0)  # dv = 0: out is empty, so every gradient is 0
    dq, dk, dv = sdpa_vjp(q, k, v, np.zeros((2, 2, 3, 0)))
    assert dv.shape == (2, 2, 4, 0) and not dq.any() and not dk.any()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_dtype_is_preserved_and_result_is_rounded_golden(dtype):
    q, k, v = qkv(dtype=dtype)
    d_out = rng.standard_normal((2, 2, 3, 2)).astype(dtype)
    bias = rng.standard_normal((3, 4)).astype(dtype)
    grads = sdpa_vjp(q, k, v, d_out, bias=bias)
    ref = sdpa_vjp(*(x.astype(np.float64) for x in (q, k, v, d_out)), bias=bias.astype(np.float64))
    for g, r in zip(grads, ref):
        assert g.dtype == dtype
        np.testing.assert_array_equal(g, r.astype(dtype))


# Autograd cross-checks. torch and jax differentiate the same float64 formulas in another order;
# every gradient entry is a sum of at most ~20 products of O(1-10) factors, so the two differ by
# a few hundred ulp of the result at most: 1e-12 relative to the largest gradient leaves ~2 decades.
AUTOGRAD_RTOL = 1e-12
AUTOGRAD_CASES = {
    "plain": {},
    "mask": {"mask": True},
    "bias": {"bias": True},
    "gqa_mask_bias": {"hq": 4, "mask": True, "bias": True},
}


def autograd_case(name):
    spec = AUTOGRAD_CASES[name]
    q, k, v = qkv(batch=(2,), hq=spec.get("hq", 2), hkv=2, n=4, m=5, dk=3, dv=2)
    mask = rng.random((2, 1, 4, 5)) < 0.6 if spec.get("mask") else None
    if mask is not None:
        mask[..., 0] = True  # every row sees a key: the plain formulas have NaN rows otherwise
    bias = rng.standard_normal((q.shape[-3], 4, 5)) if spec.get("bias") else None
    d_out = rng.standard_normal((2, q.shape[-3], 4, 2))
    return q, k, v, d_out, mask, bias


def assert_autograd_close(ours, theirs, who):
    for name, a, b in zip(["dq", "dk", "dv", "dbias"], ours, theirs):
        assert a.shape == b.shape, f"{name}.shape={a.shape}, but {who} gives {b.shape}"
        atol = AUTOGRAD_RTOL * max(1.0, float(np.abs(b).max()))
        np.testing.assert_allclose(a, b, rtol=0, atol=atol, err_msg=f"{name} vs {who}")


@pytest.mark.parametrize("case", AUTOGRAD_CASES)
def test_matches_torch_autograd(case):
    torch = pytest.importorskip("torch")
    q, k, v, d_out, mask, bias = autograd_case(case)
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    tb = None if bias is None else torch.tensor(bias, requires_grad=True)
    g = q.shape[-3] // k.shape[-3]
    s = (tq @ tk.repeat_interleave(g, dim=-3).transpose(-1, -2)) / q.shape[-1] ** 0.5  # (B, Hq, n, m)
    if tb is not None:
        s = s + tb
    if mask is not None:
        s = s.masked_fill(~torch.tensor(mask), float("-inf"))
    out = torch.softmax(s, dim=-1) @ tv.repeat_interleave(g, dim=-3)  # (B, Hq, n, dv)
    out.backward(torch.tensor(d_out))
    theirs = [t.grad.numpy() for t in (tq, tk, tv) + (() if tb is None else (tb,))]
    assert_autograd_close(sdpa_vjp(q, k, v, d_out, mask=mask, bias=bias), theirs, "torch")


@pytest.mark.parametrize("case", [*AUTOGRAD_CASES, "causal_lower_right_window"])
def test_matches_jax_vjp(case):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    options = {}
    if case == "causal_lower_right_window":
        q, k, v, d_out, _, bias = autograd_case("gqa_mask_bias")
        options = {"causal": "lower_right", "window": (2, 1)}
        mask = causal_mask(4, 5, "lower_right") & window_mask(4, 5, 2, 1, "lower_right")
    else:
        q, k, v, d_out, mask, bias = autograd_case(case)
    g = q.shape[-3] // k.shape[-3]

    def attention(q, k, v, bias):
        s = q @ jnp.swapaxes(jnp.repeat(k, g, axis=-3), -1, -2) / np.sqrt(q.shape[-1])  # (B, Hq, n, m)
        s = s + bias
        if mask is not None:
            s = jnp.where(mask, s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ jnp.repeat(v, g, axis=-3)  # (B, Hq, n, dv)

    with jax.enable_x64(True):
        primals = [jnp.asarray(x) for x in (q, k, v, np.zeros(1) if bias is None else bias)]
        _, pullback = jax.vjp(attention, *primals)
        theirs = [np.asarray(t) for t in pullback(jnp.asarray(d_out))]
    theirs = theirs[:3] if bias is None else theirs
    ours = sdpa_vjp(q, k, v, d_out, mask=None if options else mask, bias=bias, **options)
    assert_autograd_close(ours, theirs, "jax")


def test_d_out_is_checked():
    q, k, v = qkv()
    good = np.zeros((2, 2, 3, 2))
    msg = "sdpa_vjp: d_out.shape=(2, 2, 3, 3) must equal the output shape (2, 2, 3, 2)"
    with pytest.raises(SpecError, match=re.escape(msg)):
        sdpa_vjp(q, k, v, np.zeros((2, 2, 3, 3)))
    msg = "sdpa_vjp: d_out.shape=(1, 3, 2) must equal the output shape (3, 2)"
    with pytest.raises(SpecError, match=re.escape(msg)):
        sdpa_vjp(q[0, 0], k[0, 0], v[0, 0], good[0, :1])  # rank-2 inputs: the output has no head axis
    msg = "sdpa_vjp: d_out.dtype=float32 must equal q.dtype=float64"
    with pytest.raises(SpecError, match=re.escape(msg)):
        sdpa_vjp(q, k, v, good.astype(np.float32))
    with pytest.raises(SpecError, match=re.escape("sdpa_vjp: d_out must be a numpy.ndarray, got list")):
        sdpa_vjp(q, k, v, good.tolist())


@pytest.mark.parametrize("case", SDPA_BAD_INPUTS, ids=lambda c: c.id)
def test_bad_input_catalogue(case):
    (q, k, v), options = case.build()
    with pytest.raises(SpecError, match=case.match) as info:
        sdpa_vjp(q, k, v, np.zeros(1, q.dtype), **options)  # inputs are checked before d_out
    assert str(info.value).startswith("sdpa_vjp: ")


# -- mha_vjp ------------------------------------------------------------------------------------
# The same central-difference bound as `fd_tolerance`, with mha's extra stages counted: rounding
# now passes three projections of up to E terms before sdpa and one after, so FD_ULPS grows by
# MHA_ULPS_FACTOR = 4, and the logit sensitivity u along one input coordinate is scale * (the
# largest projected |q| or |k|) times (the largest weight or input entry), since a coordinate of
# query, key or a weight enters q or k through one product.
MHA_ULPS_FACTOR = 4


def mha_fd_tolerance(q_proj, k_proj, v_proj, arrays, d_out, w_o, scale, has_bias):
    factor = max(1.0, *(float(np.abs(a).max(initial=0)) for a in arrays))
    u = max(
        1.0 if has_bias else 0.0,
        scale * factor * max(np.abs(q_proj).max(initial=0), np.abs(k_proj).max(initial=0)),
    )
    weight = max(1.0, np.abs(v_proj).max(initial=0)) * factor * np.abs(d_out @ w_o).sum()
    return (MHA_ULPS_FACTOR * FD_ULPS * EPS / H + H**2 / 6 * 16 * max(1.0, u) ** 3) * weight


MHA_FIELDS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")


def assert_mha_matches_fd(query, key, value, params, **options):
    from attnspec.spec import MHAParams, mha, split_heads
    from attnspec.spec.grads_mha import mha_vjp

    heads = options["num_heads"]
    hkv = options.get("num_kv_heads") or heads
    out = mha(query, key, value, params, **options)
    d_out = rng.standard_normal(out.shape)
    bias = options.pop("bias", None)
    names = [f for f in MHA_FIELDS if getattr(params, f) is not None]
    args = [query, key, value] + [getattr(params, f) for f in names] + ([] if bias is None else [bias])

    def loss(*a):
        p = MHAParams(**dict(zip(names, a[3 : 3 + len(names)])))
        b = a[3 + len(names)] if bias is not None else None
        return float(np.sum(mha(a[0], a[1], a[2], p, bias=b, **options) * d_out))

    grads = mha_vjp(query, key, value, params, d_out, bias=bias, **options)
    assert len(grads) == 4 + (bias is not None)
    d_params = grads[3]
    ours = list(grads[:3]) + [getattr(d_params, f) for f in names] + list(grads[4:])
    for f in MHA_FIELDS:
        assert (getattr(d_params, f) is None) == (getattr(params, f) is None), f
    hd = params.embed_dim // heads
    proj = [x @ getattr(params, w).T for x, w in ((query, "w_q"), (key, "w_k"), (value, "w_v"))]
    q_p, k_p, v_p = split_heads(proj[0], heads), split_heads(proj[1], hkv), split_heads(proj[2], hkv)
    scale = options.get("scale") or 1 / np.sqrt(hd)
    tol = mha_fd_tolerance(
        q_p, k_p, v_p, args[:-1] if bias is not None else args, d_out, params.w_o, scale, bias is not None
    )
    assert tol < 1e-4  # sharp: the gradients checked are O(0.1) or larger
    labels = (
        ["d_query", "d_key", "d_value"] + [f"d_{f}" for f in names] + (["d_bias"] if bias is not None else [])
    )
    for i, (label, g) in enumerate(zip(labels, ours)):
        assert g.shape == args[i].shape and g.dtype == args[i].dtype, label
        fd = central_differences(loss, args, i)
        err = float(np.abs(g - fd).max(initial=0))
        assert err <= tol, f"{label}: max |vjp - fd| = {err:.3g} > tol {tol:.3g}"
    return grads


def _mha_params(e=4, heads=2, hkv=None, kdim=None, vdim=None, bias=True, seed=0):
    from attnspec.spec import MHAParams

    return MHAParams.init(e, heads, num_kv_heads=hkv, kdim=kdim, vdim=vdim, bias=bias, seed=seed)


#: query, key, value and d_out of the two-head, width-8 mha gradient tests (n = 4, m = 5)
_MHA_8_SHAPES = ((2, 4, 8), (2, 5, 8), (2, 5, 8), (2, 4, 8))

MHA_FD_CASES = {
    "plain": dict(shapes=((2, 3, 4), (2, 4, 4), (2, 4, 4)), params={}, options={}),
    "no_bias_kdim_vdim": dict(
        shapes=((3, 4), (5, 3), (5, 2)), params={"bias": False, "kdim": 3, "vdim": 2}, options={}
    ),
    "gqa_causal": dict(
        shapes=((2, 3, 4), (1, 3, 4), (3, 4)),
        params={"heads": 2, "hkv": 1},
        options={"num_kv_heads": 1, "causal": "lower_right"},
    ),
    "mask_lengths_bias": dict(
        shapes=((2, 3, 4), (2, 4, 4), (2, 4, 4)),
        params={},
        options={
            "mask": rng.random((3, 4)) < 0.7,
            "kv_lengths": np.array([3, 4]),
            "q_lengths": np.array([2, 3]),
            "scale": 0.8,
            "bias": rng.standard_normal((2, 1, 3, 4)),
        },
    ),
}


@pytest.mark.parametrize("case", MHA_FD_CASES)
def test_mha_vjp_matches_finite_differences(case):
    spec = MHA_FD_CASES[case]
    kw = spec["params"]
    params = _mha_params(
        heads=kw.get("heads", 2),
        hkv=kw.get("hkv"),
        kdim=kw.get("kdim"),
        vdim=kw.get("vdim"),
        bias=kw.get("bias", True),
    )
    query, key, value = (rng.standard_normal(s) for s in spec["shapes"])
    assert_mha_matches_fd(query, key, value, params, num_heads=kw.get("heads", 2), **dict(spec["options"]))


def test_mha_vjp_b_k_is_exactly_zero_and_dead_rows_and_keys_exactly_zero():
    from attnspec.spec.grads_mha import mha_vjp

    params = _mha_params(e=8, heads=2)
    query, key, value, d_out = (rng.standard_normal(shape) for shape in _MHA_8_SHAPES)
    options = dict(num_heads=2, q_lengths=np.array([4, 2]), kv_lengths=np.array([3, 5]))
    d_query, d_key, d_value, d_params = mha_vjp(query, key, value, params, d_out, **options)
    assert np.all(d_params.b_k == 0)  # softmax shift invariance, returned exactly
    assert np.all(d_query[1, 2:] == 0)  # padded queries: no gradient
    assert np.all(d_key[0, 3:] == 0) and np.all(d_value[0, 3:] == 0)  # keys beyond kv_length
    # the poison in dead rows and keys changes no bit (d_out of padded rows reaches only b_o, w_o)
    key2, value2, query2 = key.copy(), value.copy(), query.copy()
    key2[0, 3:] = np.nan
    value2[0, 3:] = np.inf
    query2[1, 2:] = np.nan
    again = mha_vjp(query2, key2, value2, params, d_out, **options)
    for got, want in zip(again[:3], (d_query, d_key, d_value)):
        np.testing.assert_array_equal(got, want)


def test_mha_vjp_matches_torch_multihead_attention():
    torch = pytest.importorskip("torch")
    from attnspec.spec.grads_mha import mha_vjp

    params = _mha_params(e=8, heads=2)
    query, key, value, d_out = (rng.standard_normal(shape) for shape in _MHA_8_SHAPES)
    layer = torch.nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    layer.load_state_dict({k: torch.tensor(v) for k, v in params.to_torch_state_dict().items()})
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (query, key, value))
    out, _ = layer(tq, tk, tv, need_weights=False)
    out.backward(torch.tensor(d_out))
    d_query, d_key, d_value, d_params = mha_vjp(query, key, value, params, d_out, num_heads=2)
    ours = {
        "query": d_query,
        "key": d_key,
        "value": d_value,
        "in_proj_weight": np.concatenate([d_params.w_q, d_params.w_k, d_params.w_v]),
        "in_proj_bias": np.concatenate([d_params.b_q, d_params.b_k, d_params.b_v]),
        "out_proj.weight": d_params.w_o,
        "out_proj.bias": d_params.b_o,
    }
    theirs = {
        "query": tq.grad,
        "key": tk.grad,
        "value": tv.grad,
        **{name: p.grad for name, p in layer.named_parameters()},
    }
    for name, want in theirs.items():
        want = want.numpy()
        np.testing.assert_allclose(
            ours[name], want, rtol=0, atol=AUTOGRAD_RTOL * max(1.0, float(np.abs(want).max())), err_msg=name
        )


def test_mha_vjp_d_out_is_checked():
    from attnspec.spec.grads_mha import mha_vjp

    params = _mha_params()
    x = rng.standard_normal((3, 4))
    with pytest.raises(
        SpecError, match=re.escape("mha_vjp: d_out.shape=(3, 3) must equal the output shape (3, 4)")
    ):
        mha_vjp(x, x, x, params, np.zeros((3, 3)), num_heads=2)
    with pytest.raises(
        SpecError, match=re.escape("mha_vjp: d_out.dtype=float32 must equal query.dtype=float64")
    ):
        mha_vjp(x, x, x, params, np.zeros((3, 4), np.float32), num_heads=2)
    with pytest.raises(
        SpecError, match=re.escape("mha_vjp: embed_dim=4 must be a positive multiple of num_heads=3")
    ):
        mha_vjp(x, x, x, params, np.zeros((3, 4)), num_heads=3)


# -- lsh_attention_vjp --------------------------------------------------------------------------
# Buckets are constants of the vjp, so a finite difference is only valid while no bucket moves:
# a step H moves each projection x . R[:, r, k] by at most H * max|R|, a margin by twice that, so
# every case asserts min margin > 2 * H * max|R| (by a wide factor). Rounding and truncation as
# in `fd_tolerance`: the logit moves along one x coordinate by u <= scale * (1 + max||x|| /
# min||x||) (query path plus the normalized-key path, whose Jacobian is at most 1 / ||x||).


def lsh_fd_tolerance(x, v, d_out, scale):
    norms = np.linalg.norm(x, axis=-1)
    u = scale * max(1.0, float(np.abs(x).max())) * (1 + norms.max() / norms.min())
    weight = max(1.0, float(np.abs(v).max())) * np.abs(d_out).sum()
    return (FD_ULPS * EPS / H + H**2 / 6 * 16 * u**3) * weight


LSH_FD_CASES = {
    "plain": {},
    "causal": {"causal": True},
    "dedup": {"dedup": True},
    "kv_lengths": {"kv_lengths": np.array([7, 5])},
    "ragged_L": {"L": 7},
    "everything": {"scale": 0.7, "dedup": True, "causal": True, "kv_lengths": np.array([8, 6])},
    "broadcast_v": {"v_batch": (1,)},
}


@pytest.mark.parametrize("case", LSH_FD_CASES)
def test_lsh_vjp_matches_finite_differences(case):
    from attnspec.spec import lsh_attention, lsh_bucket_margins, lsh_rotations
    from attnspec.spec.grads_lsh import lsh_attention_vjp

    options = dict(LSH_FD_CASES[case])
    L = options.pop("L", 8)
    v_batch = options.pop("v_batch", (2,))
    r = np.random.default_rng(1)
    rotations = lsh_rotations(3, 4, 2, 4)  # d=4, 2 rounds, 4 buckets
    x, v = r.standard_normal((2, L, 4)), r.standard_normal((*v_batch, L, 3))
    assert lsh_bucket_margins(x, rotations).min() > 100 * 2 * H * np.abs(rotations).max()
    d_out = r.standard_normal((2, L, 3))
    kw = dict(rotations=rotations, chunk_length=2, **options)

    def loss(x, v):
        return float(np.sum(lsh_attention(x, v, **kw) * d_out))

    dx, dv = lsh_attention_vjp(x, v, d_out, **kw)
    tol = lsh_fd_tolerance(x, v, d_out, options.get("scale", 1.0))
    assert tol < 1e-5
    for i, (name, g) in enumerate((("dx", dx), ("dv", dv))):
        assert g.shape == (x, v)[i].shape and g.dtype == np.float64
        fd = central_differences(loss, [x, v], i)
        err = float(np.abs(g - fd).max())
        assert err <= tol, f"{name}: max |vjp - fd| = {err:.3g} > tol {tol:.3g}"
        assert np.abs(g).max() > 0.05  # the check is not vacuous


def test_lsh_vjp_padded_positions_get_exactly_zero_and_poison_changes_nothing():
    from attnspec.spec import lsh_rotations
    from attnspec.spec.grads_lsh import lsh_attention_vjp

    r = np.random.default_rng(2)
    rotations = lsh_rotations(0, 4, 2, 4)
    x, v, d_out = r.standard_normal((2, 8, 4)), r.standard_normal((2, 8, 3)), r.standard_normal((2, 8, 3))
    kw = dict(rotations=rotations, chunk_length=2, kv_lengths=np.array([8, 5]))
    dx, dv = lsh_attention_vjp(x, v, d_out, **kw)
    assert np.all(dx[1, 5:] == 0) and np.all(dv[1, 5:] == 0)
    x2, v2, d2 = x.copy(), v.copy(), d_out.copy()
    x2[1, 5:], v2[1, 5:], d2[1, 5:] = np.nan, np.inf, np.nan  # padding holds garbage
    for got, want in zip(lsh_attention_vjp(x2, v2, d2, **kw), (dx, dv)):
        np.testing.assert_array_equal(got, want)


def test_lsh_vjp_matches_torch_autograd_given_the_buckets():
    # torch differentiates the forward written here from its numbered steps, buckets fixed
    torch = pytest.importorskip("torch")
    from attnspec.spec import lsh_attention, lsh_rotations
    from attnspec.spec.grads_lsh import lsh_attention_vjp
    from attnspec.spec.lsh import NORM_EPS, SELF_LOGIT

    r = np.random.default_rng(3)
    L, C = 6, 2
    rotations = lsh_rotations(5, 3, 2, 4)
    x, v, d_out = r.standard_normal((L, 3)), r.standard_normal((L, 2)), r.standard_normal((L, 2))
    _, buckets = lsh_attention(x, v, rotations=rotations, chunk_length=C, return_buckets=True)
    tx, tv = torch.tensor(x, requires_grad=True), torch.tensor(v, requires_grad=True)
    k_hat = tx / tx.norm(dim=-1, keepdim=True).clamp_min(NORM_EPS)
    slots = np.concatenate([np.argsort(buckets[h] * L + np.arange(L), kind="stable") for h in range(2)])
    chunks = slots.reshape(-1, C)
    outs, lses = torch.zeros(2, L, 2, dtype=torch.float64), torch.zeros(2, L, dtype=torch.float64)
    for c, chunk in enumerate(chunks):
        window = np.concatenate([chunks[c - 1], chunk])
        for i in chunk:
            logits = torch.stack(
                [
                    torch.tensor(SELF_LOGIT, dtype=torch.float64) if j == i else tx[i] @ k_hat[j]
                    for j in window
                ]
            )
            lse = torch.logsumexp(logits, 0)
            outs[c * C // L, i] = torch.softmax(logits, 0) @ tv[window]
            lses[c * C // L, i] = lse
    out = (torch.softmax(lses, 0)[..., None] * outs).sum(0)
    out.backward(torch.tensor(d_out))
    dx, dv = lsh_attention_vjp(x, v, d_out, rotations=rotations, chunk_length=C)
    np.testing.assert_allclose(
        out.detach().numpy(), lsh_attention(x, v, rotations=rotations, chunk_length=C), rtol=0, atol=1e-13
    )
    for ours, theirs in ((dx, tx.grad), (dv, tv.grad)):
        theirs = theirs.numpy()
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=AUTOGRAD_RTOL * max(1.0, np.abs(theirs).max()))


def test_lsh_vjp_d_out_is_checked():
    from attnspec.spec import lsh_rotations
    from attnspec.spec.grads_lsh import lsh_attention_vjp

    x = rng.standard_normal((6, 4))
    kw = dict(rotations=lsh_rotations(0, 4, 2, 4), chunk_length=2)
    want = "lsh_attention_vjp: d_out.shape=(6, 3) must equal the output shape (6, 4)"
    with pytest.raises(SpecError, match=re.escape(want)):
        lsh_attention_vjp(x, x, np.zeros((6, 3)), **kw)
    with pytest.raises(
        SpecError, match=re.escape("lsh_attention_vjp: d_out.dtype=float32 must equal x.dtype=float64")
    ):
        lsh_attention_vjp(x, x, np.zeros((6, 4), np.float32), **kw)
    with pytest.raises(SpecError, match=re.escape("lsh_attention_vjp: chunk_length=0 must be an int >= 1")):
        lsh_attention_vjp(x, x, np.zeros((6, 4)), rotations=kw["rotations"], chunk_length=0)


# -- the gradient tolerance rule with the variants (spec/tolerance_grads.py) -----------------------


def _variant_grad_case(name: str, dtype):
    """q, k, v, d_out (B=2, Hq=4, Hkv=2, n=5, m=7, d=4) and the options of one variant case."""
    r = np.random.default_rng(15)
    q = r.standard_normal((2, 4, 5, 4)).astype(dtype)
    k, v = (r.standard_normal((2, 2, 7, 4)).astype(dtype) for _ in range(2))
    d_out = r.standard_normal((2, 4, 5, 4)).astype(dtype)
    every = {
        "softcap": dict(softcap=0.7, bias=r.standard_normal((5, 7)).astype(dtype)),
        "alibi": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 1.0], np.float32), causal="lower_right"),
        "sinks": dict(sinks=np.array([0.5, -1.0, 2.0, 0.0], dtype), kv_lengths=np.array([7, 0])),
        "segments": dict(
            q_segment_ids=np.array([0, 0, 1, 1, -1]), kv_segment_ids=np.array([0, 1, 1, 1, 1, 2, -1])
        ),
        "lower_right_lengths": dict(
            causal="lower_right_lengths", kv_lengths=np.array([6, 3]), q_lengths=np.array([5, 2])
        ),
        "dropout": dict(dropout_mask=r.random((2, 4, 5, 7)) >= 0.4, dropout_p=0.4),
    }
    options = {k_: v_ for opts in every.values() for k_, v_ in opts.items()} if name == "all" else every[name]
    return q, k, v, d_out, options


def _ref_and_allowed(q, k, v, d_out, options, err_ref=None):
    from attnspec.conformance.hypothesis_helpers import case_plan, full_visibility
    from attnspec.spec.tolerance_grads import grad_names, reference_sdpa_vjp, sdpa_vjp_allowed

    f64 = {
        k_: v_.astype(np.float64) if isinstance(v_, np.ndarray) and v_.dtype.name in FLOATS else v_
        for k_, v_ in options.items()
    }
    golden = sdpa_vjp(*(x.astype(np.float64) for x in (q, k, v, d_out)), **f64)
    plan, extras = case_plan(q, k, v, options)
    ref = reference_sdpa_vjp(plan, q, k, v, d_out, None, options.get("bias"), extras)
    names = grad_names(options.get("bias"), options.get("sinks"))
    undropped = {k_: v_ for k_, v_ in f64.items() if k_ not in ("dropout_mask", "dropout_p")}
    _, w = sdpa(*(x.astype(np.float64) for x in (q, k, v)), **undropped, return_weights=True)
    errs = {n: float(np.abs(r_ - g).max()) for n, r_, g in zip(names, ref, golden)}
    allowed = sdpa_vjp_allowed(
        plan,
        q,
        k,
        v,
        d_out,
        options.get("bias"),
        full_visibility(plan, options),
        w,
        errs if err_ref is None else err_ref,
        extras,
    )
    return dict(zip(names, golden)), dict(zip(names, ref)), errs, allowed


FLOATS = ("float16", "bfloat16", "float32", "float64")
VARIANT_GRAD_CASES = ["softcap", "alibi", "sinks", "segments", "lower_right_lengths", "dropout", "all"]


@pytest.mark.parametrize("name", VARIANT_GRAD_CASES)
def test_reference_vjp_with_variants_is_the_golden_in_float64(name):
    """The rule's reference backward follows the golden through every variant: in float64 (no
    rounding) it is the golden, gradient by gradient, dsinks included."""
    q, k, v, d_out, options = _variant_grad_case(name, np.float64)
    golden, ref, _, allowed = _ref_and_allowed(q, k, v, d_out, options)
    assert ref.keys() == golden.keys() == allowed.keys()
    assert ("dsinks" in ref) == ("sinks" in options)
    for n, g in golden.items():
        assert ref[n].shape == g.shape
        np.testing.assert_allclose(ref[n], g, rtol=1e-12, atol=1e-14, err_msg=n)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
@pytest.mark.parametrize("name", VARIANT_GRAD_CASES)
def test_gradient_floor_with_variants_covers_the_reference_and_judges(name, dtype):
    """The derived floor alone (err_ref = 0) admits the same-precision reference, a correct
    implementation rounding as often as D allows; and in float32 it is far below each gradient's
    size, so it judges (a dropped softcap derivative or a missing dsinks is O(1) off)."""
    q, k, v, d_out, options = _variant_grad_case(name, dtype)
    golden, _, errs, floor = _ref_and_allowed(q, k, v, d_out, options, err_ref={})
    for n, g in golden.items():
        assert errs[n] <= floor[n], f"{n}: reference error {errs[n]:.3e} > floor {floor[n]:.3e}"
        if dtype is np.float32:
            assert floor[n] < 1e-2 * np.abs(g).max(), (
                f"{n}: floor {floor[n]:.3e} vs max |{n}| {np.abs(g).max():.3e}"
            )
