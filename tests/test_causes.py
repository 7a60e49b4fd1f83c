"""The causes a failure names (conformance/causes.py), on outputs that reproduce real behaviours:
each cause is stated only where the case shows it, and a plain numerical error gets none.

The outputs are built in NumPy from the case, as the implementation named in each test computes
them; `_causes` judges them as `conformance/judge.py`'s ``judge_output`` does."""

from __future__ import annotations

import numpy as np
import pytest

from attnspec.backends.compare import sdpa_golden
from attnspec.conformance.causes import CAUSE_PREFIXES, sdpa_causes
from attnspec.conformance.corners import corner_case
from attnspec.conformance.hypothesis_helpers import case_plan, full_visibility

F32_MIN = float(np.finfo(np.float32).min)


def _causes(q, k, v, got, **options) -> list[str]:
    plan, _ = case_plan(q, k, v, options)
    vis = full_visibility(plan, options)
    g = sdpa_golden(q, k, v, **options)
    got64 = np.asarray(got, np.float64)
    with np.errstate(invalid="ignore"):
        assert np.any(~(np.abs(got64 - g.out) <= g.allowed_out)), "the output must fail the case"
    causes = sdpa_causes(plan, vis, q, k, v, got64, g.out, g.allowed_out, bias=options.get("bias"))
    for cause in causes:
        assert cause.startswith(CAUSE_PREFIXES), cause
    return causes


def _attend(q, k, v, vis, bias=None, fill=None, add=False, zero_hidden_values=False, empty_zero=False):
    """Attention in float64, rounded to q's dtype: keys outside ``vis`` excluded, or given the
    logit ``fill`` (added to theirs with ``add``); (B, H, n, dv)."""
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = 0.5 * q64 @ np.swapaxes(k64, -1, -2)  # (B, H, n, m); dk = 4
        if bias is not None:
            s = s + np.where(np.asarray(bias) == -np.inf, 0, np.asarray(bias, np.float64))
        if fill is None:
            s = np.where(vis, s, -np.inf)
        else:
            s = np.where(vis, s, s + fill if add else fill)
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        w = (
            np.nan_to_num(w / w.sum(axis=-1, keepdims=True))
            if fill is None
            else w / w.sum(axis=-1, keepdims=True)
        )
        vals = np.where(zero_hidden_values & ~vis[..., None], 0.0, v64[..., None, :, :])  # (B, H, n, m, dv)
        out = (w[..., None] * vals).sum(axis=-2)
    if empty_zero:
        out = np.where(vis.any(axis=-1, keepdims=True), out, 0.0)
    return out.astype(q.dtype)


def _qkv(n: int, m: int, dtype=np.float32, seed: int = 0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((1, 1, size, 4)).astype(dtype) for size in (n, m, m))


