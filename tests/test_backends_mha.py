"""Every installed backend's mha against the golden, params as MHAParams or MHAArrays, autodiff
through it (torch autograd, jax.grad), and bad input named after the backend's function.

Tolerances come from `attnspec.spec.tolerance_mha` (derived there); all values here are float64,
where that rule allows the first-order rounding error of the computation (~1e-14 of the output).
"""

from __future__ import annotations

import functools
import re
import warnings

import numpy as np
import pytest

import attnspec.backends as registry
from attnspec import SpecError
from attnspec.backends.base import MHAArrays, Unsupported, spec_signature_mismatches
from attnspec.spec.mha import MHAParams, mha
from attnspec.spec.tolerance import compare
from attnspec.spec.tolerance_mha import mha_golden

INSTALLED = [n for n, a in registry.available().items() if a.installed and n in registry._BUILTINS]


@functools.cache
def backend(name):
    return registry.get(name)


MHA_BACKENDS = [n for n in INSTALLED if "mha" in backend(n).implements]
CONFORMANT = [n for n in MHA_BACKENDS if not n.endswith("-native")]

B, N, M = 2, 4, 6
MODULES = {  # name: (embed_dim, num_heads, num_kv_heads, kdim, vdim, bias)
    "plain": (8, 2, None, None, None, True),
    "no_bias": (12, 3, None, None, None, False),
    "kdim_vdim": (8, 4, None, 5, 3, True),
    "gqa": (12, 6, 2, None, None, True),
    "mqa": (8, 4, 1, 3, 7, False),
}
SCHEMES = ["none", "mask", "bias", "causal", "lower_right_window", "lengths", "empty_row", "combined"]


def _case(module: str, scheme: str, seed: int = 0):
    """(query, key, value, params, options) in float64."""
    e, h, hkv, kdim, vdim, bias = MODULES[module]
    r = np.random.default_rng(seed)
    params = MHAParams.init(e, h, num_kv_heads=hkv, kdim=kdim, vdim=vdim, bias=bias, seed=seed + 1)
    query = r.standard_normal((B, N, e))
    key, value = r.standard_normal((B, M, kdim or e)), r.standard_normal((B, M, vdim or e))
    opts: dict = {"num_heads": h, "num_kv_heads": hkv}
    if scheme == "mask":
        opts["mask"] = r.random((B, h, N, M)) < 0.6
    elif scheme == "bias":
        opts["bias"] = np.where(r.random((N, M)) < 0.2, -np.inf, r.standard_normal((N, M)))
    elif scheme == "causal":
        opts["causal"] = "upper_left"
    elif scheme == "lower_right_window":
        opts.update(causal="lower_right", window=(1, 0), scale=0.4)
    elif scheme == "lengths":
        opts.update(kv_lengths=np.array([3, 6]), q_lengths=np.array([4, 2]))
    elif scheme == "empty_row":
        mask = np.ones((N, M), bool)
        mask[1] = False  # query 1 sees no key: its output is b_o
        opts.update(mask=mask, kv_lengths=np.array([0, 6]))  # batch 0 sees no key at all
    elif scheme == "combined":
        opts.update(mask=r.random((N, M)) < 0.8, causal="upper_left", kv_lengths=np.array([5, 6]))
    return query, key, value, params, opts


def _call(be, query, key, value, params, opts, as_arrays=False, return_weights=True):
    conv = {k: be.asarray(v) if isinstance(v, np.ndarray) else v for k, v in opts.items()}
    prm = be.asparams(params, "float64") if as_arrays else params
    result = be.mha(
        be.asarray(query), be.asarray(key), be.asarray(value), prm, return_weights=return_weights, **conv
    )
    return tuple(be.to_numpy(x) for x in result) if return_weights else be.to_numpy(result)


