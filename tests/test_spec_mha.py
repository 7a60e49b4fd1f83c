"""The golden mha: agreement with torch.nn.MultiheadAttention, state dicts, heads, and bad input."""

from __future__ import annotations

import dataclasses
import re

import ml_dtypes
import numpy as np
import pytest

from attnspec import SpecError
from attnspec.spec import sdpa
from attnspec.spec.mha import MHAParams, merge_heads, mha, split_heads

rng = np.random.default_rng(4321)

# torch and the spec both compute in float64 and differ only in summation order: projections
# (sums of <= 12 terms), the logits, the softmax and the output projection, on values of order 1.
# Each contributes a few ulp (~1e-16), so the expected difference is ~1e-15 of the output's scale;
# 1e-12 leaves three decades of margin and still fails for any real error (a wrong head mapping or
# a dropped bias moves the output by ~0.1).
TORCH_RTOL = 1e-12


def scaled_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max(initial=0.0) / max(1.0, np.abs(ref).max(initial=0.0)))


# ---------------------------------------------------------------------------------------------
# (a) torch.nn.MultiheadAttention

B, N, M = 2, 4, 6
MODULES = {  # name: (embed_dim, num_heads, kdim, vdim, bias)
    "packed": (8, 2, None, None, True),
    "packed_no_bias": (12, 3, None, None, False),
    "kdim_vdim": (8, 4, 5, 3, True),
    "kdim_no_bias": (6, 1, 4, None, False),
}
MASKS = [
    "none",
    "key_padding",
    "bool_2d",
    "bool_3d",
    "float_2d",
    "float_kpm_and_float_2d",
    "bool_kpm_and_bool_3d",
]


