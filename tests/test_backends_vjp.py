"""The autodiff backends' vjps refuse bad input under their own name, and every backend's
``implements`` agrees with ``supports`` about the vjps.

Each bad call must raise SpecError whose message starts with ``<backend>.<vjp>: `` (not the
forward's ``<backend>.mha: ``) and says what was received and what was expected, d_out included.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import attnspec.backends as registry
from attnspec import SpecError
from attnspec.backends._vjp import FORWARD
from attnspec.backends.base import spec_signature_mismatches
from attnspec.conformance.lsh_cases import LSH_BAD_INPUTS
from attnspec.spec.bad_inputs import MHA_BAD_INPUTS, SDPA_BAD_INPUTS
from attnspec.spec.lsh import lsh_rotations
from attnspec.spec.mha import MHAParams

INSTALLED = [n for n, a in registry.available().items() if a.installed and n in registry._BUILTINS]
AUTODIFF = [n for n in ("torch", "jax") if n in INSTALLED]


@functools.cache
def backend(name):
    return registry.get(name)


def _raises(be, fn: str, match: str, call) -> None:
    with pytest.raises(SpecError) as info:
        call()
    text = str(info.value)
    assert text.startswith(f"{be.name}.{fn}: "), f"{text!r} does not start with '{be.name}.{fn}: '"
    assert re.search(match, text), f"{text!r} does not match {match!r}"


# -- mha_vjp ------------------------------------------------------------------------------------


def _mha_call(be, query, key, value, params, d_out, options):
    a = lambda x: be.asarray(x) if isinstance(x, np.ndarray) else x  # noqa: E731
    return lambda: be.mha_vjp(
        a(query), a(key), a(value), params, d_out, **{k: a(v) for k, v in options.items()}
    )


@pytest.mark.parametrize("name", AUTODIFF)
@pytest.mark.parametrize("bad", [b for b in MHA_BAD_INPUTS if b.params != "dict"], ids=lambda b: b.id)
def test_mha_vjp_bad_input_names_the_vjp(name, bad):
    be = backend(name)
    (query, key, value), params, options = bad.build()
    d_out = be.asarray(np.zeros((*query.shape[:-1], 8), np.float32))
    _raises(
        be,
        "mha_vjp",
        bad.match,
        _mha_call(be, query, key, value, be.asparams(params, "float32"), d_out, options),
    )


def _good_mha():
    rng = np.random.default_rng(0)
    x = [rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 8), (2, 6, 8), (2, 6, 8))]
    return x, MHAParams.init(8, 2, seed=0, dtype=np.float32)


@pytest.mark.parametrize("name", AUTODIFF)
def test_mha_vjp_refuses_a_wrong_d_out(name):
    be = backend(name)
    (query, key, value), params = _good_mha()
    prm = be.asparams(params, "float32")
    cases = [
        (
            np.zeros((2, 4, 6), np.float32),
            r"d_out\.shape=\(2, 4, 6\) must equal the output shape \(2, 4, 8\)",
        ),
        (np.zeros((2, 4, 8), np.float64), r"d_out\.dtype=float64 must equal query\.dtype=float32"),
    ]
    for d_out, match in cases:
        _raises(
            be, "mha_vjp", match, _mha_call(be, query, key, value, prm, be.asarray(d_out), {"num_heads": 2})
        )
    _raises(
        be,
        "mha_vjp",
        r"d_out must be a .*, got numpy\.ndarray",
        _mha_call(be, query, key, value, prm, np.zeros((2, 4, 8), np.float32), {"num_heads": 2}),
    )
    _raises(
        be,
        "mha_vjp",
        r"params must be an MHAArrays .*got MHAParams",
        _mha_call(
            be, query, key, value, params, be.asarray(np.zeros((2, 4, 8), np.float32)), {"num_heads": 2}
        ),
    )


# -- lsh_attention_vjp --------------------------------------------------------------------------


def _lsh_call(be, x, v, rot, d_out, options):
    a = lambda y: be.asarray(y) if isinstance(y, np.ndarray) else y  # noqa: E731
    return lambda: be.lsh_attention_vjp(
        a(x), a(v), d_out, rotations=a(rot), **{k: a(o) for k, o in options.items()}
    )


@pytest.mark.parametrize("name", AUTODIFF)
@pytest.mark.parametrize("bad", LSH_BAD_INPUTS, ids=lambda b: b.id)
def test_lsh_attention_vjp_bad_input_names_the_vjp(name, bad):
    be = backend(name)
    (x, v, rot), options = bad.build()
    d_out = be.asarray(np.zeros(v.shape, np.float32))
    _raises(be, "lsh_attention_vjp", bad.match, _lsh_call(be, x, v, rot, d_out, options))


@pytest.mark.parametrize("name", AUTODIFF)
def test_lsh_attention_vjp_refuses_a_wrong_d_out(name):
    be = backend(name)
    rng = np.random.default_rng(0)
    x, v = (
        rng.standard_normal((2, 8, 4)).astype(np.float32),
        rng.standard_normal((2, 8, 3)).astype(np.float32),
    )
    rot = lsh_rotations(0, 4, 2, 4)
    opts = {"chunk_length": 4}
    for d_out, match in [
        (
            np.zeros((2, 8, 4), np.float32),
            r"d_out\.shape=\(2, 8, 4\) must equal the output shape \(2, 8, 3\)",
        ),
        (np.zeros((2, 8, 3), np.float16), r"d_out\.dtype=float16 must equal x\.dtype=float32"),
    ]:
        _raises(be, "lsh_attention_vjp", match, _lsh_call(be, x, v, rot, be.asarray(d_out), opts))
    _raises(
        be,
        "lsh_attention_vjp",
        r"d_out must be a .*, got numpy\.ndarray",
        _lsh_call(be, x, v, rot, np.zeros((2, 8, 3), np.float32), opts),
    )


# -- sdpa_vjp -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", AUTODIFF)
@pytest.mark.parametrize("bad", SDPA_BAD_INPUTS, ids=lambda b: b.id)
def test_sdpa_vjp_bad_input_names_the_vjp(name, bad):
    be = backend(name)
    (q, k, v), options = bad.build()
    a = lambda x: be.asarray(x) if isinstance(x, np.ndarray) else x  # noqa: E731
    d_out = be.asarray(np.zeros((*q.shape[:-1], v.shape[-1]), np.float32))
    _raises(
        be,
        "sdpa_vjp",
        bad.match,
        lambda: be.sdpa_vjp(a(q), a(k), a(v), d_out, **{k_: a(o) for k_, o in options.items()}),
    )


@pytest.mark.parametrize("name", AUTODIFF)
@pytest.mark.parametrize("n", [5, 0])  # 0: the empty case returns zeros without a forward, still checked
def test_sdpa_vjp_refuses_a_wrong_d_out(name, n):
    be = backend(name)
    rng = np.random.default_rng(0)
    q, k, v = (
        be.asarray(rng.standard_normal(s).astype(np.float32)) for s in ((2, n, 8), (2, 7, 8), (2, 7, 4))
    )
    _raises(
        be,
        "sdpa_vjp",
        rf"d_out\.shape=\(2, {n}, 8\) must equal the output shape \(2, {n}, 4\)",
        lambda: be.sdpa_vjp(q, k, v, be.asarray(np.zeros((2, n, 8), np.float32))),
    )
    _raises(
        be,
        "sdpa_vjp",
        r"d_out\.dtype=float64 must equal q\.dtype=float32",
        lambda: be.sdpa_vjp(q, k, v, be.asarray(np.zeros((2, n, 4), np.float64))),
    )


# -- implements vs supports ---------------------------------------------------------------------


@pytest.mark.parametrize("name", INSTALLED)
def test_vjps_in_implements_exactly_when_supported(name):
    """A vjp is in ``implements`` iff its forward is, and then `supports` accepts it; otherwise
    `supports` gives a reason that names the vjp."""
    be = backend(name)
    for vjp, forward in FORWARD.items():
        reasons = be.supports(vjp)
        if vjp in be.implements:
            assert forward in be.implements, f"{name} lists {vjp} without {forward}"
            assert reasons == [], f"{name} lists {vjp} in implements, but supports refuses it: {reasons}"
        else:
            assert reasons and any(vjp in r for r in reasons), f"{name}.supports({vjp!r}) = {reasons}"
    assert spec_signature_mismatches(be) == []


# -- torch's own kernels on rows with no visible key --------------------------------------------


@pytest.mark.parametrize("kind", ["bool_mask", "neg_inf_bias"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("kernel", ["MATH", "FLASH_ATTENTION"])
def test_torch_kernels_give_the_spec_gradients_for_a_row_with_no_visible_key(kernel, dtype, kind):
    """Each CPU kernel of F.scaled_dot_product_attention, forced with sdpa_kernel, matches the
    golden sdpa_vjp on a row that sees no key and a key no row sees: zero dq for the row, zero
    dk/dv for the key, nothing NaN. (JAX does not: jax.empty-row-grad-into-masked-values and
    jax.neg-inf-bias-row-nan-grads.) Were a kernel to regress, this names it; torch-native's
    conformance run only sees the kernel torch picks."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnspec.spec import sdpa_vjp

    rng = np.random.default_rng(1)
    q, k, v, d_out = (
        rng.standard_normal(s) for s in ((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 4, 8))
    )
    visible = np.ones((4, 6), bool)
    visible[1] = False  # query 1 sees nothing
    visible[:, 5] = False  # key 5 is seen by nobody
    spec_opts = {"mask": visible} if kind == "bool_mask" else {"bias": np.where(visible, 0.0, -np.inf)}
    golden = sdpa_vjp(q, k, v, d_out, **spec_opts)[:3]

    t = {
        name: torch.tensor(a, dtype=getattr(torch, dtype), requires_grad=True)
        for name, a in (("q", q), ("k", k), ("v", v))
    }
    if kind == "bool_mask":
        attn_mask = torch.tensor(visible)
    else:
        attn_mask = torch.tensor(spec_opts["bias"], dtype=getattr(torch, dtype))
    with sdpa_kernel([getattr(SDPBackend, kernel)]):
        out = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=attn_mask)
        out.backward(torch.tensor(d_out, dtype=getattr(torch, dtype)))
    # each gradient entry sums at most m * d = 48 products of O(1) terms (|q|, |k|, |v|, |d_out| < 5
    # here): 64 ulps of the dtype bounds the accumulated rounding with room to spare
    tol = 64 * np.finfo(dtype).eps
    for name, want in zip("qkv", golden):
        got = t[name].grad.double().numpy()
        assert np.isfinite(got).all(), f"{kernel} {dtype}: d{name} has NaN/inf"
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"{kernel} {dtype} d{name}")
    assert (
        (t["q"].grad[0, :, 1] == 0).all()
        and (t["k"].grad[0, :, 5] == 0).all()
        and (t["v"].grad[0, :, 5] == 0).all()
    )


