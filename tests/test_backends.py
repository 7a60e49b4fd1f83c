"""Every installed backend against the golden: each spec feature, dtypes, weights, bad input.

Tolerances come from `attnspec.backends.compare` (derived there: K times a same-precision
reference's error plus a floor). Native backends run the same cases; where one shows a declared
deviation the case is a strict xfail naming it, so a deviation that disappears fails here too.
"""

from __future__ import annotations

import functools
import re
import warnings
import zlib

import ml_dtypes
import numpy as np
import pytest

import attnspec.backends as registry
from attnspec import SpecError
from attnspec.backends.base import Backend, Unsupported, spec_signature_mismatches
from attnspec.backends.compare import compare
from attnspec.backends.deviations import DEVIATIONS
from attnspec.spec.bad_inputs import SDPA_BAD_INPUTS

INSTALLED = [n for n, a in registry.available().items() if a.installed and n not in registry.atlas_names()]
BUILTIN = set(registry._BUILTINS)
CONFORMANT = [n for n in INSTALLED if n in BUILTIN and not n.endswith("-native")]
NATIVE = [n for n in INSTALLED if n in BUILTIN and n.endswith("-native")]
NP_DTYPES = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
}


@functools.cache
def backend(name: str) -> Backend:
    return registry.get(name)


def _qkv(r, batch=(2,), hq=4, hkv=2, n=5, m=7, dk=8, dv=8):
    return (
        r.standard_normal((*batch, hq, n, dk)),
        r.standard_normal((*batch, hkv, m, dk)),
        r.standard_normal((*batch, hkv, m, dv)),
    )


def _poison(x, index, value):
    x = x.copy()
    x[index] = value
    return x


def _case(feature: str):
    """(q, k, v, options) in float64; q, k, v and bias are rounded to the dtype by the caller."""
    r = np.random.default_rng(zlib.crc32(feature.encode()))
    q, k, v = _qkv(r)
    opts: dict = {}
    if feature == "plain":
        pass
    elif feature == "mask":
        opts["mask"] = r.random((2, 4, 5, 7)) < 0.6
    elif feature == "mask_broadcast":
        opts["mask"] = r.random((5, 7)) < 0.5
    elif feature == "bias":
        opts["bias"] = r.standard_normal((4, 5, 7))
    elif feature == "bias_neg_inf":
        opts["bias"] = np.where(r.random((5, 7)) < 0.3, -np.inf, r.standard_normal((5, 7)))
    elif feature == "causal_upper_left":
        opts["causal"] = "upper_left"
    elif feature == "causal_lower_right":
        opts["causal"] = "lower_right"
    elif feature in ("causal_upper_left_n_gt_m", "causal_lower_right_n_gt_m"):
        q, k, v = _qkv(r, n=7, m=4)
        opts["causal"] = feature.removeprefix("causal_").removesuffix("_n_gt_m")
    elif feature == "window":
        opts["window"] = (1, 2)
    elif feature == "window_causal_upper_left":
        opts.update(window=(2, 0), causal="upper_left")
    elif feature == "window_lower_right":
        opts.update(window=(2, 0), causal="lower_right")
    elif feature == "kv_lengths":
        opts["kv_lengths"] = np.array([3, 7])
    elif feature == "kv_lengths_zero":
        opts["kv_lengths"] = np.array([0, 4])
    elif feature == "q_lengths":
        opts["q_lengths"] = np.array([5, 2])
    elif feature == "mqa":
        q, k, v = _qkv(r, hq=4, hkv=1)
    elif feature == "mha":
        q, k, v = _qkv(r, hq=3, hkv=3)
    elif feature == "no_visible_row":
        mask = r.random((2, 4, 5, 7)) < 0.7
        mask[0, 1, 2] = mask[1, 3, 0] = False
        bias = r.standard_normal((5, 7))
        bias[4] = -np.inf
        opts.update(mask=mask, bias=bias)
    elif feature == "nonfinite_masked_k":
        k = _poison(_poison(k, (..., 5, slice(None)), np.nan), (..., 6, 0), np.inf)
        opts["kv_lengths"] = np.array([5, 5])
    elif feature == "nonfinite_masked_v":
        v = _poison(_poison(v, (..., 5, slice(None)), np.nan), (..., 6, 0), -np.inf)
        opts["mask"] = np.arange(7) < 5
    elif feature == "nonfinite_bias_hidden_k":
        k = _poison(k, (..., 6, slice(None)), np.nan)
        opts["bias"] = np.where(np.arange(7) < 6, 0.0, -np.inf)
    elif feature == "nonfinite_partly_visible":
        # upper-left causal, n=5: keys 5, 6 are hidden from every row; key 3 only from rows 0-2
        k = _poison(_poison(k, (..., 3, 0), np.nan), (..., 5, 0), np.nan)
        v = _poison(_poison(v, (..., 4, 1), np.inf), (..., 6, slice(None)), np.nan)
        opts["causal"] = "upper_left"
    elif feature == "nonfinite_q":
        q = _poison(_poison(q, (..., 1, 0), np.nan), (..., 3, 2), np.inf)  # rows 1 and 3: NaN
    elif feature == "n_zero":
        q, k, v = _qkv(r, n=0)
    elif feature == "m_zero":
        q, k, v = _qkv(r, m=0)
        opts["causal"] = "lower_right"
    elif feature == "rank_2":
        q, k, v = q[0, 0], k[0, 0], v[0, 0]  # (n, dk), (m, dk), (m, dv)
        opts["causal"] = "lower_right"
    elif feature == "batch_broadcast":
        q = r.standard_normal((3, 1, 4, 5, 8))
        k, v = r.standard_normal((2, 2, 7, 8)), r.standard_normal((1, 2, 2, 7, 8))
        opts["kv_lengths"] = np.array([[7], [3], [5]])  # broadcasts to the batch shape (3, 2)
    elif feature == "dv_lt_dk":
        q, k, v = _qkv(r, dv=3)
        opts.update(mask=r.random((5, 7)) < 0.8, causal="lower_right")
    elif feature == "dv_gt_dk":
        q, k, v = _qkv(r, dk=4, dv=9)
        opts.update(kv_lengths=np.array([6, 2]), window=(1, 1))
    elif feature == "dv_zero":
        q, k, v = _qkv(r, dv=0)
        opts["causal"] = "upper_left"
    elif feature == "scale":
        opts["scale"] = 0.3
    elif feature == "large_logits":
        q = q * 20.0  # logits in the hundreds: only a max-subtracted softmax survives
    elif feature == "everything":
        opts.update(
            mask=r.random((2, 1, 5, 7)) < 0.8,
            bias=r.standard_normal((5, 7)),
            causal="lower_right",
            window=(3, 1),
            kv_lengths=np.array([6, 4]),
            q_lengths=np.array([4, 5]),
            scale=0.7,
        )
    else:
        raise KeyError(feature)
    return q, k, v, opts


