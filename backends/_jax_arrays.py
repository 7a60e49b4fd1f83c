"""What the ``jax`` and ``jax-native`` backends share: the array hooks, the compilation cache,
and the boundary between the spec's layout (*batch, H, L, d) and JAX's (B, L, H, d).

Shape letters as in `attnspec.spec.sdpa`. Leading batch dims are broadcast and flattened into B,
and heads and length swap places, at the boundary. `native_call` maps each spec option onto the
closest option of `jax.nn.dot_product_attention`; the conformant adapter (`attnspec.backends.jax`)
fixes what it must around it, the native backend (`attnspec.backends.jax_native`) does not.
"""

from __future__ import annotations

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from attnspec.backends import _vjp
from attnspec.backends._common import (
    lengths_column,
    to_reference,
    visibility,
    with_mask_and_bias,
)
from attnspec.backends.base import Backend, MHAArrays
from attnspec.spec.validate import SDPAPlan


def use_compilation_cache() -> str | None:
    """Turn on JAX's persistent compilation cache, unless the process already chose one.

    XLA compiles every new shape, and compiling is most of what the conformance suite spends on
    JAX; with the cache a second run reuses the first's executables (measured: the dev profile's
    JAX run takes about a third of the time warm). The directory is ``ATTNSPEC_JAX_CACHE``, or
    ``$XDG_CACHE_HOME/attnspec/jax`` (default ``~/.cache/attnspec/jax``); ``ATTNSPEC_JAX_CACHE=off``
    leaves JAX as it is. Returns the directory in use, or None.
    """
    chosen = os.environ.get("ATTNSPEC_JAX_CACHE", "")
    if chosen == "off":
        return jax.config.jax_compilation_cache_dir
    if jax.config.jax_compilation_cache_dir:  # the user's own setting wins
        return jax.config.jax_compilation_cache_dir
    if not chosen:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        chosen = os.path.join(base, "attnspec", "jax")
    jax.config.update("jax_compilation_cache_dir", chosen)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # the suite's are all small
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return chosen


class JaxArrays(_vjp.Autodiff, Backend):
    """Array hooks shared by the ``jax`` and ``jax-native`` backends."""

    def __init__(self, x64: bool = True) -> None:
        if x64:  # without it JAX has no float64 at all
            jax.config.update("jax_enable_x64", True)
        use_compilation_cache()
        self._last = None  # the latest result, for synchronize()

    def devices(self) -> list[str]:
        return ["cpu"] + [f"{d.platform}:{d.id}" for d in jax.devices() if d.platform != "cpu"]

    def _device(self, name: str | None):
        if name is None or name == "cpu":
            return jax.devices("cpu")[0]
        for d in jax.devices():
            if f"{d.platform}:{d.id}" == name:
                return d
        raise ValueError(f"{self.name}: no device {name!r}; devices are {self.devices()}")

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> jax.Array:
        return jax.device_put(np.array(to_reference(x, dtype)), self._device(device))

    def to_numpy(self, x: jax.Array) -> np.ndarray:
        return np.asarray(x)

    def device_of(self, x: jax.Array) -> str:
        return device_name(x) or "traced"  # a tracer (inside the caller's jit) has no device yet

    def synchronize(self) -> None:
        # JAX dispatches asynchronously and has no global barrier for computations: wait on the
        # latest result instead.
        if self._last is not None:
            jax.block_until_ready(self._last)

    def numerics_policy(self) -> dict[str, object]:
        jax.config.update("jax_default_matmul_precision", "highest")
        return {
            "jax_default_matmul_precision": jax.config.jax_default_matmul_precision,
            "jax_enable_x64": jax.config.jax_enable_x64,
        }

    array_type = "jax.Array"

    def is_array(self, x: object) -> bool:
        return isinstance(x, jax.Array)

    _engine = "jax"  # sdpa_vjp, mha_vjp, lsh_attention_vjp: attnspec.backends._vjp.Autodiff


def _lengths_to_numpy(x):
    return np.asarray(x) if isinstance(x, jax.Array) else x


def device_name(x) -> str | None:
    """The name `JaxArrays.asarray` takes for the device of ``x`` (None for a traced array)."""
    try:
        (d,) = x.devices()
    except Exception:  # a tracer has no concrete device
        return None
    return "cpu" if d.platform == "cpu" else f"{d.platform}:{d.id}"