@pytest.mark.parametrize("name", AUTODIFF)
def test_mha_vjp_with_no_query_rows_gives_zero_gradients(name):
    """n = 0 query rows: the forward's empty case runs under the framework's autodiff (under
    jax.vjp its inputs are tracers, which have no device); gradients are zeros of the inputs' shapes."""
    be = backend(name)
    params = MHAParams.init(8, 2, seed=0, dtype=np.float32)
    query = be.asarray(np.zeros((2, 0, 8), np.float32))
    kv = be.asarray(np.ones((2, 3, 8), np.float32))
    d_query, d_key, d_value, d_params = be.mha_vjp(
        query,
        kv,
        kv,
        be.asparams(params, "float32"),
        be.asarray(np.zeros((2, 0, 8), np.float32)),
        num_heads=2,
    )[:4]
    assert be.to_numpy(d_query).shape == (2, 0, 8)
    for g in (d_key, d_value, d_params.w_q, d_params.w_o):
        assert not be.to_numpy(g).any()


@pytest.mark.parametrize("name", AUTODIFF)
@pytest.mark.parametrize("poison", [np.nan, np.inf])
def test_sdpa_vjp_with_a_masked_non_finite_key_matches_the_golden(name, poison):
    """A key no row may see holds NaN or inf: the forward under the framework's autodiff must take
    its non-finite path (under jax.vjp the inputs are tracers whose values can be read, and reading
    them to pick a path gave dq = NaN once), so every gradient is finite and equals the golden's."""
    from attnspec.spec import sdpa_vjp

    be = backend(name)
    rng = np.random.default_rng(3)
    q, k, v, d_out = (rng.standard_normal(s) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 4), (2, 3, 4)))
    k[:, 4], v[:, 4] = poison, poison
    mask = np.ones((3, 5), bool)
    mask[:, 4] = False
    golden = sdpa_vjp(q, k, v, d_out, mask=mask)
    got = be.sdpa_vjp(*(be.asarray(x, "float64") for x in (q, k, v, d_out)), mask=be.asarray(mask))
    for label, g, want in zip(("dq", "dk", "dv"), got, golden):
        g = be.to_numpy(g)
        assert np.isfinite(g).all(), f"{name}: {label} has NaN/inf"
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-12, err_msg=f"{name} {label}")