FEATURES = [
    "plain",
    "mask",
    "mask_broadcast",
    "bias",
    "bias_neg_inf",
    "causal_upper_left",
    "causal_lower_right",
    "causal_upper_left_n_gt_m",
    "causal_lower_right_n_gt_m",
    "window",
    "window_causal_upper_left",
    "window_lower_right",
    "kv_lengths",
    "kv_lengths_zero",
    "q_lengths",
    "mqa",
    "mha",
    "no_visible_row",
    "nonfinite_masked_k",
    "nonfinite_masked_v",
    "nonfinite_bias_hidden_k",
    "nonfinite_partly_visible",
    "nonfinite_q",
    "n_zero",
    "m_zero",
    "rank_2",
    "batch_broadcast",
    "dv_lt_dk",
    "dv_gt_dk",
    "dv_zero",
    "scale",
    "large_logits",
    "everything",
]
NARROW_FEATURES = [
    "plain",
    "mask",
    "bias_neg_inf",
    "causal_lower_right",
    "no_visible_row",
    "nonfinite_partly_visible",
    "dv_lt_dk",
    "everything",
]
# Weights come from the exact paths (the golden's algorithm in each framework), so a subset that
# touches every visibility rule, empty rows, non-finite values and the shapes is enough.
WEIGHT_FEATURES = [
    "mask",
    "bias_neg_inf",
    "causal_lower_right_n_gt_m",
    "window_lower_right",
    "q_lengths",
    "no_visible_row",
    "nonfinite_partly_visible",
    "m_zero",
    "rank_2",
    "batch_broadcast",
    "everything",
]