def _register_mha_arrays() -> None:
    """Make `MHAArrays` a pytree (its eight fields are children; None is an empty subtree), so
    ``jax.grad`` differentiates with respect to a whole parameter set."""
    try:
        jax.tree_util.register_dataclass(
            MHAArrays, data_fields=[f.name for f in dataclasses.fields(MHAArrays)], meta_fields=[]
        )
    except ValueError:  # already registered (this module was imported twice)
        pass


_register_mha_arrays()


def lengths_arrays(p: SDPAPlan):
    """q_lengths, kv_lengths as JAX arrays (*batch, 1, 1, 1), or None; traced, never static."""
    return tuple(None if a is None else jnp.asarray(a) for a in lengths_column(p))


def with_head(x):
    return x[None] if x.ndim == 2 else x  # (L, d) -> (1, L, d): one head


def full_visibility(p: SDPAPlan, mask, bias, q_len, kv_len):
    """Every rule of the call as one bool array broadcasting to (*batch, Hq, n, m), or None."""
    vis = visibility(p.n, p.m, p.causal, p.window, q_len, kv_len, jnp.arange)
    return with_mask_and_bias(vis, mask, bias, -math.inf)


# -- the boundary: spec layout (*batch, H, L, d) <-> JAX layout (B, L, H, d) -------------------


def batch_size(p: SDPAPlan) -> int:
    return math.prod(p.batch)


def to_btnh(p: SDPAPlan, x, heads: int, length: int):
    x = jnp.broadcast_to(with_head(x), (*p.batch, heads, length, x.shape[-1]))  # (*batch, H, L, d)
    x = jnp.reshape(x, (batch_size(p), heads, length, x.shape[-1]))  # (B, H, L, d)
    return jnp.transpose(x, (0, 2, 1, 3))  # (B, L, H, d)


def from_btnh(p: SDPAPlan, out):
    out = jnp.transpose(out, (0, 2, 1, 3))  # (B, Hq, n, dv)
    return jnp.reshape(out, (*p.batch, p.hq, p.n, p.dv))  # (*batch, Hq, n, dv)


def to_bnts(p: SDPAPlan, x):
    """A mask or bias broadcasting to (*batch, Hq, n, m) -> (B, Hq or 1, n, m), as JAX wants."""
    heads = x.shape[-3] if x.ndim >= 3 else 1
    x = jnp.broadcast_to(x, (*p.batch, heads, p.n, p.m))  # (*batch, Hq or 1, n, m)
    return jnp.reshape(x, (batch_size(p), heads, p.n, p.m))  # (B, Hq or 1, n, m)


def seq_lengths(p: SDPAPlan, lengths):
    return None if lengths is None else jnp.reshape(lengths, (batch_size(p),)).astype(jnp.int32)  # (B,)


def native_call(p: SDPAPlan, q, k, v, mask, bias, q_len, kv_len, return_residual: bool = False):
    """`jax.nn.dot_product_attention` with each spec option as its closest native option.

    Returns (B, n, Hq, dv_or_dk), and with ``return_residual`` also JAX's logsumexp (B, n, Hq).
    ``mask`` and ``bias`` are in the spec's layout; lower-right causal (and a window anchored on
    it) has no native option, so it joins ``mask``.
    """
    upper = p.causal != "lower_right"
    explicit = None if upper else visibility(p.n, p.m, p.causal, p.window, None, None, jnp.arange)
    explicit = with_mask_and_bias(explicit, mask, None, None)
    return jax.nn.dot_product_attention(
        to_btnh(p, q, p.hq, p.n),
        to_btnh(p, k, p.hkv, p.m),
        to_btnh(p, v, p.hkv, p.m),
        bias=None if bias is None else to_bnts(p, bias),
        mask=None if explicit is None else to_bnts(p, explicit),
        scale=p.scale,
        is_causal=p.causal == "upper_left",
        query_seq_lengths=seq_lengths(p, q_len),
        key_value_seq_lengths=seq_lengths(p, kv_len),
        local_window_size=p.window if upper else None,
        return_residual=return_residual,
    )