@pytest.mark.parametrize("name", AUTODIFF)
@pytest.mark.parametrize("variant", ["softcap", "alibi_slopes", "sinks"])
def test_sdpa_vjp_with_a_variant_and_hidden_non_finite_keys_matches_the_golden(name, variant):
    """Keys beyond kv_lengths hold NaN and inf while a variant is on: the variant's route must keep
    them out of the gradients too (jax's once gave dq = NaN there: 0 * NaN in dS @ K, and
    softcap's tanh' at a NaN logit reached dk)."""
    from attnspec.spec import sdpa_vjp

    be = backend(name)
    rng = np.random.default_rng(5)
    q, k, v, d_out = (rng.standard_normal(s) for s in ((2, 4, 4), (2, 5, 4), (2, 5, 4), (2, 4, 4)))
    k[:, 3:], v[:, 3:] = np.nan, np.inf
    value = {"softcap": 2.0, "alibi_slopes": np.array([0.5, 0.25]), "sinks": np.array([0.3, -0.2])}[variant]
    golden = sdpa_vjp(q, k, v, d_out, kv_lengths=np.array(3), **{variant: value})
    arg = be.asarray(value, "float64") if isinstance(value, np.ndarray) else value
    got = be.sdpa_vjp(
        *(be.asarray(x, "float64") for x in (q, k, v, d_out)),
        kv_lengths=be.asarray(np.array(3)),
        **{variant: arg},
    )
    assert len(got) == len(golden)
    for i, (g, want) in enumerate(zip(got, golden)):
        g = be.to_numpy(g)
        assert np.isfinite(g).all(), f"{name} {variant}: gradient {i} has NaN/inf"
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-10, err_msg=f"{name} {variant} gradient {i}")
