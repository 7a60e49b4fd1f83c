"""Convention bugs the mutation run (#28) led to, each checked against the real library.

- torch_sdpa passed ``enable_gqa`` only for Hq > Hkv (``group > 1``), but a call with no query
  heads (Hq = 0, which the spec admits) has group 0 and PyTorch refuses different head counts
  without ``enable_gqa``.
- ``jax+canonical`` promised full-size masks and passed the bias with its size-1 axes.
- torch-native called PyTorch the same way (measured while looking at zero-size calls, which the
  suite does not draw yet: see tests/mutation/open_gaps.toml).
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

    def fn(
        query,
        key,
        value,
        bias=None,
        mask=None,
        *,
        scale=None,
        is_causal=False,
        query_seq_lengths=None,
        key_value_seq_lengths=None,
        local_window_size=None,
    ):
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
