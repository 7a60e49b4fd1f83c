"""JAX as it is: `jax.nn.dot_product_attention` with no numerical fix-up.

Each spec option maps to the closest native one (see `attnspec.backends.jax.native_call`):
``is_causal`` for upper-left causal, ``local_window_size`` for a window, the sequence-length
arguments for lengths, ``mask`` and ``bias`` as they are; lower-right causal has no native
option, so it is expressed through the native ``mask``. The layout change at the boundary (batch
dims flattened into B, heads and length swapped; JAX does not broadcast batch dims) moves data
and changes no value. Where the result differs from the spec it is a declared deviation
(`attnspec.backends.deviations`). Arguments are still validated by the spec's rules.

``return_lse=True`` is JAX's own logsumexp (``return_residual=True``), in the spec's layout
(..., Hq, n) and otherwise as JAX returns it. Every other variant of issue #15 is refused.

A call JAX refuses (for example dv != dk) raises `Unsupported` carrying JAX's own message, so
the refusal is measured rather than predicted.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from attnspec.backends._common import static_plan, variant_keywords
from attnspec.backends.base import Unsupported
from attnspec.backends.jax import JaxArrays, from_btnh, lengths_arrays, native_call
from attnspec.spec.options import take, with_options
from attnspec.spec.validate import SDPAPlan

__all__ = ["JaxNativeBackend"]


@partial(jax.jit, static_argnames=("p",))
def _native(q, k, v, mask, bias, q_len, kv_len, *, p: SDPAPlan):
    result = native_call(p, q, k, v, mask, bias, q_len, kv_len, return_residual=p.return_lse)
    if not p.return_lse:
        return from_btnh(p, result).reshape(p.out_shape)  # result: (B, n, Hq, dv)
    out, lse = result  # (B, n, Hq, dv), (B, n, Hq)
    lse = jnp.transpose(lse, (0, 2, 1))  # (B, Hq, n)
    # as JAX returns it: its dtype (jax.lse-in-input-dtype) and its value for a row with no visible
    # key (jax.lse-empty-row-finite) are measured, not repaired
    return from_btnh(p, out).reshape(p.out_shape), lse.reshape(p.lse_shape)  # lse: (*batch, Hq, n)


class JaxNativeBackend(JaxArrays):
    """jax.nn.dot_product_attention called directly; its deviations are measured, not repaired."""

    name = "jax-native"
    #: the logsumexp through ``return_residual=True``; JAX has none of the other variants
    variants = frozenset({"lse"})

    def supports(self, feature: str, **case) -> list[str]:
        reasons = super().supports(feature, **case)
        if case.get("return_weights"):
            reasons.append("jax.nn.dot_product_attention returns no attention weights")
        device = case.get("device")
        on_cpu = device == "cpu" or (device is None and jax.default_backend() == "cpu")
        if case.get("dtype") == "float16" and on_cpu:
            reasons.append(
                "XLA:CPU cannot compile the float16 matmul precision JAX asks for under "
                "jit (deviation jax.float16-jit-cpu-refused)"
            )
        q_shape, v_shape = case.get("q_shape"), case.get("v_shape")
        if q_shape and v_shape and q_shape[-1] != v_shape[-1]:
            reasons.append(
                "jax.nn.dot_product_attention requires v.shape[-1] == q.shape[-1] "
                "(deviation jax.dv-ne-dk-refused)"
            )
        return reasons

    @with_options()
    def sdpa(self, q, k, v, **options):
        o = take("jax-native.sdpa", options)
        p = self._plan_of("jax-native.sdpa", q, k, v, o)
        mask, bias, causal, return_weights = o["mask"], o["bias"], o["causal"], o["return_weights"]
        variants = variant_keywords(o)
        # jax.nn.dot_product_attention has no softcap, ALiBi, sinks, segment ids, lengths-aligned
        # causal or dropout argument: a native backend measures, so it refuses rather than emulates them
        self.refuse_variants("sdpa", {**variants, "causal": causal})
        if return_weights:  # with or without return_lse: return_residual adds only the lse
            raise Unsupported("jax-native.sdpa: jax.nn.dot_product_attention returns no attention weights")
        q_len, kv_len = lengths_arrays(p)
        try:
            out = _native(q, k, v, mask, bias, q_len, kv_len, p=static_plan(p))
        except ValueError as e:  # JAX's own refusal of a call the spec defines
            raise Unsupported(f"jax-native.sdpa: jax.nn.dot_product_attention refused: {e}") from e
        self._last = out
        return out
