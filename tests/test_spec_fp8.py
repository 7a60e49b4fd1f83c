"""`attnspec.spec.sdpa_fp8` and its tolerance (`attnspec.spec.tolerance_fp8`).

The definition is checked against an independent float64 computation: FP8 values decoded from
their bits by formula (no ml_dtypes cast), descales applied by hand per query head, and
`attnspec.spec.sdpa_loops`. The tolerance is checked from both sides: a float32-accumulating
torch computation stays within it on many seeds, and each mutant of tests/mutants_fp8.py leaves it.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from mutants_fp8 import FP8Kernel, control, mutant_descale_twice, mutant_forget_descale, mutant_p_e4m3

from attnspec.conformance.fp8_cases import FP8Case, fp8_cases
from attnspec.spec import SpecError, sdpa_fp8, sdpa_loops
from attnspec.spec.dtypes import round_to
from attnspec.spec.fp8 import FP8_DTYPES, FP8_NUMPY
from attnspec.spec.tolerance import compare
from attnspec.spec.tolerance_fp8 import fp8_golden

#: (exponent bits, mantissa bits, exponent bias) of each FP8 format
FORMATS = {"float8_e4m3fn": (4, 3, 7), "float8_e5m2": (5, 2, 15)}


def decode(x: np.ndarray) -> np.ndarray:
    """FP8 values as float64, from their bits by the format's formula (NaN and inf included)."""
    e_bits, m_bits, bias = FORMATS[x.dtype.name]
    bits = x.view(np.uint8).astype(np.int64)
    sign = np.where(bits >> 7, -1.0, 1.0)
    exp = (bits >> m_bits) & ((1 << e_bits) - 1)
    man = bits & ((1 << m_bits) - 1)
    value = np.where(
        exp == 0, man / 2**m_bits * 2.0 ** (1 - bias), (1 + man / 2**m_bits) * 2.0 ** (exp - bias)
    )
    top = (1 << e_bits) - 1
    if x.dtype.name == "float8_e5m2":  # IEEE-like: the top exponent is inf (man 0) or NaN
        value = np.where(exp == top, np.where(man == 0, np.inf, np.nan), value)
    else:  # e4m3fn: no inf; only S.1111.111 is NaN
        value = np.where((exp == top) & (man == (1 << m_bits) - 1), np.nan, value)
    return sign * value


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_decode_agrees_with_ml_dtypes_on_every_bit_pattern(dtype):
    every = np.arange(256, dtype=np.uint8).view(FP8_NUMPY[dtype])
    ours, theirs = decode(every), every.astype(np.float64)
    assert np.array_equal(ours, theirs, equal_nan=True)


def _inputs(rng, dtype, batch=(2,), hkv=2, group=3, n=5, m=7, dk=8, wide_q=None):
    fp8 = FP8_NUMPY[dtype]
    hq = hkv * group
    q = rng.standard_normal((*batch, hq, n, dk)) * 2
    q = q.astype(np.dtype(wide_q)) if wide_q else q.astype(fp8)
    k = (rng.standard_normal((*batch, hkv, m, dk)) * 2).astype(fp8)
    v = rng.standard_normal((*batch, hkv, m, dk)).astype(fp8)
    ds = [np.exp2(rng.uniform(-4, 4, (*batch, hkv))).astype(np.float32) for _ in range(3)]
    return q, k, v, ds