def torch_module(torch, e, h, kdim, vdim, bias, seed=0):
    module = torch.nn.MultiheadAttention(
        e, h, kdim=kdim, vdim=vdim, bias=bias, batch_first=True, dtype=torch.float64
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():  # torch zeroes the biases; random ones are visible to the test
            p.uniform_(-0.5, 0.5, generator=g)
    return module


def numpy_state_dict(module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy() for k, v in module.state_dict().items()}


def torch_masks(kind: str, h: int):
    """(torch keywords as NumPy, spec keywords) for one masking scheme.

    torch's boolean masks are True = BLOCKED; the spec's mask is True = may attend. Key 0 is never
    blocked so that every row sees a key (the no-visible-key row has its own test).
    """
    blocked_kpm = rng.random((B, M)) < 0.4
    blocked_kpm[:, 0] = False
    blocked_2d = rng.random((N, M)) < 0.4
    blocked_2d[:, 0] = False
    blocked_3d = rng.random((B * h, N, M)) < 0.4
    blocked_3d[..., 0] = False
    float_2d = rng.standard_normal((N, M))
    float_2d[blocked_2d] = -np.inf  # -inf entries: absent keys in both conventions
    float_kpm = np.where(blocked_kpm, -np.inf, rng.standard_normal((B, M)))
    kpm_as_mask = ~blocked_kpm[:, None, None, :]  # (B, 1, 1, m)
    mask_3d = ~blocked_3d.reshape(B, h, N, M)  # torch's (B*H, n, m) is batch-major
    return {
        "none": ({}, {}),
        "key_padding": ({"key_padding_mask": blocked_kpm}, {"mask": kpm_as_mask}),
        "bool_2d": ({"attn_mask": blocked_2d}, {"mask": ~blocked_2d}),
        "bool_3d": ({"attn_mask": blocked_3d}, {"mask": mask_3d}),
        "float_2d": ({"attn_mask": float_2d}, {"bias": float_2d}),
        "float_kpm_and_float_2d": (
            {"attn_mask": float_2d, "key_padding_mask": float_kpm},
            {"bias": float_2d + float_kpm[:, None, None, :]},  # (B, 1, n, m)
        ),
        "bool_kpm_and_bool_3d": (
            {"attn_mask": blocked_3d, "key_padding_mask": blocked_kpm},
            {"mask": mask_3d & kpm_as_mask},
        ),
    }[kind]


def run_torch(torch, module, query, key, value, need_weights=True, **masks):
    t = {k: torch.from_numpy(v) for k, v in masks.items()}
    tq, tk, tv = (torch.from_numpy(x) for x in (query, key, value))
    out, w = module(tq, tk, tv, need_weights=need_weights, average_attn_weights=False, **t)
    return out.detach().numpy(), None if w is None else w.detach().numpy()


def inputs(e, kdim, vdim, n=N, m=M):
    return (
        rng.standard_normal((B, n, e)),
        rng.standard_normal((B, m, kdim or e)),
        rng.standard_normal((B, m, vdim or e)),
    )


@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("shape", MODULES)
def test_matches_torch_multihead_attention(shape, masks):
    torch = pytest.importorskip("torch")
    e, h, kdim, vdim, bias = MODULES[shape]
    module = torch_module(torch, e, h, kdim, vdim, bias)
    params = MHAParams.from_torch_state_dict(numpy_state_dict(module), num_heads=h)
    query, key, value = inputs(e, kdim, vdim)
    torch_kw, spec_kw = torch_masks(masks, h)
    ref, ref_w = run_torch(torch, module, query, key, value, **torch_kw)
    out, w = mha(query, key, value, params, num_heads=h, return_weights=True, **spec_kw)
    assert out.shape == ref.shape == (B, N, e) and w.shape == ref_w.shape == (B, h, N, M)
    assert out.dtype == w.dtype == np.float64
    assert scaled_error(out, ref) <= TORCH_RTOL
    assert scaled_error(w, ref_w) <= TORCH_RTOL


def test_row_with_no_visible_key_torch_nan_spec_zero():
    torch = pytest.importorskip("torch")
    e, h = 8, 2
    module = torch_module(torch, e, h, None, None, True, seed=1)
    params = MHAParams.from_torch_state_dict(numpy_state_dict(module))
    query, key, value = inputs(e, None, None)
    blocked = np.zeros((N, M), bool)
    blocked[2] = True  # query row 2 may attend to no key
    ref, ref_w = run_torch(torch, module, query, key, value, attn_mask=blocked)
    out, w = mha(query, key, value, params, num_heads=h, mask=~blocked, return_weights=True)
    # torch (need_weights=True path): NaN output and weights for the empty row.
    assert np.isnan(ref[:, 2]).all() and np.isnan(ref_w[:, :, 2]).all()
    # the spec: attention output 0, so the layer's output is b_o; weights exactly 0.
    np.testing.assert_array_equal(out[:, 2], np.broadcast_to(params.b_o, (B, e)))
    np.testing.assert_array_equal(w[:, :, 2], 0.0)
    # every other row agrees with torch as usual
    rows = [0, 1, 3]
    assert scaled_error(out[:, rows], ref[:, rows]) <= TORCH_RTOL
    # torch is not consistent with itself: need_weights=False (its SDPA path, autograd on) gives
    # the spec's answer for the empty row. Pinned here so a torch change is noticed.
    ref_sdpa, _ = run_torch(torch, module, query, key, value, need_weights=False, attn_mask=blocked)
    assert scaled_error(ref_sdpa[:, 2], out[:, 2]) <= TORCH_RTOL
    # q_lengths pads query rows the same way: their output is b_o too.
    padded = mha(query, key, value, params, num_heads=h, q_lengths=np.array([4, 1]))
    np.testing.assert_array_equal(padded[1, 1:], np.broadcast_to(params.b_o, (3, e)))


def test_by_hand_single_key():
    # One key: its weight is 1 for every query and head, so each head's output is that key's
    # projected value, and the layer's output is the projected value run through w_o, b_o.
    params = MHAParams.init(6, 3, kdim=4, vdim=5, seed=9)
    query, key, value = (
        rng.standard_normal((2, 3, 6)),
        rng.standard_normal((2, 1, 4)),
        rng.standard_normal((2, 1, 5)),
    )
    out, w = mha(query, key, value, params, num_heads=3, return_weights=True)
    expected = (value @ params.w_v.T + params.b_v) @ params.w_o.T + params.b_o  # (2, 1, 6)
    np.testing.assert_allclose(out, np.broadcast_to(expected, (2, 3, 6)), rtol=0, atol=1e-14)
    np.testing.assert_array_equal(w, 1.0)


# ---------------------------------------------------------------------------------------------
# (b) state dicts


def assert_params_equal(a: MHAParams, b: MHAParams) -> None:
    for name in ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype, name
            np.testing.assert_array_equal(x, y, err_msg=name)


#: torch's state-dict keys: q, k and v packed in one weight, or three (kdim or vdim differ)
_PACKED = "in_proj_weight in_proj_bias out_proj.weight out_proj.bias"
_SEPARATE = "q_proj_weight k_proj_weight v_proj_weight in_proj_bias out_proj.weight out_proj.bias"


@pytest.mark.parametrize(
    "kwargs, packed, keys",
    [
        ({}, None, _PACKED),
        ({"bias": False}, None, "in_proj_weight out_proj.weight"),
        ({"kdim": 3, "vdim": 5}, None, _SEPARATE),
        ({}, False, _SEPARATE),
        (
            {"kdim": 3, "bias": False, "dtype": np.float32},
            None,
            "q_proj_weight k_proj_weight v_proj_weight out_proj.weight",
        ),
    ],
    ids=["packed", "packed_no_bias", "separate", "separate_forced", "separate_no_bias_f32"],
)
def test_state_dict_round_trip(kwargs, packed, keys):
    params = MHAParams.init(8, 2, seed=7, **kwargs)
    sd = params.to_torch_state_dict(packed=packed)
    assert list(sd) == keys.split()
    if "in_proj_weight" in sd:
        assert sd["in_proj_weight"].shape == (24, 8)
        np.testing.assert_array_equal(sd["in_proj_weight"][8:16], params.w_k)  # q, k, v stacked by rows
    back = MHAParams.from_torch_state_dict(sd)
    assert_params_equal(back, params)
    sd["out_proj.weight"][0, 0] = 123.0  # the state dict holds copies, not views of the params
    assert params.w_o[0, 0] != 123.0


@pytest.mark.parametrize("shape", MODULES)
def test_torch_state_dict_round_trip_and_load(shape):
    torch = pytest.importorskip("torch")
    e, h, kdim, vdim, bias = MODULES[shape]
    module = torch_module(torch, e, h, kdim, vdim, bias, seed=3)
    sd = numpy_state_dict(module)
    again = MHAParams.from_torch_state_dict(sd).to_torch_state_dict()
    assert list(again) == list(sd)
    for k in sd:
        np.testing.assert_array_equal(again[k], sd[k], err_msg=k)
    # and an MHAParams made here loads into a fresh torch module of the same configuration
    params = MHAParams.init(e, h, kdim=kdim, vdim=vdim, bias=bias, seed=4)
    fresh = torch_module(torch, e, h, kdim, vdim, bias, seed=5)
    fresh.load_state_dict(
        {k: torch.from_numpy(v) for k, v in params.to_torch_state_dict().items()}, strict=True
    )
    assert_params_equal(MHAParams.from_torch_state_dict(numpy_state_dict(fresh)), params)


def test_init_is_deterministic_and_shaped():
    a = MHAParams.init(12, 4, num_kv_heads=2, kdim=5, vdim=7, seed=11)
    b = MHAParams.init(12, 4, num_kv_heads=2, kdim=5, vdim=7, seed=11)
    assert_params_equal(a, b)
    assert (a.embed_dim, a.kdim, a.vdim, a.kv_dim) == (12, 5, 7, 6)
    assert a.w_k.shape == (6, 5) and a.w_v.shape == (6, 7) and a.b_k.shape == (6,)
    assert np.abs(a.w_q).max() <= np.sqrt(6 / 24)
    assert not np.array_equal(a.w_q, MHAParams.init(12, 4, seed=12).w_q)
    c = MHAParams.init(4, 2, bias=False, seed=0, dtype=ml_dtypes.bfloat16)
    assert c.b_q is None and c.b_o is None and c.w_q.dtype == ml_dtypes.bfloat16


# ---------------------------------------------------------------------------------------------
# (c) heads


def test_split_merge_heads_shapes_and_layout():
    x = rng.standard_normal((2, 3, 5, 12))  # (..., L, H*hd) with H=3, hd=4
    heads = split_heads(x, 3)
    assert heads.shape == (2, 3, 3, 5, 4)  # (..., H, L, hd)
    for h in range(3):
        np.testing.assert_array_equal(heads[..., h, :, :], x[..., h * 4 : (h + 1) * 4])
    np.testing.assert_array_equal(merge_heads(heads), x)
    assert merge_heads(split_heads(x[0, 0], 4)).shape == (5, 12)  # rank 2 in, rank 2 out


@pytest.mark.parametrize(
    "q_batch, kv_batch, out_batch",
    [((), (), ()), ((3,), (3,), (3,)), ((2, 1), (3,), (2, 3)), ((), (2,), (2,))],
)
def test_output_shape_is_query_shape(q_batch, kv_batch, out_batch):
    params = MHAParams.init(8, 4, num_kv_heads=2, kdim=3, vdim=5, seed=1)
    query = rng.standard_normal((*q_batch, 4, 8))
    key = rng.standard_normal((*kv_batch, 6, 3))
    value = rng.standard_normal((*kv_batch, 6, 5))
    out, w = mha(query, key, value, params, num_heads=4, num_kv_heads=2, return_weights=True)
    assert out.shape == (*out_batch, 4, 8) and w.shape == (*out_batch, 4, 4, 6)


def expand_kv(params: MHAParams, num_kv_heads: int, group: int, head_dim: int, tile=False) -> MHAParams:
    """The same layer as plain MHA: each kv head's projection rows repeated for the query heads using it.

    With ``tile=True`` the copies are laid out so that query head h reads kv head h % Hkv instead.
    """

    def rep(x):
        if x is None:
            return None
        x = x.reshape(num_kv_heads, head_dim, *x.shape[1:])  # (Hkv, hd, ...)
        if tile:
            x = np.concatenate([x] * group)  # (H, hd, ...): query head h gets kv head h % Hkv
        else:
            x = np.repeat(x, group, axis=0)  # (H, hd, ...): query head h gets kv head h // G
        return x.reshape(num_kv_heads * group * head_dim, *x.shape[2:])  # (H*hd, ...)

    return dataclasses.replace(
        params, w_k=rep(params.w_k), b_k=rep(params.b_k), w_v=rep(params.w_v), b_v=rep(params.b_v)
    )


@pytest.mark.parametrize("hkv", [1, 2, 3])
def test_gqa_equals_mha_with_repeated_kv_rows(hkv):
    h, e = 6, 12
    params = MHAParams.init(e, h, num_kv_heads=hkv, kdim=5, vdim=4, seed=hkv)
    query = rng.standard_normal((2, 3, e))
    key, value = rng.standard_normal((2, 7, 5)), rng.standard_normal((2, 7, 4))
    mask = rng.random((2, h, 3, 7)) < 0.7
    out, w = mha(query, key, value, params, num_heads=h, num_kv_heads=hkv, mask=mask, return_weights=True)
    full = expand_kv(params, hkv, h // hkv, e // h)
    ref, ref_w = mha(query, key, value, full, num_heads=h, mask=mask, return_weights=True)
    # The same products in a differently shaped matmul: bit-equal on the BLAS we run, but a
    # BLAS may pick another kernel per shape, so allow a few ulp of values of order 1.
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-14)
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-14)
    if hkv > 1:  # reading kv head h % Hkv instead is a different layer
        tiled = expand_kv(params, hkv, h // hkv, e // h, tile=True)
        assert not np.allclose(mha(query, key, value, tiled, num_heads=h, mask=mask), out)


# ---------------------------------------------------------------------------------------------
# (e) identity projections reduce mha to sdpa


def identity_params(e: int) -> MHAParams:
    eye = np.eye(e)
    return MHAParams(w_q=eye, w_k=eye, w_v=eye, w_o=eye)


SDPA_OPTIONS = {
    "plain": {},
    "mask": {"mask": rng.random((5, 7)) < 0.6},
    "bias_and_scale": {"bias": rng.standard_normal((5, 7)), "scale": 0.3},
    "causal_window_lengths": {
        "causal": "lower_right",
        "window": (2, 1),
        "kv_lengths": np.array([6, 3]),
        "q_lengths": np.array([5, 2]),
    },
}


@pytest.mark.parametrize("options", SDPA_OPTIONS)
def test_one_head_identity_projections_equal_sdpa(options):
    kw = SDPA_OPTIONS[options]
    query, key, value = (rng.standard_normal((2, L, 8)) for L in (5, 7, 7))
    out, w = mha(query, key, value, identity_params(8), num_heads=1, return_weights=True, **kw)
    # sdpa on (2, 1, L, 8): one head per batch element
    ref, ref_w = sdpa(query[:, None], key[:, None], value[:, None], return_weights=True, **kw)
    np.testing.assert_array_equal(out, ref[:, 0])
    np.testing.assert_array_equal(w, ref_w)


def test_many_heads_identity_projections_equal_sdpa_on_split_heads():
    query, key, value = (rng.standard_normal((2, L, 8)) for L in (5, 7, 7))
    mask = rng.random((2, 4, 5, 7)) < 0.6  # one mask per head
    out = mha(query, key, value, identity_params(8), num_heads=4, mask=mask, causal="upper_left")
    ref = sdpa(
        split_heads(query, 4), split_heads(key, 4), split_heads(value, 4), mask=mask, causal="upper_left"
    )
    np.testing.assert_array_equal(out, merge_heads(ref))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_low_precision_inputs_are_golden_rounded_once(dtype):
    params = MHAParams.init(8, 2, seed=2)  # float64 parameters, read as they are
    query, key, value = (rng.standard_normal((2, L, 8)).astype(dtype) for L in (3, 5, 5))
    bias = rng.standard_normal((3, 5)).astype(dtype)
    out, w = mha(query, key, value, params, num_heads=2, bias=bias, return_weights=True)
    assert out.dtype == w.dtype == dtype
    f64 = [x.astype(np.float64) for x in (query, key, value)]
    ref, ref_w = mha(*f64, params, num_heads=2, bias=bias.astype(np.float64), return_weights=True)
    np.testing.assert_array_equal(out, ref.astype(dtype))
    np.testing.assert_array_equal(w, ref_w.astype(dtype))


# ---------------------------------------------------------------------------------------------
# (d) bad input

P8 = MHAParams.init(8, 2, seed=0)
P_GQA = MHAParams.init(8, 4, num_kv_heads=2, seed=0)  # kv_dim 4
P_KV = MHAParams.init(8, 2, kdim=3, vdim=5, seed=0)
Q, K, V = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 6, 8)), rng.standard_normal((2, 6, 8))