# Cases where a native backend shows a declared deviation: (backend, feature or dtype) -> id.
NATIVE_DEVIATES = {
    ("torch-native", "nonfinite_masked_k"): "torch.masked-nonfinite-k",
    ("torch-native", "nonfinite_bias_hidden_k"): "torch.masked-nonfinite-k",
    ("torch-native", "nonfinite_masked_v"): "torch.masked-nonfinite-v",
    ("torch-native", "nonfinite_partly_visible"): "torch.masked-nonfinite-v",
    ("torch-native", "nonfinite_q"): "torch.nonfinite-query-row-zeroed",
    ("jax-native", "float64"): "jax.float64-softmax-in-float32",
    ("jax-native", "kv_lengths_zero"): "jax.empty-row-mean-v",
    ("jax-native", "causal_lower_right_n_gt_m"): "jax.empty-row-mean-v",
    ("jax-native", "no_visible_row"): "jax.neg-inf-bias-row-nan",
    ("jax-native", "nonfinite_masked_v"): "jax.masked-nonfinite-v",
    ("jax-native", "nonfinite_partly_visible"): "jax.masked-nonfinite-v",
    ("jax-native", "nonfinite_bias_hidden_k"): "jax.masked-nonfinite-k-bias",
    ("jax-native", "dv_lt_dk"): "jax.dv-ne-dk-refused",
    ("jax-native", "dv_gt_dk"): "jax.dv-ne-dk-refused",
    ("jax-native", "dv_zero"): "jax.dv-ne-dk-refused",
}


def _rounded(feature: str, dtype: str):
    q, k, v, opts = _case(feature)
    nd = NP_DTYPES[dtype]
    q, k, v = (x.astype(nd) for x in (q, k, v))
    if "bias" in opts:
        opts["bias"] = opts["bias"].astype(nd)
    return q, k, v, opts


