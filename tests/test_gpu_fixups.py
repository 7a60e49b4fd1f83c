"""The adapters' GPU-only fix-ups, found on an H200 (reports/gpu.md), checked here on CPU where
their decisions can be: which calls they send elsewhere, and that they leave CPU calls alone."""

from __future__ import annotations

import types

import numpy as np
import pytest

from attnspec.spec.options import take
from attnspec.spec.validate import plan_options


def _plan(q_shape, k_shape, dtype="float16"):
    q, k = np.zeros(q_shape, dtype), np.zeros(k_shape, dtype)
    return plan_options("t", q, k, k, take("t", {}))[0]


def _on(platform: str):
    return types.SimpleNamespace(device=types.SimpleNamespace(platform=platform))


@pytest.mark.parametrize(
    ("q_shape", "k_shape", "fused"),
    [
        ((2, 4, 8), (2, 5, 8), True),
        ((1, 1, 1), (1, 1, 1), False),  # the head dim 1
        ((4, 1, 1, 64), (4, 1, 129, 64), False),  # a one-row decode
        ((2, 16, 4), (2, 1, 4), False),  # one key
    ],
)
def test_jax_float16_with_a_size_of_one_leaves_the_fused_kernel_on_gpu_only(q_shape, k_shape, fused):
    jax_adapter = pytest.importorskip("attnspec.backends.jax")
    p = _plan(q_shape, k_shape)
    assert jax_adapter._fused_ok(p, _on("gpu")) is fused
    assert jax_adapter._fused_ok(_plan(q_shape, k_shape, "bfloat16"), _on("gpu"))  # bfloat16 compiles
    assert jax_adapter._fused_ok(_plan(q_shape, k_shape, "float32"), _on("gpu"))
    assert not jax_adapter._fused_ok(p, _on("cpu"))  # CPU: half precision is exact anyway


def test_torch_kernel_floor_reads_the_logit_bound():
    torch = pytest.importorskip("torch")
    torch_adapter = pytest.importorskip("attnspec.backends.torch")
    p = _plan((1, 2, 4, 8), (1, 2, 4, 8), "float32")
    q = torch.ones(1, 2, 4, 8)
    deep = torch.full((4, 4), -3e38)
    assert not torch_adapter._below_kernel_floor(p, q, q, deep)  # CPU kernels need no detour

    class Lent(torch.Tensor):  # a CPU tensor that says it lives on a GPU
        @property
        def device(self):
            return types.SimpleNamespace(type="cuda")

    def lent(x):
        return x.as_subclass(Lent)

    assert torch_adapter._below_kernel_floor(p, lent(q), q, deep)
    assert not torch_adapter._below_kernel_floor(p, lent(q), q, torch.zeros(4, 4))
    assert not torch_adapter._below_kernel_floor(p, lent(q), q, None)
    assert torch_adapter._below_kernel_floor(p, lent(q * 1e18), q * 1e18, None)  # huge q . k
