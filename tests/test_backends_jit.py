"""The jax backend under the caller's own `jax.jit` and `jax.grad`, as JAX users call it.

Outside a trace the adapter reads finiteness flags back to pick the fused kernel or the exact
path; inside one it cannot, so it decides on device (`lax.cond`). These tests check that both
ways give the golden's answer, non-finite inputs included.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = jax.numpy

from attnspec import spec  # noqa: E402
from attnspec.backends import get  # noqa: E402
from attnspec.spec.sdpa import plan_numpy  # noqa: E402
from attnspec.spec.tolerance import reference_sdpa, sdpa_allowed, visibility_view  # noqa: E402


@pytest.fixture(scope="module")
def be():
    return get("jax")


def _qkv(dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, 3, 5, 4)).astype(dtype) for _ in range(3)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("poison", [None, "q", "masked_v", "visible_v"])
def test_sdpa_under_jit_matches_golden(be, dtype, poison):
    q, k, v = _qkv(dtype)
    kv = np.array([3, 5])  # batch 0 hides keys 3, 4
    if poison == "q":
        q[0, 0, 1, 0] = np.nan
    elif poison == "masked_v":
        v[0, 1, 4, 2] = np.inf  # hidden from every row of batch 0
    elif poison == "visible_v":
        v[1, 0, 2, 1] = -np.inf  # seen by some rows only (causal)
    f = jax.jit(lambda q, k, v: be.sdpa(q, k, v, causal="upper_left", kv_lengths=kv))
    got = np.asarray(f(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))).astype(np.float64)
    want = spec.sdpa(q, k, v, causal="upper_left", kv_lengths=kv).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    # the conformance tolerance rule: K * (low-precision reference's error) + the floor
    plan = plan_numpy("sdpa", q, k, v, None, None, "upper_left", None, None, None, kv)
    ref = np.asarray(reference_sdpa(plan, q, k, v, None, None), dtype=np.float64)
    err_ref = float(np.abs(ref[fin] - want[fin]).max())
    vis = visibility_view(plan, None, None)
    allowed = sdpa_allowed(plan, q, k, np.where(np.isfinite(v), v, 0), None, vis, err_ref)
    assert np.abs(got[fin] - want[fin]).max() <= allowed


def test_weights_and_grad_under_jit(be):
    q, k, v = _qkv("float64", seed=1)
    out, w = jax.jit(lambda q: be.sdpa(q, jnp.asarray(k), jnp.asarray(v), return_weights=True))(
        jnp.asarray(q)
    )
    want_out, want_w = spec.sdpa(q, k, v, return_weights=True)
    assert np.abs(np.asarray(w) - want_w).max() < 1e-14
    assert np.abs(np.asarray(out) - want_out).max() < 1e-14
    grad = jax.jit(jax.grad(lambda q: be.sdpa(q, jnp.asarray(k), jnp.asarray(v), causal="upper_left").sum()))
    dq = spec.sdpa_vjp(q, k, v, np.ones_like(q), causal="upper_left")[0]
    assert np.abs(np.asarray(grad(jnp.asarray(q))) - dq).max() < 1e-13


def test_mha_and_lsh_under_jit(be):
    rng = np.random.default_rng(2)
    params = spec.MHAParams.init(8, 2, seed=0)
    x = rng.standard_normal((3, 5, 8))
    f = jax.jit(lambda x, prm: be.mha(x, x, x, prm, num_heads=2, causal="upper_left"))
    got = np.asarray(f(jnp.asarray(x), be.asparams(params, "float64")))
    assert np.abs(got - spec.mha(x, x, x, params, num_heads=2, causal="upper_left")).max() < 1e-13

    x, v = rng.standard_normal((2, 64, 8)), rng.standard_normal((2, 64, 4))
    v[0, 3, 0] = np.nan  # forces the non-finite treatment, which jit must choose without a read-back
    rot = jnp.asarray(spec.lsh_rotations(0, 8, 2, 4))
    g = jax.jit(lambda x, v: be.lsh_attention(x, v, rotations=rot, chunk_length=16, causal=True))
    got = np.asarray(g(jnp.asarray(x), jnp.asarray(v)))
    want = spec.lsh_attention(x, v, rotations=np.asarray(rot), chunk_length=16, causal=True)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    fin = np.isfinite(want)
    assert np.abs(got[fin] - want[fin]).max() < 1e-13
