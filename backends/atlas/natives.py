"""The atlas' native backends: each an outside primitive on a convention, a few lines each.

Every factory imports its framework on call (listing backends imports none), names the backend,
and points it at its declared deviations (``deviations.toml``). What comes back is the
framework's own result: `attnspec.backends.FunctionBackend` validates, expresses the spec's
options through the convention, and never corrects.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

from attnspec.backends.conventions.atlas import ATLAS_CONVENTIONS as C
from attnspec.backends.function import FunctionBackend
from attnspec.errors import SpecError

__all__ = ["ATLAS"]


def _native(fn, convention: str, name: str, arrays) -> FunctionBackend:
    return FunctionBackend(fn, C[convention], name=name, arrays=arrays, deviations=name)


def mlx_native() -> FunctionBackend:
    import mlx.core as mx

    return _native(mx.fast.scaled_dot_product_attention, "mlx", "mlx-native", "mlx")


def tinygrad_native() -> FunctionBackend:
    _tinygrad_compiler()
    from tinygrad import Tensor

    backend = _native(Tensor.scaled_dot_product_attention, "tinygrad", "tinygrad-native", "tinygrad")
    backend.preamble = ["import os"] + [
        f"os.environ[{k!r}] = {os.environ[k]!r}" for k in ("CC", "DEV") if k in os.environ
    ]
    return backend


def _keras(backend: str):
    current = os.environ.setdefault("KERAS_BACKEND", backend)
    if current != backend or ("keras" in sys.modules and sys.modules["keras"].backend.backend() != backend):
        raise SpecError(
            f"keras-{backend}-native: Keras runs on one backend per process and this one "
            f"is set to {current!r} (KERAS_BACKEND)"
        )
    import keras

    return keras.ops.dot_product_attention


def keras_jax_native() -> FunctionBackend:
    backend = _native(_keras("jax"), "keras", "keras-jax-native", "jax")
    backend.preamble = ["import os", "os.environ['KERAS_BACKEND'] = 'jax'"]
    return backend


def keras_torch_native() -> FunctionBackend:
    backend = _native(_keras("torch"), "keras", "keras-torch-native", "torch")
    backend.preamble = ["import os", "os.environ['KERAS_BACKEND'] = 'torch'"]
    return backend


def flax_native() -> FunctionBackend:
    from flax import nnx

    return _native(nnx.dot_product_attention, "flax", "flax-native", "jax")


def hf_eager_native() -> FunctionBackend:
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return _native(eager_attention_forward, "hf_eager", "hf-eager-native", "torch")


def hf_sdpa_native() -> FunctionBackend:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return _native(sdpa_attention_forward, "hf_sdpa", "hf-sdpa-native", "torch")


def torch_flex_native() -> FunctionBackend:
    from torch.nn.attention.flex_attention import flex_attention

    return _native(flex_attention, "flex", "torch-flex-native", "torch")


def pallas_flash_native() -> FunctionBackend:
    from jax.experimental.pallas.ops.gpu.attention import mha

    from attnspec.backends.arrays import JaxLibrary

    # Pallas' kernels index with int32: under JAX's 64-bit mode its causal path fails to trace
    # (lax.div of int32 and int64), so it is measured as its users run it, x64 off (no float64)
    backend = _native(mha, "pallas", "pallas-flash-native", JaxLibrary(x64=False))
    backend.dtypes = ("float16", "bfloat16", "float32")
    return backend


def _onnx(fn, name: str) -> FunctionBackend:
    import inspect

    from attnspec.backends.atlas import onnx_attention

    backend = _native(fn, "onnx", name, "numpy")
    # the function only builds the one-node model and runs it: reproducers paste its module whole
    backend.inline_source = inspect.getsource(onnx_attention)
    return backend


def onnx_ref_native() -> FunctionBackend:
    from attnspec.backends.atlas.onnx_attention import reference_attention

    return _onnx(reference_attention, "onnx-ref-native")


def onnxruntime_native() -> FunctionBackend:
    from attnspec.backends.atlas.onnx_attention import onnxruntime_attention

    backend = _onnx(onnxruntime_attention, "onnxruntime-native")
    # its CPU provider has no bfloat16 kernels ("Could not find an implementation for Add(14)");
    # float64, which has no Attention kernel either, runs the operator's function body
    backend.dtypes = ("float16", "float32", "float64")
    return backend


def paddle_native() -> FunctionBackend:
    from paddle.nn.functional import scaled_dot_product_attention

    from attnspec.backends.atlas.paddle_arrays import register

    register()
    backend = _native(scaled_dot_product_attention, "paddle", "paddle-native", "paddle")
    # on the CPU paddle has no float16 or bfloat16 matmul kernel ("kernel `matmul` is not registered")
    backend.dtypes = ("float32", "float64")
    return backend


def _tinygrad_compiler() -> None:
    """tinygrad's CPU device compiles with clang. Where there is none, the clang inside the
    ``ziglang`` wheel serves (as ``zig clang``; ``zig cc`` rejects tinygrad's target triple)."""
    if os.environ.get("CC") or shutil.which("clang"):
        return
    try:
        import ziglang
    except ImportError:
        return  # tinygrad will say what it lacks
    zig = Path(ziglang.__file__).parent / "zig"
    wrapper = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attnspec" / "zig-clang"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    wrapper.write_text(f'#!/bin/sh\nexec "{zig}" clang "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    os.environ["CC"] = str(wrapper)
    os.environ.setdefault("DEV", "CPU")


#: name -> (factory "module:attr", the top-level modules it needs, the pip extra that installs them)
ATLAS = {
    "mlx-native": ("attnspec.backends.atlas.natives:mlx_native", ("mlx",), "atlas-mlx"),
    "tinygrad-native": ("attnspec.backends.atlas.natives:tinygrad_native", ("tinygrad",), "atlas-tinygrad"),
    "keras-jax-native": ("attnspec.backends.atlas.natives:keras_jax_native", ("keras", "jax"), "atlas-keras"),
    "keras-torch-native": (
        "attnspec.backends.atlas.natives:keras_torch_native",
        ("keras", "torch"),
        "atlas-keras",
    ),
    "flax-native": ("attnspec.backends.atlas.natives:flax_native", ("flax",), "atlas-flax"),
    "hf-eager-native": (
        "attnspec.backends.atlas.natives:hf_eager_native",
        ("transformers", "torch"),
        "atlas-hf",
    ),
    "hf-sdpa-native": (
        "attnspec.backends.atlas.natives:hf_sdpa_native",
        ("transformers", "torch"),
        "atlas-hf",
    ),
    "torch-flex-native": ("attnspec.backends.atlas.natives:torch_flex_native", ("torch",), "torch"),
    "pallas-flash-native": ("attnspec.backends.atlas.natives:pallas_flash_native", ("jax",), "jax"),
    "onnx-ref-native": ("attnspec.backends.atlas.natives:onnx_ref_native", ("onnx",), "atlas-onnx"),
    "onnxruntime-native": (
        "attnspec.backends.atlas.natives:onnxruntime_native",
        ("onnx", "onnxruntime"),
        "atlas-onnx",
    ),
    "paddle-native": ("attnspec.backends.atlas.natives:paddle_native", ("paddle",), "atlas-paddle"),
}