def test_onnx_nan_from_hidden_keys_in_an_empty_row_is_a_leak_not_an_empty_row():
    """ONNX's Attention gives 0 for a row with no visible key, but NaN when a hidden key holds
    NaN (weight 0 times NaN): a leak from the hidden keys. Today's causes said "row with no
    visible key: expected 0, got NaN", sending the author after the empty-row rule."""
    q, k, v = _qkv(3, 4)
    mask = np.array([[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], bool)
    v[..., 3, :] = np.nan  # key 3 is hidden from every row
    vis = np.broadcast_to(mask, (1, 1, 3, 4))
    got = _attend(q, k, v, vis)  # weights 0 for hidden keys (all of row 0's), and 0 * NaN = NaN
    causes = _causes(q, k, v, got, mask=mask)
    assert causes[0].startswith(
        "a hidden key's NaN/inf reached row with no visible key: expected 0, got NaN"
    ), causes
    assert not any(c.startswith("row with no visible key") for c in causes), causes
    assert any(c.startswith("a hidden key's NaN/inf reached visible row") for c in causes), causes


def test_an_empty_row_with_finite_hidden_keys_that_is_nan_keeps_the_empty_row_cause():
    """A -inf fill with no guard gives NaN in a row with no visible key whose keys are finite:
    the empty-row rule, as before."""
    q, k, v = _qkv(2, 4)
    mask = np.array([[0, 0, 0, 0], [1, 1, 0, 1]], bool)
    vis = np.broadcast_to(mask, (1, 1, 2, 4))
    with np.errstate(invalid="ignore"):
        got = _attend(q, k, v, vis, fill=-np.inf)
    assert _causes(q, k, v, got, mask=mask) == [
        "row with no visible key: expected 0, got NaN (rows (0, 0, 0) of (*batch, Hq, n))"
    ]


def test_ort_row_whose_only_visible_key_sits_at_finfo_min_says_it_came_out_0():
    """ONNX Runtime returns 0 for a row whose only visible key has the bias finfo.min: the key is
    treated as hidden. Today's causes said "hidden keys took weight there", which they did not."""
    q, k, v = _qkv(2, 4)
    q[..., 0, :] = 0.0  # row 0's logit is its bias alone, exact (the tolerance charges no rounding for it)
    bias = np.array([[F32_MIN, -np.inf, -np.inf, 0.5], [0.3, -0.2, 1.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 0]], bool)
    vis = np.broadcast_to(mask & (bias != -np.inf), (1, 1, 2, 4))
    got = _attend(q, k, v, vis, bias=bias)
    got[..., 0, :] = 0.0
    causes = _causes(q, k, v, got, mask=mask, bias=bias)
    assert len(causes) == 1 and causes[0].startswith(
        "row with a visible key came out 0, as a row with no visible key would: its visible keys "
        "(logits up to -3.4e+38) were treated as hidden (rows (0, 0, 0)"
    ), causes


def test_paddle_causal_fill_minus_1e4_below_the_visible_logits_names_the_fill():
    """Paddle-style: causal logits filled with -1e4 where the visible logits (q.k) are -16384, so
    the hidden keys take all the weight. Today's cause was generic ("a finite mask fill (-1e4,
    -1e9, finfo.min)"); the fill that matches is -1e4, in place of the logits."""
    q, k, v = _qkv(4, 4)
    q[..., 0], q[..., 1:] = 256.0, 0.0  # every logit is 0.5 * 256 * -128 = -16384, exactly
    k[..., 0] = -128.0
    vis = np.broadcast_to(np.tril(np.ones((4, 4), bool)), (1, 1, 4, 4))
    got = _attend(q, k, v, vis, fill=-1e4)
    causes = _causes(q, k, v, got, causal="upper_left")
    assert causes == [
        "hidden keys took weight there, as under a finite mask fill of -1e4 replacing their "
        "logits (rows (0, 0, 0), (0, 0, 1), (0, 0, 2) of (*batch, Hq, n))"
    ], causes


def test_fill_minus_1e4_below_visible_logits_just_above_it_is_named():
    """Visible logits of -9998, above -1e4: a -1e4 fill gives each hidden key e^-2 of a visible
    one's weight. Today's causes looked only at rows whose logits are all <= -1e4 and said nothing."""
    q, k, v = _qkv(3, 4, np.float64)
    q[..., 0], q[..., 1:] = 4.0, 0.0
    k[..., 0] = -4999.0  # 0.5 * 4 * -4999 = -9998
    vis = np.broadcast_to(np.tril(np.ones((3, 4), bool)), (1, 1, 3, 4))
    got = _attend(q, k, v, vis, fill=-1e4)
    causes = _causes(q, k, v, got, causal="upper_left")
    assert len(causes) == 1 and causes[0].startswith(
        "hidden keys took weight there, as under a finite mask fill of -1e4 replacing their logits"
    ), causes


def test_fill_minus_1e6_is_named_and_told_from_minus_1e4():
    """Rows at bias levels -1e5, -1e6 and -1e7 (q = 0, so the logits are the biases): a -1e6 fill
    leaves the first row alone (which rules out -1e4), halves the second and takes the third."""
    q, k, v = _qkv(3, 4)
    q[:] = 0.0
    levels = np.array([-1e5, -1e6, -1e7])
    bias = np.repeat(levels[:, None], 4, axis=1).astype(np.float32)
    mask = np.array([[1, 1, 0, 0]] * 3, bool)
    vis = np.broadcast_to(mask, (1, 1, 3, 4))
    got = _attend(q, k, v, vis, bias=bias, fill=-1e6)
    causes = _causes(q, k, v, got, mask=mask, bias=bias)
    assert causes == [
        "hidden keys took weight there, as under a finite mask fill of -1e6 replacing their "
        "logits (rows (0, 0, 1), (0, 0, 2) of (*batch, Hq, n))"
    ], causes


def test_textbook_minus_1e9_fill_gives_mean_v_in_an_empty_row():
    """The tutorials' seed 003: -1e9 fill, a row with no visible key gets mean(V) (kept as before)."""
    q, k, v = _qkv(2, 4)
    mask = np.array([[0, 0, 0, 0], [1, 1, 0, 1]], bool)
    got = _attend(q, k, v, np.broadcast_to(mask, (1, 1, 2, 4)), fill=-1e9)
    assert _causes(q, k, v, got, mask=mask) == [
        "row with no visible key: expected 0, got mean(V) over all keys (rows (0, 0, 0) of (*batch, Hq, n))"
    ]


def test_hidden_nan_reaching_a_visible_row_is_named():
    """A -1e9 fill lets a hidden key's NaN value into visible rows (0 * NaN), as before."""
    q, k, v = _qkv(2, 4)
    mask = np.array([[1, 1, 0, 1], [1, 0, 0, 1]], bool)
    v[..., 2, 1] = np.nan
    with np.errstate(invalid="ignore"):
        got = _attend(q, k, v, np.broadcast_to(mask, (1, 1, 2, 4)), fill=-1e9)
    assert _causes(q, k, v, got, mask=mask) == [
        "a hidden key's NaN/inf reached visible row (0, 0, 0), (0, 0, 1)"
    ]


@pytest.mark.parametrize("floor", [False, True], ids=["plain_logits", "logits_below_minus_1e4"])
def test_a_plain_numerical_error_gets_no_cause(floor):
    """An output off by 3x the allowed error, nothing else wrong: no cause, the numbers say it. With
    every visible logit below -1e4 (a bias of -2e4), today's causes blamed a finite mask fill."""
    q, k, v = _qkv(3, 5)
    mask = np.array([[1, 1, 0, 1, 0], [1, 0, 1, 1, 1], [0, 1, 1, 1, 0]], bool)
    options = {"mask": mask}
    if floor:
        options["bias"] = np.full((3, 5), -2e4, np.float32)
    g = sdpa_golden(q, k, v, **options)
    got = (g.out + 3 * g.allowed_out * np.sign(g.out)).astype(np.float32)
    assert _causes(q, k, v, got, **options) == []


def test_patched_minus_1e9_fill_on_the_corner_is_named_with_zeroed_values():
    """The kit's finite_fill_minus_1e9 mutant on corner_finite_floor (float32): -1e9 fill, rows
    with no visible key 0, hidden values zeroed. The -1e9 row takes half the weight; the rows below
    it come out exactly 0, and the same fill explains them."""
    case = corner_case("corner_finite_floor", "float32")
    plan, _ = case_plan(case.q, case.k, case.v, case.options)
    vis = full_visibility(plan, case.options)
    got = _attend(
        case.q,
        case.k,
        case.v,
        vis,
        bias=case.options["bias"],
        fill=-1e9,
        zero_hidden_values=True,
        empty_zero=True,
    )
    causes = _causes(case.q, case.k, case.v, got, **case.options)
    assert len(causes) == 1 and causes[0].startswith(
        "hidden keys took weight there, as under a finite mask fill of -1e9 replacing their logits, their values "
        "zeroed (rows "
    ), causes