MHA_BAD = [  # (id, call, message regex); every message starts with "mha: "
    (
        "embed_dim_not_multiple",
        lambda: mha(Q, K, V, P8, num_heads=3),
        r"embed_dim=8 must be a positive multiple of num_heads=3",
    ),
    ("num_heads_zero", lambda: mha(Q, K, V, P8, num_heads=0), r"num_heads=0 must be an int >= 1"),
    ("num_heads_float", lambda: mha(Q, K, V, P8, num_heads=2.0), r"num_heads=2\.0 must be an int >= 1"),
    (
        "heads_not_multiple_of_kv",
        lambda: mha(Q, K, V, P8, num_heads=4, num_kv_heads=3),
        r"num_heads=4 must be a multiple of num_kv_heads=3",
    ),
    (
        "kv_rows_vs_heads",
        lambda: mha(Q, K, V, P_GQA, num_heads=4),
        r"params\.w_k\.shape\[0\]=4 must equal num_kv_heads \* head_dim = 4 \* 2",
    ),
    (
        "kv_rows_vs_kv_heads",
        lambda: mha(Q, K, V, P8, num_heads=2, num_kv_heads=1),
        r"params\.w_k\.shape\[0\]=8 must equal num_kv_heads \* head_dim = 1 \* 4",
    ),
    (
        "query_features",
        lambda: mha(Q[..., :6], K, V, P8, num_heads=2),
        r"query\.shape\[-1\]=6 must equal params\.embed_dim=8",
    ),
    (
        "key_features",
        lambda: mha(Q, K, V[..., :5], P_KV, num_heads=2),
        r"key\.shape\[-1\]=8 must equal params\.kdim=3",
    ),
    (
        "value_features",
        lambda: mha(Q, K[..., :3], V, P_KV, num_heads=2),
        r"value\.shape\[-1\]=8 must equal params\.vdim=5",
    ),
    (
        "key_value_lengths",
        lambda: mha(Q, K, V[:, :5], P8, num_heads=2),
        r"value\.shape\[-2\]=5 must equal key\.shape\[-2\]=6",
    ),
    ("query_rank_1", lambda: mha(Q[0, 0], K, V, P8, num_heads=2), r"query\.ndim=1 must be >= 2"),
    ("key_rank_1", lambda: mha(Q, K[0, 0], V, P8, num_heads=2), r"key\.ndim=1 must be >= 2"),
    ("value_rank_1", lambda: mha(Q, K, V[0, 0], P8, num_heads=2), r"value\.ndim=1 must be >= 2"),
    (
        "mixed_dtypes",
        lambda: mha(Q.astype(np.float32), K, V, P8, num_heads=2),
        r"query, key and value must share one dtype, got query\.dtype=float32",
    ),
    (
        "int_dtype",
        lambda: mha(Q.astype(np.int64), K, V, P8, num_heads=2),
        r"query\.dtype=int64 must be one of",
    ),
    (
        "not_an_array",
        lambda: mha(Q.tolist(), K, V, P8, num_heads=2),
        r"query must be a numpy\.ndarray, got list",
    ),
    (
        "params_type",
        lambda: mha(Q, K, V, {"w_q": P8.w_q}, num_heads=2),
        r"params must be an MHAParams, got dict",
    ),
    (
        "batch_not_broadcast",
        lambda: mha(np.zeros((3, 4, 8)), K, V, P8, num_heads=2),
        r"leading batch dims do not broadcast: query \(3,\), key \(2,\), value \(2,\)",
    ),
    (
        "bias_dtype",
        lambda: mha(Q, K, V, P8, num_heads=2, bias=np.zeros((4, 6), np.float32)),
        r"bias\.dtype=float32 must equal query\.dtype=float64",
    ),
    (
        "mask_shape",
        lambda: mha(Q, K, V, P8, num_heads=2, mask=np.ones((3, 2, 4, 6), bool)),
        r"mask\.shape=\(3, 2, 4, 6\) must broadcast to \(\.\.\., Hq, n, m\)=\(2, 2, 4, 6\)",
    ),
    ("causal_true", lambda: mha(Q, K, V, P8, num_heads=2, causal=True), r"causal=True is not supported"),
    (
        "kv_lengths_too_long",
        lambda: mha(Q, K, V, P8, num_heads=2, kv_lengths=7),
        r"kv_lengths must lie in \[0, m=6\]",
    ),
    (
        "scale_negative",
        lambda: mha(Q, K, V, P8, num_heads=2, scale=-1.0),
        r"scale=-1\.0 must be finite and > 0",
    ),
]


