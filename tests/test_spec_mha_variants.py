"""The golden mha and mha_vjp with sdpa's variants (issue #15): each reaches every head.

The expected values are built independently of `attnspec.spec.mha`: projections written out with
NumPy, the per-head attention from `sdpa_loops` (the loop definition), heads merged by hand.
Gradients are checked against central differences of `mha` itself.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnspec import SpecError
from attnspec.spec import MHAParams, mha, mha_vjp, sdpa_loops, segment_ids_from_cu_seqlens

rng = np.random.default_rng(1515)
E, H, HKV, N, M = 8, 4, 2, 5, 7
HD = E // H


def _layer():
    return MHAParams.init(E, H, num_kv_heads=HKV, seed=3)


def _inputs(batch=(2,)):
    return (
        rng.standard_normal((*batch, N, E)),
        rng.standard_normal((*batch, M, E)),
        rng.standard_normal((*batch, M, E)),
    )


def _by_hand(query, key, value, p: MHAParams, **options):
    """W_o merge(sdpa_loops(split(q), split(k), split(v), ...)) + b_o, written out."""

    def heads(x, w, b, h):  # (B, L, in) -> (B, h, L, hd)
        y = x @ w.T + b
        return y.reshape(*y.shape[:-1], h, HD).swapaxes(-2, -3)

    q, k, v = heads(query, p.w_q, p.b_q, H), heads(key, p.w_k, p.b_k, HKV), heads(value, p.w_v, p.b_v, HKV)
    res = sdpa_loops(q, k, v, **options)
    o = res[0] if isinstance(res, tuple) else res  # (B, H, n, hd)
    merged = o.swapaxes(-2, -3).reshape(*o.shape[:-3], N, E)  # (B, n, E)
    out = merged @ p.w_o.T + p.b_o
    return (out, *res[1:]) if isinstance(res, tuple) else out


KEEP = rng.random((2, H, N, M)) < 0.7
VARIANTS = {
    "softcap": dict(softcap=0.7),
    "alibi": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 1.0])),
    "alibi_lower_right": dict(alibi_slopes=np.array([0.5, 0.25, 0.125, 1.0]), causal="lower_right"),
    "sinks": dict(sinks=np.array([0.3, -1.0, 2.0, 0.0])),
    "segments": dict(
        q_segment_ids=np.array([[0, 0, 1, 1, 1], [0, 0, 0, 0, -1]]),
        kv_segment_ids=np.array([[0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0, -1]]),
    ),
    "lower_right_lengths": dict(
        causal="lower_right_lengths", kv_lengths=np.array([4, 7]), q_lengths=np.array([2, 5])
    ),
    "dropout": dict(dropout_mask=KEEP, dropout_p=0.3),
    "lse": dict(return_lse=True, sinks=np.array([0.3, -1.0, 2.0, 0.0])),
    "all": dict(
        softcap=1.5,
        alibi_slopes=np.array([0.5, 0.25, 0.125, 1.0]),
        sinks=np.zeros(4),
        causal="lower_right_lengths",
        window=(2, 0),
        q_segment_ids=segment_ids_from_cu_seqlens([0, 2, 5], 5)[None].repeat(2, 0),
        kv_segment_ids=segment_ids_from_cu_seqlens([0, 3, 7], 7)[None].repeat(2, 0),
        dropout_mask=KEEP,
        dropout_p=0.25,
        return_weights=True,
        return_lse=True,
    ),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_reaches_every_head_as_sdpa_loops_says(name):
    """mha with a variant equals the written-out layer around the loop definition, and differs
    from mha without it (a variant mha dropped would fail the second assertion)."""
    query, key, value = _inputs()
    p = _layer()
    opts = VARIANTS[name]
    got = mha(query, key, value, p, num_heads=H, num_kv_heads=HKV, **opts)
    want = _by_hand(query, key, value, p, **opts)
    got_t, want_t = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    assert len(got_t) == len(want_t)
    for g, w in zip(got_t, want_t):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-12)  # float64 both: rounding order only
    plain = mha(query, key, value, p, num_heads=H, num_kv_heads=HKV)
    assert np.abs(got_t[0] - plain).max() > 1e-3


def test_lse_shape_and_dtype_follow_sdpa():
    """lse is (..., H, n): float32 for float32 inputs, float64 for float64; rank-2 query too."""
    query, key, value = _inputs(batch=())
    p = _layer()
    for dt, lse_dt in ((np.float32, np.float32), (np.float64, np.float64)):
        out, lse = mha(
            query.astype(dt),
            key.astype(dt),
            value.astype(dt),
            p,
            num_heads=H,
            num_kv_heads=HKV,
            return_lse=True,
        )
        assert out.shape == (N, E) and out.dtype == dt
        assert lse.shape == (H, N) and lse.dtype == lse_dt


def test_row_with_no_visible_key_and_a_sink_gives_b_o_and_lse_of_the_sink():
    query, key, value = _inputs()
    p = _layer()
    sinks = np.array([0.3, -1.0, 2.0, 0.0])
    out, lse = mha(
        query,
        key,
        value,
        p,
        num_heads=H,
        num_kv_heads=HKV,
        sinks=sinks,
        q_lengths=np.array([3, 5]),
        return_lse=True,
    )
    np.testing.assert_array_equal(out[0, 3:], np.broadcast_to(p.b_o, (2, E)))
    np.testing.assert_array_equal(lse[0, :, 3:], np.broadcast_to(sinks[:, None], (H, 2)))


BAD = [
    ("softcap_zero", dict(softcap=0.0), r"^mha: softcap=0\.0"),
    ("slopes_per_kv_head", dict(alibi_slopes=np.ones(HKV)), r"^mha: alibi_slopes"),
    ("sinks_dtype", dict(sinks=np.ones(H, np.float32)), r"^mha: sinks"),
    ("segments_alone", dict(q_segment_ids=np.zeros((2, N), np.int64)), r"^mha: .*segment_ids"),
    ("dropout_without_p", dict(dropout_mask=KEEP), r"^mha: .*dropout_p"),
    ("return_lse_not_bool", dict(return_lse=1), r"^mha: return_lse"),
]


@pytest.mark.parametrize("opts, match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_variant_bad_input_names_mha(opts, match):
    query, key, value = _inputs()
    with pytest.raises(SpecError, match=match):
        mha(query, key, value, _layer(), num_heads=H, num_kv_heads=HKV, **opts)


# -- mha_vjp ------------------------------------------------------------------------------------
# Central differences with step h on float64: truncation h^2/6 * |f'''| plus rounding eps/h times
# the loss's size. With h = 1e-5 and a loss of order 10 that is ~1e-10 + ~1e-10; TOL = 1e-7 leaves
# three decades and still fails for a dropped variant (which moves gradients by ~1e-2 or more).
STEP, TOL = 1e-5, 1e-7
FD_VARIANTS = {
    "softcap_alibi": dict(softcap=0.8, alibi_slopes=np.array([0.5, 0.25, 0.125, 1.0]), causal="lower_right"),
    "sinks": dict(sinks=np.array([0.3, -1.0, 2.0, 0.0])),
    "segments_lengths_dropout": {k: v for k, v in VARIANTS["all"].items() if not k.startswith("return_")},
}


def _central(f, x: np.ndarray) -> np.ndarray:
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + STEP
        up = f()
        x[idx] = old - STEP
        down = f()
        x[idx] = old
        g[idx] = (up - down) / (2 * STEP)
    return g


@pytest.mark.parametrize("name", FD_VARIANTS)
def test_mha_vjp_with_variants_matches_finite_differences(name):
    """d_query, d_key, d_value, d_w_q, d_w_o and d_sinks against central differences of mha."""
    query, key, value = _inputs()
    p = _layer()
    opts = dict(FD_VARIANTS[name])
    sinks = opts.pop("sinks", None)
    sinks = None if sinks is None else sinks.copy()
    kw = dict(num_heads=H, num_kv_heads=HKV, **opts)
    d_out = rng.standard_normal((2, N, E))
    grads = mha_vjp(query, key, value, p, d_out, sinks=sinks, **kw)
    assert len(grads) == 4 + (sinks is not None)

    def loss() -> float:
        return float(np.sum(mha(query, key, value, p, sinks=sinks, **kw) * d_out))

    checks = {
        "d_query": (grads[0], query),
        "d_key": (grads[1], key),
        "d_value": (grads[2], value),
        "d_w_q": (grads[3].w_q, p.w_q),
        "d_w_o": (grads[3].w_o, p.w_o),
    }
    if sinks is not None:
        checks["d_sinks"] = (grads[4], sinks)
        assert grads[4].shape == (H,) and grads[4].dtype == sinks.dtype
    for label, (g, x) in checks.items():
        fd = _central(loss, x)
        err = float(np.abs(g - fd).max())
        assert err <= TOL, f"{name} {label}: max |vjp - fd| = {err:.3g} > {TOL}"
        assert np.abs(fd).max() > 1e-3, f"{name} {label}: the check would be empty"


def test_mha_vjp_sink_gradient_changes_with_the_sink():
    """dsinks is -sum p_sink * D over rows: not zero, and it moves when the sink does."""
    query, key, value = _inputs()
    p = _layer()
    d_out = rng.standard_normal((2, N, E))
    a = mha_vjp(query, key, value, p, d_out, num_heads=H, num_kv_heads=HKV, sinks=np.zeros(H))[4]
    b = mha_vjp(query, key, value, p, d_out, num_heads=H, num_kv_heads=HKV, sinks=np.full(H, 3.0))[4]
    assert np.abs(a).min() > 0 and np.abs(a - b).max() > 1e-3
