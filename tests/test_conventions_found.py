"""Convention bugs the mutation run (#28) led to, each checked against the real library.

- torch_sdpa passed ``enable_gqa`` only for Hq > Hkv (``group > 1``), but a call with no query
  heads (Hq = 0, which the spec admits) has group 0 and PyTorch refuses different head counts
  without ``enable_gqa``.
- ``jax+canonical`` promised full-size masks and passed the bias with its size-1 axes.
- torch-native called PyTorch the same way (measured while looking at zero-size calls, which the
  suite's `empty` feature now draws: no batch element, no query head).
"""

from __future__ import annotations

import numpy as np
import pytest

import attnspec.spec as spec
from attnspec.backends import from_function, get_convention


def test_torch_sdpa_passes_enable_gqa_with_no_query_heads():
    torch = pytest.importorskip("torch")
    backend = from_function(torch.nn.functional.scaled_dot_product_attention, "torch_sdpa")
    q, k, v = torch.randn(2, 0, 3, 4), torch.randn(2, 2, 5, 4), torch.randn(2, 2, 5, 4)
    out = backend.sdpa(q, k, v)  # PyTorch raises on 0 query heads against 2 without enable_gqa
    assert tuple(out.shape) == spec.sdpa(q.numpy(), k.numpy(), v.numpy()).shape == (2, 0, 3, 4)


def test_jax_canonical_bias_is_full_size():
    seen = {}

    def fn(query, key, value, bias=None, mask=None, **keywords):  # jax's keywords, none given here
        seen["bias"] = None if bias is None else tuple(np.shape(bias))
        q, k, v = (np.swapaxes(x, 1, 2) for x in (query, key, value))
        return np.swapaxes(spec.sdpa(q, k, v, bias=np.asarray(bias)), 1, 2)

    backend = from_function(fn, get_convention("jax+canonical"), arrays="numpy")
    rng = np.random.default_rng(1)
    q, k, v = (
        rng.standard_normal((2, 4, 3, 8)),
        rng.standard_normal((2, 4, 5, 8)),
        rng.standard_normal((2, 4, 5, 8)),
    )
    bias = rng.standard_normal((1, 1, 3, 5))  # broadcasts over batch and heads
    out = backend.sdpa(q, k, v, bias=bias)
    assert seen["bias"] == (2, 4, 3, 5)
    np.testing.assert_allclose(np.asarray(out), spec.sdpa(q, k, v, bias=bias), rtol=1e-12, atol=1e-12)


def test_torch_native_passes_enable_gqa_with_no_query_heads():
    torch = pytest.importorskip("torch")
    from attnspec.backends import get

    q, k = torch.zeros(2, 0, 3, 4), torch.zeros(2, 2, 5, 4)
    assert tuple(get("torch-native").sdpa(q, k, k).shape) == (2, 0, 3, 4)


def test_tutorial_gives_no_query_heads_no_kv_heads():
    """Found when the suite began drawing Hq = 0: the tutorial convention expanded kv heads only for
    G > 1, so Q @ K^T met 0 query heads against 2 kv heads and could not broadcast."""

    def tutorial(Q, K, V, mask=None):  # the tutorial's body: matmuls that broadcast leading axes
        s = Q @ np.swapaxes(K, -1, -2) / np.sqrt(Q.shape[-1])
        w = np.exp(s - s.max(axis=-1, keepdims=True, initial=-np.inf)) if s.size else s
        w = w / w.sum(axis=-1, keepdims=True) if w.size else w
        return w @ V, w

    backend = from_function(tutorial, "tutorial", arrays="numpy")
    q, k = np.zeros((2, 0, 3, 4)), np.ones((2, 2, 5, 4))
    assert np.asarray(backend.sdpa(q, k, k)).shape == spec.sdpa(q, k, k).shape == (2, 0, 3, 4)


@pytest.mark.parametrize("name", ["array_api-numpy", "array_api-strict"])
def test_blocked_takes_a_batch_of_zero(name):
    """Found by the same draws: the array-API tiled path took a running maximum over an empty batch."""
    from attnspec.backends import get

    try:
        backend = get(name)
    except Exception as e:  # array-api-strict missing
        pytest.skip(str(e))
    q, k = np.zeros((0, 2, 3, 4)), np.ones((0, 2, 5, 4))
    out = backend.sdpa_blocked(
        backend.asarray(q), backend.asarray(k), backend.asarray(k), block_q=2, block_k=2
    )
    assert backend.to_numpy(out).shape == (0, 2, 3, 4)