@pytest.mark.parametrize("call, match", [c[1:] for c in MHA_BAD], ids=[c[0] for c in MHA_BAD])
def test_mha_bad_input(call, match):
    with pytest.raises(SpecError, match=match) as info:
        call()
    assert str(info.value).startswith("mha: ")


E8 = np.eye(8)
PARAMS_BAD = [
    (
        "w_q_not_square",
        dict(w_q=np.ones((8, 6)), w_k=E8, w_v=E8, w_o=E8),
        r"w_q\.shape=\(8, 6\) must be \(8, 8\)",
    ),
    (
        "w_v_rows",
        dict(w_q=E8, w_k=E8, w_v=np.ones((4, 8)), w_o=E8),
        r"w_v\.shape=\(4, 8\) must be \(8, 8\), i\.e\. \(w_k\.shape\[0\], vdim\)",
    ),
    ("w_o_shape", dict(w_q=E8, w_k=E8, w_v=E8, w_o=np.ones((8, 4))), r"w_o\.shape=\(8, 4\) must be \(8, 8\)"),
    (
        "b_k_length",
        dict(w_q=E8, w_k=E8, w_v=E8, w_o=E8, b_k=np.zeros(7)),
        r"b_k\.shape=\(7,\) must be \(8,\)",
    ),
    ("weight_rank", dict(w_q=E8, w_k=np.ones(8), w_v=E8, w_o=E8), r"w_k\.ndim=1 must be 2"),
    ("int_weight", dict(w_q=E8, w_k=E8.astype(int), w_v=E8, w_o=E8), r"w_k\.dtype=int64 must be one of"),
    (
        "not_array",
        dict(w_q=E8, w_k=E8, w_v=E8, w_o=E8, b_o=[0.0] * 8),
        r"b_o must be a numpy\.ndarray, got list",
    ),
]


