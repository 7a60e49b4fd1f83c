"""One sdpa (and lsh_attention) for every namespace that implements the Python array API standard.

The algorithms are `attnspec.backends._xp_core` and `attnspec.backends._lsh_xp`, run on
``array_api_compat.array_namespace`` of the inputs: they have no framework-specific branch and no
native fast path (the point of this backend is to show the standard alone is enough;
array_api_strict proves it uses nothing else). The registry entries differ only in the namespace
`asarray` creates arrays in, and in the host transfer of `to_numpy`:

    array_api-numpy   NumPy (via array-api-compat)        float16, float32, float64
    array_api-strict  array_api_strict (the standard only) float32, float64
    array_api-torch   torch (via array-api-compat)        float16, bfloat16, float32, float64
    array_api-cupy    CuPy (via array-api-compat), GPU    float16, float32, float64

bfloat16 is not an array API dtype; torch's namespace has it, so it is offered there.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import ml_dtypes
import numpy as np

from attnspec.backends import _lsh_xp, _mha, _xp_blocked, _xp_core
from attnspec.backends._common import (
    alibi_distance,
    compute_dtype_name,
    fold_per_sequence,
    is_empty,
    lengths_column,
    to_reference,
    visibility,
    with_mask_and_bias,
)
from attnspec.backends.base import VARIANT_FEATURES, Backend, Unsupported, variant_features
from attnspec.errors import SpecError
from attnspec.spec.blocked import check_block
from attnspec.spec.dtypes import DTYPE_NAMES
from attnspec.spec.options import LSH_OPTIONS, take, with_options
from attnspec.spec.sdpa import BLOCKED_MIN_LOGITS
from attnspec.spec.validate import SDPAPlan

__all__ = ["ArrayAPIBackend", "ArrayAPICupy", "ArrayAPINumpy", "ArrayAPIStrict", "ArrayAPITorch"]

# Narrow floats travel as float32 (which holds them exactly): not every namespace can take
# float16/bfloat16 from NumPy or hand it back (DLPack has no bfloat16 in NumPy).
_NARROW = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# Tiles of `sdpa` above the golden's BLOCKED_MIN_LOGITS (see `_xp_blocked`). Every (batch, head)
# is in each tile, so these are large: on NumPy float32 at (1, 8, 4096, 64), 512 x 1024 reached
# 0.52-0.57 of the matmul rate single-threaded against 0.48-0.51 for 256 x 512 (interleaved, same
# run), and fewer, larger BLAS calls also suffer less when other processes hold the cores.
BLOCK_Q, BLOCK_K = 512, 1024


class ArrayAPIBackend(Backend):
    """The generic implementation; subclasses name the namespace module that `asarray` uses."""

    name = "array_api"
    variants = frozenset(VARIANT_FEATURES)
    #: the module whose namespace creates this backend's arrays
    _module: str = ""

    def __init__(self) -> None:
        import array_api_compat

        self._compat = array_api_compat
        self._xp = importlib.import_module(self._module)

    # -- arrays -----------------------------------------------------------------------------
    def _devices(self) -> list:
        return [self._xp.__array_namespace_info__().default_device()]

    def devices(self) -> list[str]:
        return [self._device_name(d) for d in self._devices()]

    def _device_name(self, d) -> str:
        return str(d)

    def device_of(self, x) -> str:
        return self._device_name(self._compat.device(x))

    def _device(self, name: str | None):
        if name is None:
            return self._devices()[0]
        for d in self._devices():
            if name in (self._device_name(d), str(d)):  # str(d): what the namespace prints
                return d
        raise ValueError(f"{self.name}: no device {name!r}; devices are {self.devices()}")

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None):
        x = to_reference(x, dtype)
        name = x.dtype.name
        if name in _NARROW and not hasattr(self._xp, name):
            raise Unsupported(f"{self.name}: the namespace has no {name}")
        src = x.astype(np.float32) if name in _NARROW else np.array(x)  # np.array copies
        a = self._xp.asarray(src, device=self._device(device))
        return self._xp.astype(a, getattr(self._xp, name)) if name in _NARROW else a

    def to_numpy(self, x) -> np.ndarray:
        if isinstance(x, np.ndarray):  # already on the host (lengths a caller gave as NumPy)
            return x
        xp = self._compat.array_namespace(x)
        name = self.dtype_name(x)
        if name in _NARROW:
            return self._host(xp.astype(x, xp.float32)).astype(_NARROW[name])
        return self._host(x)

    def _host(self, x) -> np.ndarray:
        return np.from_dlpack(self._compat.to_device(x, "cpu") if self._on_gpu(x) else x)

    def _on_gpu(self, x) -> bool:
        return False

    def dtype_name(self, x) -> str:
        xp = self._compat.array_namespace(x)
        for name in DTYPE_NAMES:
            candidate = getattr(xp, name, None)
            # skip absent names: NumPy compares None equal to float64 (its default dtype)
            if candidate is not None and candidate == x.dtype:
                return name
        return str(x.dtype)

    def supports(self, feature: str, **case) -> list[str]:
        reasons = super().supports(feature, **case)
        if feature.endswith("_vjp"):  # replaces "does not implement" with the reason why
            reasons = [r for r in reasons if not r.endswith(f"does not implement {feature}")]
            reasons.insert(
                0,
                f"{self.name} has no {feature}: the array API standard defines no "
                "automatic differentiation, and a hand-written backward is not this "
                "backend's point",
            )
        return reasons

    # -- sdpa -------------------------------------------------------------------------------
    array_type = "array API array"

    def is_array(self, x: object) -> bool:
        return bool(self._compat.is_array_api_obj(x))

    def _namespace(self, fn: str, q, k, v, mask, bias):
        """(the array namespace of one call's arrays, q's device); refused when they mix namespaces."""
        try:
            xp = self._compat.array_namespace(*(x for x in (q, k, v, mask, bias) if x is not None))
        except TypeError as e:
            raise SpecError(
                f"{fn}: q, k, v, mask and bias must come from one array namespace ({e})"
            ) from None
        return xp, self._compat.device(q)

    def _lengths_to_numpy(self, x):
        if self._compat.is_array_api_obj(x) and not isinstance(x, np.ndarray):
            return self.to_numpy(x)
        return x

    def variant_refusals(self, feature: str, options) -> list[str]:
        reasons = super().variant_refusals(feature, options)
        if feature == "sdpa_blocked":  # the tiles of _xp_blocked have none of them yet
            reasons += [
                f"{self.name}.sdpa_blocked does not implement the {v} variant (its tiled path "
                "has none yet; sdpa has it)"
                for v in variant_features(options)
                if v in self.variants
            ]
        return reasons

    @with_options()
    def sdpa(self, q, k, v, **options):
        fn = f"{self.name}.sdpa"
        o = take(fn, options)
        mask, bias, return_weights, sinks = o["mask"], o["bias"], o["return_weights"], o["sinks"]
        p = self._plan_of(fn, q, k, v, o)
        xp, device = self._namespace(fn, q, k, v, mask, bias)
        if is_empty(p):
            return _xp_core.empty(xp, p, q.dtype, device, return_weights, sinks)
        nonfinite_v = not bool(xp.all(xp.isfinite(v)))
        if variant_features(o):
            # whole, not tiled: the variants are in _xp_core only (O(n * m) memory, like the
            # golden's reference for these calls)
            return self._variants(xp, p, device, q, k, v, mask, bias, nonfinite_v, o)
        if math.prod(p.full_weights_shape) >= BLOCKED_MIN_LOGITS:  # as the golden: tiled when large
            out, weights = _xp_blocked.attention_blocked(
                xp,
                p,
                *_with_heads(xp, q, k, v),
                mask,
                bias,
                nonfinite_v=nonfinite_v,
                want_weights=return_weights,
                block_q=BLOCK_Q,
                block_k=BLOCK_K,
                device=device,
            )
            return (out, weights) if return_weights else out
        vis = _visibility(xp, p, device, mask, bias)
        out, weights, _ = _xp_core.attention(
            xp, p, *_with_heads(xp, q, k, v), vis, bias, nonfinite_v=nonfinite_v, want_weights=return_weights
        )
        return (out, weights) if return_weights else out

    def _variants(self, xp, p, device, q, k, v, mask, bias, nonfinite_v, o):
        alibi_slopes, sinks = o["alibi_slopes"], o["sinks"]
        q_ids, kv_ids = (
            self._lengths_to_numpy(o["q_segment_ids"]),
            self._lengths_to_numpy(o["kv_segment_ids"]),
        )
        rules, per_sequence = fold_per_sequence(p, q_ids, kv_ids)
        vis = _visibility(xp, rules, device, mask, bias)
        if per_sequence is not None:
            seq = xp.asarray(per_sequence, device=device)
            vis = seq if vis is None else vis & seq
        alibi = None
        if alibi_slopes is not None:  # -slope[h] * |i' - j|, i' from the call's own alignment
            ct = getattr(xp, compute_dtype_name(p.dtype))  # as the golden: slopes in the compute dtype
            dist = xp.asarray(alibi_distance(p, q_ids, kv_ids), dtype=ct, device=device)
            slopes = xp.astype(alibi_slopes, ct)
            alibi = -xp.reshape(slopes, (*slopes.shape, 1, 1)) * dist  # (..., Hq, n, m)
        out, weights, lse = _xp_core.attention(
            xp,
            rules,
            *_with_heads(xp, q, k, v),
            vis,
            bias,
            nonfinite_v=nonfinite_v,
            want_weights=o["return_weights"],
            alibi=alibi,
            sinks=sinks,
            keep=o["dropout_mask"],
        )
        return _xp_core.results(p, out, weights, lse)

    @with_options(after=("block_q", "block_k"))
    def sdpa_blocked(self, q, k, v, *, block_q=256, block_k=512, **options):
        fn = f"{self.name}.sdpa_blocked"
        o = take(fn, options)
        mask, bias, return_weights = o["mask"], o["bias"], o["return_weights"]
        p = self._plan_of(fn, q, k, v, o)
        self.refuse_variants("sdpa_blocked", o)
        bq, bk = check_block("block_q", block_q, fn), check_block("block_k", block_k, fn)
        xp, device = self._namespace(fn, q, k, v, mask, bias)
        if is_empty(p):
            return _xp_core.empty(xp, p, q.dtype, device, return_weights)
        out, weights = _xp_blocked.attention_blocked(
            xp,
            p,
            *_with_heads(xp, q, k, v),
            mask,
            bias,
            nonfinite_v=not bool(xp.all(xp.isfinite(v))),
            want_weights=return_weights,
            block_q=bq,
            block_k=bk,
            device=device,
        )
        return (out, weights) if return_weights else out

    @with_options()
    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, **options):
        # `attnspec.backends._mha` on the query's namespace, then self.sdpa per head
        fn = f"{self.name}.mha"
        xp = self._compat.array_namespace(query) if self._compat.is_array_api_obj(query) else None
        inputs, o = (query, key, value, params, num_heads, num_kv_heads), take(fn, options)
        device = lambda: str(self._compat.device(query))  # noqa: E731
        return _mha.run(self, fn, _mha.XPHeadOps(xp), self._lengths_to_numpy, device, inputs, o)

    @with_options(table=LSH_OPTIONS)
    def lsh_attention(self, x, v, **options):
        fn = f"{self.name}.lsh_attention"
        p, o = _lsh_xp.plan(fn, self._info, self._lengths_to_numpy, x, v, options)
        rotations = o["rotations"]
        try:
            xp = self._compat.array_namespace(x, v, rotations)
        except TypeError as e:
            raise SpecError(f"{fn}: x, v and rotations must come from one array namespace ({e})") from None
        device = self._compat.device(x)
        if p.L == 0 or 0 in p.batch:
            out, buckets = _lsh_xp.empty(xp, p, x.dtype, device)
        else:
            kv = _lsh_xp.kv_flat(p)
            out, buckets = _lsh_xp.lsh_attention(
                xp,
                p,
                x,
                v,
                rotations,
                None if kv is None else xp.asarray(kv, device=device),
                nonfinite_v=not bool(xp.all(xp.isfinite(v))),
                device=device,
            )
        return (out, buckets) if o["return_buckets"] else out


def _with_heads(xp, q, k, v) -> tuple[Any, Any, Any]:
    return _with_head(xp, q), _with_head(xp, k), _with_head(xp, v)


def _with_head(xp, x):
    return xp.expand_dims(x, axis=0) if x.ndim == 2 else x  # (L, d) -> (1, L, d): one head


def _visibility(xp, p: SDPAPlan, device, mask, bias):
    q_len, kv_len = (None if a is None else xp.asarray(a, device=device) for a in lengths_column(p))
    vis = visibility(p.n, p.m, p.causal, p.window, q_len, kv_len, lambda size: xp.arange(size, device=device))
    return with_mask_and_bias(vis, mask, bias, -math.inf)


class ArrayAPINumpy(ArrayAPIBackend):
    name = "array_api-numpy"
    _module = "array_api_compat.numpy"
    dtypes = ("float16", "float32", "float64")


class ArrayAPIStrict(ArrayAPIBackend):
    name = "array_api-strict"
    _module = "array_api_strict"
    dtypes = ("float32", "float64")  # the standard has no float16 or bfloat16

    def _device_name(self, d) -> str:
        # array_api_strict's default device prints as "array_api_strict.Device('CPU_DEVICE')";
        # it is the host CPU, named "cpu" like every other backend's (results files, --attn-device)
        return "cpu" if d == self._xp.Device() else str(d)


class ArrayAPITorch(ArrayAPIBackend):
    name = "array_api-torch"
    _module = "array_api_compat.torch"

    def _devices(self) -> list:
        import torch

        return [torch.device("cpu")] + [torch.device("cuda", i) for i in range(torch.cuda.device_count())]

    def _on_gpu(self, x) -> bool:
        return x.device.type != "cpu"

    def synchronize(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def numerics_policy(self) -> dict[str, object]:
        from attnspec.backends.torch import torch_numerics_policy

        return torch_numerics_policy()


class ArrayAPICupy(ArrayAPIBackend):
    name = "array_api-cupy"
    _module = "array_api_compat.cupy"
    dtypes = ("float16", "float32", "float64")

    def _devices(self) -> list:
        import cupy

        return [cupy.cuda.Device(i) for i in range(cupy.cuda.runtime.getDeviceCount())]

    def _device_name(self, d) -> str:
        return f"cuda:{d.id}"  # as torch names it; CuPy prints "<CUDA Device 0>"

    def _host(self, x) -> np.ndarray:
        return x.get()  # CuPy refuses implicit device-to-host copies (np.from_dlpack included)

    def synchronize(self) -> None:
        import cupy

        cupy.cuda.get_current_stream().synchronize()