@pytest.mark.parametrize("dtype", FP8_DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_definition_is_dequantise_then_golden(dtype, seed):
    """x_hat by hand (bits decoded, q head h scaled by its kv head h // G's descale), then
    sdpa_loops in float64: the same numbers as sdpa_fp8 in float64 and in bfloat16."""
    rng = np.random.default_rng(seed)
    q, k, v, (qd, kd, vd) = _inputs(rng, dtype)
    options = dict(
        causal="lower_right_lengths", kv_lengths=np.array([7, 4]), window=(3, 1), softcap=6.0, scale=0.4
    )
    G = 3
    q_hat = np.empty(q.shape)
    for h in range(q.shape[1]):
        q_hat[:, h] = decode(q[:, h]) * qd[:, h // G, None, None].astype(np.float64)
    k_hat = decode(k) * kd[..., None, None].astype(np.float64)
    v_hat = decode(v) * vd[..., None, None].astype(np.float64)
    want, want_lse = sdpa_loops(q_hat, k_hat, v_hat, return_lse=True, **options)
    for out_dtype in ("float64", "bfloat16"):
        got, lse = sdpa_fp8(
            q, k, v, q_descale=qd, k_descale=kd, v_descale=vd, out_dtype=out_dtype, return_lse=True, **options
        )
        assert got.dtype.name == out_dtype and lse.dtype.name == (
            "float64" if out_dtype == "float64" else "float32"
        )
        if out_dtype == "float64":
            np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(lse, want_lse, rtol=1e-13)
        else:  # one rounding of (nearly) the same float64 value: equal but at rounding ties
            close = np.isclose(
                got.astype(np.float64), round_to(want, "bfloat16").astype(np.float64), rtol=2**-8, atol=0
            )
            assert close.all()


def test_wide_q_and_defaults():
    """A float16 q over an FP8 KV cache: no q descale, out in q's dtype by default; an FP8 q's
    default out is bfloat16; None descales are 1."""
    rng = np.random.default_rng(7)
    q, k, v, (_, kd, vd) = _inputs(rng, "float8_e4m3fn", wide_q="float16")
    out = sdpa_fp8(q, k, v, k_descale=kd, v_descale=vd)
    assert out.dtype == np.float16
    q8 = q.astype(ml_dtypes.float8_e4m3fn)
    assert sdpa_fp8(q8, k, v).dtype == ml_dtypes.bfloat16
    plain = sdpa_fp8(q8, k, v, out_dtype="float64")
    ones = np.ones((2, 2), np.float32)
    assert np.array_equal(
        plain, sdpa_fp8(q8, k, v, q_descale=ones, k_descale=1.0, v_descale=ones, out_dtype="float64")
    )


def _bad_inputs():
    rng = np.random.default_rng(0)
    q, k, v, (qd, kd, _) = _inputs(rng, "float8_e4m3fn")
    e5 = v.astype(np.float64).astype(ml_dtypes.float8_e5m2)
    f32 = q.astype(np.float32)
    return [
        ("k", dict(k=k.astype(np.float32)), r"k\.dtype=float32 must be one of float8_e4m3fn, float8_e5m2"),
        (
            "v",
            dict(v=e5),
            r"k and v must share one FP8 dtype, got k\.dtype=float8_e4m3fn, v\.dtype=float8_e5m2",
        ),
        ("q", dict(q=q.astype(np.float64)), r"q\.dtype=float64 must be k\.dtype=float8_e4m3fn or one of"),
        (
            "q",
            dict(q=q.astype(np.float64).astype(ml_dtypes.float8_e5m2)),
            r"q\.dtype=float8_e5m2 must be k\.dtype",
        ),
        ("q_descale", dict(q=f32, q_descale=qd), r"q_descale was given, but q\.dtype=float32 is not FP8"),
        ("k_descale", dict(k_descale=kd.astype(np.float64)), r"k_descale\.dtype=float64 must be float32"),
        (
            "v_descale",
            dict(v_descale=np.ones((3, 2), np.float32)),
            r"v_descale\.shape=\(3, 2\) must broadcast to \(\.\.\., Hkv\)=\(2, 2\)",
        ),
        (
            "q_descale",
            dict(q_descale=np.float32(0.0)),
            r"q_descale must be finite and > 0, got values in \[0\.0",
        ),
        ("k_descale", dict(k_descale=np.array([1, np.nan], np.float32)), r"k_descale must be finite and > 0"),
        ("v_descale", dict(v_descale=-2.0), r"v_descale must be finite and > 0"),
        ("k_descale", dict(k_descale="1"), r"k_descale must be a float32 array broadcastable .* got str"),
        (
            "out_dtype",
            dict(out_dtype="float8_e4m3fn"),
            r"out_dtype='float8_e4m3fn' must be None or one of float16",
        ),
        ("bias", dict(bias=np.zeros((5, 7), np.float64)), r"bias\.dtype=float64 must be float32"),
        ("window", dict(window=(-1, 0)), r"window=\(-1, 0\) must have left >= 0"),
    ]


@pytest.mark.parametrize(
    "name, change, message", _bad_inputs(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_bad_input_names_its_argument(name, change, message):
    rng = np.random.default_rng(0)
    q, k, v, _ = _inputs(rng, "float8_e4m3fn")
    args = {"q": q, "k": k, "v": v, **change}
    with pytest.raises(SpecError) as exc:
        sdpa_fp8(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    text = str(exc.value)
    assert text.startswith("sdpa_fp8: ") and name in text
    assert re.search(message, text), text


# -- the tolerance, from both sides ---------------------------------------------------------------


def _draws(dtype: str, count: int) -> list[FP8Case]:
    found: list[FP8Case] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None)
    @given(fp8_cases(dtype))
    def collect(case):
        found.append(case)

    collect()
    return found


def _torch_f32(case: FP8Case):
    """sdpa_fp8 as a float32 kernel that dequantises: stored values to float32 times the descale
    (rounded to float32), torch's math SDPA in float32, cast to out_dtype."""
    o = case.options
    from attnspec.spec.fp8 import dequantize, plan_fp8

    fp = plan_fp8("t", case.q, case.k, case.v, o)
    hats = [torch.from_numpy(x.astype(np.float32)) for x in dequantize(fp, case.q, case.k, case.v)]
    p = fp.sdpa
    from attnspec.spec.masks import visibility

    vis = visibility(
        p.n, p.m, causal=p.causal, window=p.window, q_lengths=p.q_lengths, kv_lengths=p.kv_lengths
    )
    q, k, v = hats
    k, v = (x.repeat_interleave(p.group, dim=-3) for x in (k, v))
    s = (q @ k.transpose(-1, -2)) * p.scale  # (..., Hq, n, m)
    if p.softcap:
        s = p.softcap * torch.tanh(s / p.softcap)
    if vis is not None:
        s = s.masked_fill(~torch.from_numpy(np.ascontiguousarray(vis)), -torch.inf)
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no visible key: 0
    out = (w @ v).double().numpy()
    return round_to(out, fp.out_dtype).reshape(p.out_shape)


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_cases_are_what_the_suite_promises(dtype):
    """out_dtype float32 in at least a third of the draws, descales never 1 and not all powers of
    two, nothing saturated (no NaN, no inf), GQA, peaked rows, wide q and lengths all drawn."""
    cases = _draws(dtype, 60)
    assert sum(c.options["out_dtype"] == "float32" for c in cases) >= len(cases) / 3
    descales = np.concatenate(
        [
            np.ravel(c.options[d])
            for c in cases
            for d in ("q_descale", "k_descale", "v_descale")
            if d in c.options
        ]
    )
    assert (descales != 1).all() and (np.log2(descales) % 1 != 0).any()
    assert all(
        np.isfinite(c.k.astype(np.float64)).all() and np.isfinite(c.q.astype(np.float64)).all() for c in cases
    )
    tags = set().union(*(c.tags for c in cases))
    assert {"gqa", "peaked", "wide_q", "causal_lower_right_lengths", "window", "softcap", "scale"} <= tags


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_budget_holds_for_float32_kernels_and_rejects_each_mutant(dtype):
    """Over 60 drawn cases: torch in float32 and the FA3-style control stay within the budget on
    every case; each mutant leaves it on some case (P rounding: on some float32-output case)."""
    cases = _draws(dtype, 60)
    kernels = {
        "control": control(),
        "forget_descale": mutant_forget_descale(),
        "descale_twice": mutant_descale_twice(),
        "p_e4m3": mutant_p_e4m3(),
    }
    failed = {name: 0 for name in kernels}
    worst_torch, p_f32_caught = 0.0, 0
    for case in cases:
        g = fp8_golden(case.q, case.k, case.v, **case.options)
        c = compare(_torch_f32(case), g.out, g.allowed_out)
        assert c.ok, (case.describe(), c)
        worst_torch = max(worst_torch, c.budget_used)
        for name, kernel in kernels.items():
            out = FP8Kernel.sdpa_fp8(kernel, case.q, case.k, case.v, **case.options)
            out = out[0] if isinstance(out, tuple) else out
            ok = compare(out, g.out, g.allowed_out).ok
            failed[name] += not ok
            p_f32_caught += name == "p_e4m3" and not ok and case.options["out_dtype"] == "float32"
    assert failed["control"] == 0, failed
    for name in ("forget_descale", "descale_twice", "p_e4m3"):
        assert failed[name] >= 5, failed
    assert p_f32_caught >= 5, p_f32_caught
    assert worst_torch < 1.0


def test_e4m3_claim_widens_the_budget_to_fa3_rounding():
    """Under the e4m3 claim the reference rounds P, so the P-rounding kernel passes every case that
    it fails under the float32 claim; the budget grows by about e4m3's 2**-4, no more."""
    kernel = mutant_p_e4m3()
    for case in _draws("float8_e4m3fn", 30):
        g32 = fp8_golden(case.q, case.k, case.v, **case.options)
        g8 = fp8_golden(case.q, case.k, case.v, p_precision="float8_e4m3fn", **case.options)
        out = FP8Kernel.sdpa_fp8(kernel, case.q, case.k, case.v, **case.options)
        out = out[0] if isinstance(out, tuple) else out
        assert compare(out, g8.out, g8.allowed_out).ok, case.describe()
        assert g8.allowed_out >= g32.allowed_out
        V = max(float(np.abs(case.v.astype(np.float64)).max()), 1e-30) * 16  # descales <= 2**4
        assert g8.allowed_out <= 4 * 2**-4 * V + g32.allowed_out