@pytest.mark.parametrize("fields, match", [c[1:] for c in PARAMS_BAD], ids=[c[0] for c in PARAMS_BAD])
def test_params_bad_input(fields, match):
    with pytest.raises(SpecError, match=match) as info:
        MHAParams(**fields)
    assert str(info.value).startswith("MHAParams: ")


GOOD_SD = P8.to_torch_state_dict()
SD_BAD = [
    (
        "bias_kv",
        {**GOOD_SD, "bias_k": np.zeros((1, 1, 8)), "bias_v": np.zeros((1, 1, 8))},
        {},
        r"bias_k and bias_v \(from add_bias_kv=True\) are not supported",
    ),
    ("add_zero_attn", GOOD_SD, {"add_zero_attn": True}, r"add_zero_attn=True is not supported"),
    ("unknown_key", {**GOOD_SD, "attn.extra": np.zeros(1)}, {}, r"unknown keys \['attn\.extra'\]"),
    (
        "both_layouts",
        {**GOOD_SD, "q_proj_weight": E8},
        {},
        r"unknown keys \['q_proj_weight'\] for the packed",
    ),
    (
        "missing_key",
        {k: v for k, v in GOOD_SD.items() if k != "out_proj.weight"},
        {},
        r"missing keys \['out_proj\.weight'\]",
    ),
    (
        "missing_separate",
        {"q_proj_weight": E8, "out_proj.weight": E8},
        {},
        r"missing keys \['k_proj_weight', 'v_proj_weight'\]",
    ),
    (
        "packed_shape",
        {**GOOD_SD, "in_proj_weight": np.ones((23, 8))},
        {},
        r"in_proj_weight\.shape=\(23, 8\) must be \(3 \* embed_dim, embed_dim\)",
    ),
    (
        "in_proj_bias_shape",
        {**GOOD_SD, "in_proj_bias": np.zeros(8)},
        {},
        r"in_proj_bias\.shape=\(8,\) must be \(3 \* embed_dim,\) with embed_dim=8",
    ),
    (
        "k_rows",
        {"q_proj_weight": E8, "k_proj_weight": np.ones((4, 3)), "v_proj_weight": E8, "out_proj.weight": E8},
        {},
        r"k_proj_weight\.shape=\(4, 3\) must be \(embed_dim=8, kdim\)",
    ),
    ("weight_rank", {**GOOD_SD, "out_proj.weight": np.ones(8)}, {}, r"out_proj\.weight\.ndim=1 must be 2"),
    (
        "not_array",
        {**GOOD_SD, "out_proj.bias": [0.0] * 8},
        {},
        r"out_proj\.bias must be a numpy\.ndarray, got list",
    ),
    ("num_heads", GOOD_SD, {"num_heads": 3}, r"embed_dim=8 must be a positive multiple of num_heads=3"),
]