def _call(be: Backend, q, k, v, opts, **extra):
    conv = {key: be.asarray(val) if isinstance(val, np.ndarray) else val for key, val in opts.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about kernels it skips
        return be.sdpa(be.asarray(q), be.asarray(k), be.asarray(v), **conv, **extra)


def _check(name: str, feature: str, dtype: str, return_weights: bool = False):
    be = backend(name)
    if reasons := be.supports("sdpa", dtype=dtype, return_weights=return_weights):
        pytest.skip("; ".join(reasons))
    q, k, v, opts = _rounded(feature, dtype)
    result = _call(be, q, k, v, opts, return_weights=return_weights)
    arrays = result if return_weights else (result,)
    for a in arrays:  # framework arrays in the input dtype, not NumPy stand-ins
        assert be.dtype_name(a) == dtype, f"{name}: dtype {be.dtype_name(a)}, but should be {dtype}"
        assert type(a) is type(be.asarray(np.zeros(1))), f"{name} returned {type(a).__name__}"
    host = tuple(be.to_numpy(a) for a in arrays)
    problems = compare(host if return_weights else host[0], q, k, v, return_weights=return_weights, **opts)
    assert not problems, f"{name}.sdpa [{feature}, {dtype}]: " + "; ".join(problems)


# jax's float64 goes through the array API core (jitted, on jax.numpy), which the array_api
# backends run on every feature; a subset keeps the number of JAX compilations down.
CONFORMANT_CASES = [
    (name, dtype, f)
    for name in CONFORMANT
    for dtype in ("float64", "float32")
    for f in (WEIGHT_FEATURES if (name, dtype) == ("jax", "float64") else FEATURES)
]


@pytest.mark.parametrize(("name", "dtype", "feature"), CONFORMANT_CASES)
def test_sdpa_matches_golden(name, dtype, feature):
    _check(name, feature, dtype)


@pytest.mark.parametrize("feature", NARROW_FEATURES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", CONFORMANT)
def test_sdpa_matches_golden_narrow_dtypes(name, dtype, feature):
    _check(name, feature, dtype)


@pytest.mark.parametrize("feature", WEIGHT_FEATURES)
@pytest.mark.parametrize("name", CONFORMANT)
def test_return_weights_match_golden(name, feature):
    _check(name, feature, "float32", return_weights=True)


# Natives: every feature in float32; narrow and float64 on subsets (each JAX case compiles, and
# jax-native's float64 deviates everywhere: `plain` stands for it).
NATIVE_CASES = [(name, "float32", f) for name in NATIVE for f in FEATURES]
NATIVE_CASES += [(name, "bfloat16", f) for name in NATIVE for f in NARROW_FEATURES]
NATIVE_CASES += [
    (name, "float64", f) for name in NATIVE for f in (FEATURES if name == "torch-native" else ["plain"])
]


# Cells where a declared deviation depends on the CPU: torch's CPU flash kernel zeroes a NaN query
# row or propagates the NaN depending on how the keys split into vector lanes, so float64 deviates
# on AVX-512 machines and matches the golden on AVX2 ones. Matching the golden is accepted there.
CPU_DEPENDENT = {("torch-native", "float64", "nonfinite_q")}


@pytest.mark.parametrize(("name", "dtype", "feature"), NATIVE_CASES)
def test_native_matches_golden_unless_a_deviation_is_declared(name, dtype, feature):
    declared = NATIVE_DEVIATES.get((name, feature)) or NATIVE_DEVIATES.get((name, dtype))
    if declared:
        assert declared in {d.deviation_id for d in DEVIATIONS}
        try:
            _check(name, feature, dtype)
        except (AssertionError, Unsupported):
            pytest.xfail(f"declared deviation {declared}")
        if (name, dtype, feature) in CPU_DEPENDENT:
            return  # this CPU takes the conforming kernel path
        pytest.fail(f"{name} [{feature}, {dtype}] now matches the golden: is {declared} stale here?")
    _check(name, feature, dtype)


@pytest.mark.parametrize("case", SDPA_BAD_INPUTS, ids=lambda c: c.id)
@pytest.mark.parametrize("name", INSTALLED)
def test_bad_input_raises_spec_error(name, case):
    be = backend(name)
    (q, k, v), opts = case.build()
    conv = {key: be.asarray(val) if key in ("mask", "bias") else val for key, val in opts.items()}
    with pytest.raises(SpecError, match=case.match) as info:
        be.sdpa(be.asarray(q), be.asarray(k), be.asarray(v), **conv)
    assert str(info.value).startswith(f"{be.name}.sdpa: ")


@pytest.mark.parametrize("name", [n for n in INSTALLED if not n.startswith("array_api")])
def test_foreign_arrays_are_refused_not_converted(name):
    be = backend(name)
    q = be.asarray(np.ones((2, 3)))
    # a NumPy array is the tempting thing to convert silently; for NumPy backends, a list
    foreign = [[1.0, 2.0, 3.0]] if isinstance(q, np.ndarray) else np.ones((2, 3))
    with pytest.raises(SpecError, match=rf"^{re.escape(name)}\.sdpa: k must be a .*, got "):
        be.sdpa(q, foreign, q)


@pytest.mark.parametrize("name", INSTALLED)
def test_lengths_given_as_framework_arrays(name):
    be = backend(name)
    q, k, v, opts = _rounded("kv_lengths", "float32")
    out = be.sdpa(be.asarray(q), be.asarray(k), be.asarray(v), kv_lengths=be.asarray(opts["kv_lengths"]))
    assert not compare(be.to_numpy(out), q, k, v, **opts)
    with pytest.raises(SpecError, match=r"kv_lengths\.dtype=float32 must be an integer dtype"):
        be.sdpa(be.asarray(q), be.asarray(k), be.asarray(v), kv_lengths=be.asarray(np.array(3.0, np.float32)))


@pytest.mark.parametrize("name", INSTALLED)
def test_signature_and_public_names_match_the_spec(name):
    be = backend(name)
    assert spec_signature_mismatches(be) == []
    public = {a for a in dir(type(be)) if not a.startswith("_")}
    assert public == {a for a in dir(Backend) if not a.startswith("_")}, (
        f"{name} adds or lacks public names: every backend exposes the same ones"
    )


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", INSTALLED)
def test_asarray_round_trip_is_exact(name, dtype):
    be = backend(name)
    if dtype not in be.dtypes:
        pytest.skip(f"{name} has no {dtype}")
    x = np.random.default_rng(3).standard_normal((3, 4)) * 100
    a = be.asarray(x, dtype)
    assert be.dtype_name(a) == dtype
    back = be.to_numpy(a)
    assert back.dtype == NP_DTYPES[dtype]
    np.testing.assert_array_equal(back, x.astype(NP_DTYPES[dtype]))  # one rounding, in NumPy
    assert be.dtype_name(be.asarray(np.array([True]))) == "bool"


@pytest.mark.parametrize("name", INSTALLED)
def test_numerics_policy_reports_what_it_sets(name):
    policy = backend(name).numerics_policy()
    assert isinstance(policy, dict)
    if "torch" in name:
        assert policy["torch.backends.cuda.matmul.allow_tf32"] is False
        assert policy["torch.get_float32_matmul_precision"] == "highest"
    if name.startswith("jax"):
        assert policy["jax_default_matmul_precision"] == "highest"
        assert policy["jax_enable_x64"] is True


def test_tolerance_rejects_a_neighbouring_answer():
    # meta-test: the derived tolerance is tight enough to tell the two causal alignments apart
    # and to catch a 1e-3 relative error in float32.
    q, k, v, _ = _rounded("plain", "float32")
    gold_ul = backend("numpy").sdpa(q, k, v, causal="upper_left")
    assert compare(gold_ul, q, k, v, causal="upper_left") == []
    assert compare(gold_ul, q, k, v, causal="lower_right") != []
    assert compare(gold_ul * np.float32(1 + 1e-3), q, k, v, causal="upper_left") != []


def test_compare_catches_every_kit_mutant():
    """The kit's mutants (tests/mutants.py, which the suite must catch) on this file's cases:
    `compare`, the suite's rule, catches each one in some case the control passes."""
    import mutants

    def caught(be):
        found = set()
        for dtype in ("float64", "float32", "bfloat16"):
            for feature in FEATURES:
                q, k, v, opts = _rounded(feature, dtype)
                try:
                    with np.errstate(all="ignore"):
                        bad = compare(be.sdpa(q, k, v, **opts), q, k, v, **opts) != []
                except SpecError:
                    bad = True
                if bad:
                    found.add((feature, dtype))
        return found

    control = caught(mutants.control())
    for name in mutants.MUTANTS:
        assert caught(getattr(mutants, f"mutant_{name}")()) - control, f"mutant {name} passes compare"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_jax_native_lse_is_jaxs_own_residual(dtype):
    """jax-native's lse is return_residual=True of a direct call, only moved to (..., Hq, n):
    same values and dtype, -2.38e38 (not -inf) for the empty row, GQA head order kept."""
    if "jax-native" not in INSTALLED:
        pytest.skip("jax-native is not installed here")
    import jax
    import jax.numpy as jnp

    b = registry.get("jax-native")
    r = np.random.default_rng(0)
    q, k, v = (
        r.standard_normal(s).astype(NP_DTYPES[dtype]) for s in ((2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8))
    )  # (B, H, L, d), Hq = 2 Hkv
    mask = np.ones((3, 5), bool)
    mask[1] = False  # query 1 sees no key
    out, lse = b.sdpa(b.asarray(q), b.asarray(k), b.asarray(v), mask=b.asarray(mask), return_lse=True)
    direct_out, residual = jax.nn.dot_product_attention(
        *(jnp.asarray(x).transpose(0, 2, 1, 3) for x in (q, k, v)),  # (B, L, H, d)
        mask=jnp.asarray(mask)[None, None],
        return_residual=True,
    )  # residual: (B, n, Hq)
    assert lse.dtype == residual.dtype == q.dtype  # jax.lse-in-input-dtype for bfloat16
    # The same values to float32 rounding: jax-native runs the call inside its own jit (transposes
    # and reshapes around it), and XLA:CPU may fuse that program differently from the direct call
    # on some CPUs (measured: 2.4e-7 apart on one machine, bit-equal on another). The empty row's
    # fill is compared exactly: that is the deviation being measured.
    lse_np, res_np = np.asarray(lse, np.float64), np.asarray(residual, np.float64).transpose(0, 2, 1)
    assert np.array_equal(lse_np[..., 1], res_np[..., 1])
    tol = 4 * float(ml_dtypes.finfo(q.dtype).eps)  # a few roundings of q's dtype
    np.testing.assert_allclose(lse_np, res_np, rtol=tol, atol=tol)  # (B, Hq, n)
    np.testing.assert_allclose(
        np.asarray(out, np.float64),
        np.asarray(direct_out, np.float64).transpose(0, 2, 1, 3),
        rtol=tol,
        atol=tol,
    )
    assert np.isfinite(np.asarray(lse, np.float64)[..., 1]).all()  # jax.lse-empty-row-finite