def _assert_matches(result, query, key, value, params, opts):
    out, w = result
    g = mha_golden(query, key, value, params, **opts)
    assert out.shape == g.out.shape and w.shape == g.weights.shape
    assert out.dtype == w.dtype == np.float64
    c_out, c_w = compare(out, g.out, g.allowed_out), compare(w, g.weights, g.allowed_w)
    assert c_out.ok, f"out: max err {c_out.max_abs_err:.3e} > allowed {g.allowed_out:.3e}"
    assert c_w.ok, f"weights: max err {c_w.max_abs_err:.3e} > allowed {g.allowed_w:.3e}"


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("name", CONFORMANT)
def test_conformant_backend_matches_spec_float64(name, module, scheme):
    query, key, value, params, opts = _case(module, scheme)
    be = backend(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _assert_matches(_call(be, query, key, value, params, opts), query, key, value, params, opts)
        _assert_matches(
            _call(be, query, key, value, params, opts, as_arrays=True), query, key, value, params, opts
        )
        out = _call(be, query, key, value, params, opts, return_weights=False)  # the fused path, if any
    g = mha_golden(query, key, value, params, **opts)
    assert compare(out, g.out, g.allowed_out).ok


@pytest.mark.parametrize("scheme", ["none", "causal", "lengths_keys_only", "bias"])
@pytest.mark.parametrize("module", ["plain", "no_bias", "kdim_vdim"])
def test_torch_native_matches_where_it_expresses_the_call(module, scheme):
    """torch.nn.MultiheadAttention itself agrees with the spec on what it can express, when no row
    is empty and weights are not asked for (its three deviations are declared)."""
    if "torch-native" not in MHA_BACKENDS:
        pytest.skip("torch is not installed here")
    query, key, value, params, opts = _case(module, "lengths" if scheme == "lengths_keys_only" else scheme)
    opts.pop("q_lengths", None)
    if scheme == "bias":
        opts["bias"] = np.random.default_rng(3).standard_normal((B, 1, N, M))  # finite: no empty row
    be = backend("torch-native")
    assert be.supports("mha", **opts) == []
    out = _call(be, query, key, value, params, opts, return_weights=False)
    g = mha_golden(query, key, value, params, **opts)
    assert compare(out, g.out, g.allowed_out).ok


@pytest.mark.parametrize(
    "option, value",
    [
        ("num_kv_heads", 1),
        ("window", (1, 1)),
        ("causal", "lower_right"),
        ("q_lengths", np.array([1, 2])),
        ("scale", 0.5),
    ],
)
def test_torch_native_refuses_what_the_module_cannot_express(option, value):
    if "torch-native" not in MHA_BACKENDS:
        pytest.skip("torch is not installed here")
    be = backend("torch-native")
    query, key, value_, _, opts = _case("plain", "none")
    params = (
        MHAParams.init(8, 2, num_kv_heads=1, seed=0)
        if option == "num_kv_heads"
        else MHAParams.init(8, 2, seed=0)
    )
    opts = {**opts, option: value}
    assert be.supports("mha", **opts)
    with pytest.raises(Unsupported, match=r"^torch-native\.mha: torch\.nn\.MultiheadAttention"):
        _call(be, query, key, value_, params, opts, return_weights=False)


@pytest.mark.parametrize("name", MHA_BACKENDS)
def test_signature_and_bad_input_name_the_backend_function(name):
    be = backend(name)
    assert spec_signature_mismatches(be) == []
    query, key, value, params, _ = _case("plain", "none")
    want = rf"^{re.escape(name)}\.mha: embed_dim=8 must be a positive multiple of num_heads=3"
    with pytest.raises(SpecError, match=want):
        _call(be, query, key, value, params, {"num_heads": 3})
    bad = MHAArrays(**{**vars(be.asparams(params)), "w_o": be.asarray(np.ones((8, 4)))})
    with pytest.raises(
        SpecError, match=rf"^{re.escape(name)}\.mha: params\.w_o\.shape=\(8, 4\) must be \(8, 8\)"
    ):
        be.mha(be.asarray(query), be.asarray(key), be.asarray(value), bad, num_heads=2)
    with pytest.raises(SpecError, match=rf"^{re.escape(name)}\.mha: params must be an MHAParams"):
        be.mha(be.asarray(query), be.asarray(key), be.asarray(value), vars(params), num_heads=2)


# -- autodiff through backend.mha ------------------------------------------------------------


def _finite_difference(params: MHAParams, loss, rng, count=3, h=1e-6):
    """Central differences of ``loss`` for ``count`` entries of each parameter, in float64.

    The truncation error is O(h^2 |f'''|) ~ 1e-12 and the rounding error ~ eps |f| / h ~ 1e-9
    for |f| ~ 10, so 1e-6 of max(1, |g|) separates a right gradient from a wrong one (a wrong
    entry is off by O(1))."""
    found = {}
    for name in ("w_q", "b_q", "w_k", "w_v", "b_v", "w_o", "b_o"):
        x = getattr(params, name)
        if x is None:
            continue
        for _ in range(count):
            idx = tuple(int(rng.integers(s)) for s in x.shape)
            vals = []
            for sign in (1, -1):
                y = x.copy()
                y[idx] += sign * h
                vals.append(loss(MHAParams(**{**vars(params), name: y})))
            found[(name, idx)] = (vals[0] - vals[1]) / (2 * h)
    return found


def _spec_loss(query, key, value, d_out, opts):
    return lambda p: float((mha(query, key, value, p, **opts) * d_out).sum())


def test_torch_autograd_through_mha():
    torch = pytest.importorskip("torch")
    query, key, value, params, opts = _case("gqa", "combined")
    d_out = np.random.default_rng(5).standard_normal((B, N, 12))
    numeric = _finite_difference(params, _spec_loss(query, key, value, d_out, opts), np.random.default_rng(6))
    for name in ("torch", "torch-native") if opts.get("num_kv_heads") is None else ("torch",):
        be = backend(name)
        prm = MHAArrays(
            **{k: None if v is None else v.requires_grad_() for k, v in vars(be.asparams(params)).items()}
        )
        conv = {k: be.asarray(v) if isinstance(v, np.ndarray) else v for k, v in opts.items()}
        out = be.mha(*(torch.from_numpy(x) for x in (query, key, value)), prm, **conv)
        (out * torch.from_numpy(d_out)).sum().backward()
        for (field, idx), g in numeric.items():
            got = getattr(prm, field).grad[idx].item()
            assert abs(got - g) <= 1e-6 * max(1.0, abs(g)), (name, field, idx, got, g)


def test_torch_native_autograd_reaches_the_params():
    torch = pytest.importorskip("torch")
    query, key, value, params, opts = _case("kdim_vdim", "lengths")
    opts.pop("q_lengths")
    d_out = np.random.default_rng(7).standard_normal((B, N, 8))
    numeric = _finite_difference(params, _spec_loss(query, key, value, d_out, opts), np.random.default_rng(8))
    be = backend("torch-native")
    prm = MHAArrays(
        **{k: None if v is None else v.requires_grad_() for k, v in vars(be.asparams(params)).items()}
    )
    conv = {k: be.asarray(v) if isinstance(v, np.ndarray) else v for k, v in opts.items()}
    out = be.mha(*(torch.from_numpy(x) for x in (query, key, value)), prm, **conv)
    (out * torch.from_numpy(d_out)).sum().backward()
    for (field, idx), g in numeric.items():
        assert abs(getattr(prm, field).grad[idx].item() - g) <= 1e-6 * max(1.0, abs(g)), (field, idx)


def test_jax_grad_through_mha():
    jax = pytest.importorskip("jax")
    be = backend("jax")
    query, key, value, params, opts = _case("mqa", "combined")
    d_out = np.random.default_rng(9).standard_normal((B, N, 8))
    numeric = _finite_difference(
        params, _spec_loss(query, key, value, d_out, opts), np.random.default_rng(10)
    )
    conv = {k: be.asarray(v) if isinstance(v, np.ndarray) else v for k, v in opts.items()}
    x = [be.asarray(a) for a in (query, key, value)]

    def loss(prm):
        return (be.mha(*x, prm, **conv) * d_out).sum()

    grads = jax.grad(loss)(be.asparams(params))
    assert isinstance(grads, MHAArrays) and grads.b_q is None  # a pytree with the params' structure
    for (field, idx), g in numeric.items():
        assert abs(float(getattr(grads, field)[idx]) - g) <= 1e-6 * max(1.0, abs(g)), (field, idx)
    # the example of the backend contract: self-attention, a gradient for every parameter
    x32 = be.asarray(query, "float32")
    g32 = jax.grad(lambda prm: be.mha(x32, x32, x32, prm, num_heads=2).sum())(
        be.asparams(MHAParams.init(8, 2, seed=0), "float32")
    )
    assert all(np.isfinite(np.asarray(getattr(g32, f))).all() for f in ("w_q", "w_k", "w_v", "w_o", "b_o"))