@pytest.mark.parametrize("sd, kw, match", [c[1:] for c in SD_BAD], ids=[c[0] for c in SD_BAD])
def test_from_torch_state_dict_bad_input(sd, kw, match):
    with pytest.raises(SpecError, match=match) as info:
        MHAParams.from_torch_state_dict(sd, **kw)
    assert str(info.value).startswith("MHAParams.from_torch_state_dict: ")


def test_to_torch_state_dict_refusals():
    fn = re.escape("MHAParams.to_torch_state_dict: ")
    with pytest.raises(
        SpecError, match=fn + r"kv_dim=w_k\.shape\[0\]=4 must equal embed_dim=8: .* no grouped"
    ):
        P_GQA.to_torch_state_dict()
    with pytest.raises(
        SpecError, match=fn + r"packed=True needs kdim == vdim == embed_dim=8, got kdim=3, vdim=5"
    ):
        P_KV.to_torch_state_dict(packed=True)
    some = MHAParams(w_q=E8, b_q=np.zeros(8), w_k=E8, w_v=E8, w_o=E8, b_o=np.zeros(8))
    with pytest.raises(
        SpecError, match=fn + r".*all four projections or none; got b_q, b_o set and b_k, b_v None"
    ):
        some.to_torch_state_dict()


def test_init_and_heads_helpers_refuse_bad_input():
    with pytest.raises(
        SpecError, match=r"^MHAParams\.init: embed_dim=10 must be a positive multiple of num_heads=4"
    ):
        MHAParams.init(10, 4, seed=0)
    with pytest.raises(
        SpecError, match=r"^MHAParams\.init: num_heads=4 must be a multiple of num_kv_heads=3"
    ):
        MHAParams.init(12, 4, num_kv_heads=3, seed=0)
    with pytest.raises(SpecError, match=r"^MHAParams\.init: dtype=int32 must be one of"):
        MHAParams.init(8, 2, seed=0, dtype=np.int32)
    with pytest.raises(SpecError, match=r"^split_heads: x\.shape\[-1\]=6 must be a multiple of num_heads=4"):
        split_heads(np.zeros((2, 6)), 4)
    with pytest.raises(SpecError, match=r"^merge_heads: x\.ndim=2 must be >= 3"):
        merge_heads(np.zeros((2, 6)))
