"""Vector-Jacobian products through a backend's own autodiff, written once over its forward.

A framework backend's ``sdpa_vjp``, ``mha_vjp`` and ``lsh_attention_vjp`` differentiate the
backend's own forward method (``self.sdpa``, ``self.mha``, ``self.lsh_attention``) with the
framework's autodiff, as a user training through it would: ``torch.autograd.grad`` or
``jax.vjp``. So the conformant backends' gradients are those of their conformant forward (its
fix-ups included: a ``where`` that drops a masked key also drops its gradient), and the native
backends' gradients are those of the native primitive. The results follow the spec's signatures
and return conventions (`attnspec.spec.sdpa_vjp`, `mha_vjp`, `lsh_attention_vjp`).

A vjp is offered only where its forward is: `with_forwards` keeps the others out of a backend's
``implements`` and ``missing_forward`` gives `supports` the reason.

Every argument, d_out included, is checked before the forward is traced, with the spec's checks
under the vjp's own name: bad input raises ``SpecError("torch.mha_vjp: ...")``, never the
forward's message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, ClassVar

from attnspec.backends import _lsh_xp, _mha
from attnspec.backends.base import Backend, MHAArrays
from attnspec.errors import SpecError
from attnspec.spec.options import LSH_OPTIONS, take, with_options

#: vjp -> the forward method it differentiates
FORWARD = {"sdpa_vjp": "sdpa", "mha_vjp": "mha", "lsh_attention_vjp": "lsh_attention"}


def with_forwards(implements: frozenset[str]) -> frozenset[str]:
    """``implements`` less the vjps whose forward is not in it (a vjp differentiates its forward)."""
    return frozenset(fn for fn in implements if FORWARD.get(fn, fn) in implements)


def missing_forward(backend, feature: str) -> list[str]:
    """``["needs mha"]``-style reasons when ``feature`` is a vjp whose forward the backend lacks."""
    forward = FORWARD.get(feature)
    if forward is None or forward in type(backend).implements:
        return []
    return [f"{backend.name}.{feature} needs {forward}, which {backend.name} does not implement yet"]


def refusals(backend, feature: str, reasons: list[str]) -> list[str]:
    """`Backend.supports`'s ``reasons`` with "does not implement <vjp>" replaced by why not."""
    missing = missing_forward(backend, feature)
    if not missing:
        return reasons
    return missing + [r for r in reasons if not r.endswith(f"does not implement {feature}")]


def _need(backend, feature: str) -> None:
    from attnspec.backends.base import Unsupported

    if reasons := missing_forward(backend, feature):
        raise Unsupported("; ".join(reasons))


def _check_d_out(fn: str, backend, d_out, shape: tuple[int, ...], dtype: str, first: str) -> None:
    info = backend._info(fn, "d_out", d_out)  # refuses anything but the backend's own arrays
    if info.shape != tuple(shape):
        raise SpecError(f"{fn}: d_out.shape={info.shape} must equal the output shape {tuple(shape)}")
    if info.dtype != dtype:
        raise SpecError(f"{fn}: d_out.dtype={info.dtype} must equal {first}.dtype={dtype}")


def _lengths_to_numpy(backend) -> Callable[[Any], Any]:
    """q_lengths / kv_lengths as NumPy for the spec's checks (`ArrayLibrary.lengths_to_numpy`)."""
    return backend.library.lengths_to_numpy


# -- the two autodiff engines: (forward, leaves, d_out) -> gradients of every leaf ---------------


def torch_grads(backend, forward: Callable, leaves: list, d_out) -> list:
    import torch

    leaves = [x.detach().requires_grad_(True) for x in leaves]
    with torch.enable_grad():
        out = forward(*leaves)
    if not out.requires_grad:  # an empty case: the forward returned constant zeros
        return [torch.zeros_like(x) for x in leaves]
    grads = torch.autograd.grad(out, leaves, grad_outputs=d_out, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]


def jax_grads(backend, forward: Callable, leaves: list, d_out) -> list:
    import jax

    whole = backend.__dict__.pop("_vjp_on_route", None)  # the jax backend's whole vjp, jitted
    if whole is not None:
        grads = list(whole(*leaves, d_out))
    else:
        _, pullback = jax.vjp(forward, *leaves)
        grads = list(pullback(d_out))
    backend._last = grads[-1]
    return grads


ENGINES = {"torch": torch_grads, "jax": jax_grads}


def _zeros_like(engine: str, x):
    if engine == "torch":
        import torch

        return torch.zeros_like(x)
    import jax.numpy as jnp

    return jnp.zeros_like(x)


# -- the three vjps ----------------------------------------------------------------------------


def sdpa_vjp(backend, engine: str, q, k, v, d_out, **options) -> tuple:
    """(dq, dk, dv), then dbias with a bias, then dsinks with sinks (the spec's order).

    ``options`` are sdpa's keywords but the return_* ones. ALiBi slopes, segment ids and the
    dropout mask are constants of the vjp; bias and sinks are leaves of their own.
    """
    fn = f"{backend.name}.sdpa_vjp"
    _need(backend, "sdpa_vjp")
    o = take(fn, options, outputs=False)
    p = backend._plan_of(fn, q, k, v, o)  # the spec's checks
    backend.refuse_variants("sdpa_vjp", o)
    _check_d_out(fn, backend, d_out, p.out_shape, p.dtype, "q")
    bias, sinks = o.pop("bias"), o.pop("sinks")
    leaves = [q, k, v] + ([] if bias is None else [bias]) + ([] if sinks is None else [sinks])
    if p.n == 0 or p.m == 0 or p.hq == 0:  # nothing is visible: every gradient is 0, no forward to trace
        return tuple(_zeros_like(engine, x) for x in leaves)  # not x * 0: NaN * 0 is NaN

    def forward(q, k, v, *leaves):
        rest = list(leaves)
        b = rest.pop(0) if bias is not None else None
        return backend.sdpa(q, k, v, bias=b, sinks=rest.pop(0) if sinks is not None else None, **o)

    return tuple(ENGINES[engine](backend, forward, leaves, d_out))


def mha_vjp(backend, engine: str, query, key, value, params, d_out, num_heads, num_kv_heads=None, **options):
    """(d_query, d_key, d_value, d_params), then d_bias with a bias, then d_sinks with sinks.

    ``options`` as for `sdpa_vjp`: bias and sinks are leaves of their own, the rest constants.
    """
    fn = f"{backend.name}.mha_vjp"
    _need(backend, "mha_vjp")
    if not isinstance(params, MHAArrays):
        raise SpecError(
            f"{fn}: params must be an MHAArrays (from {backend.name}.asparams), got {type(params).__name__}"
        )
    sdpa_options = take(fn, options, outputs=False)
    inputs = (query, key, value, params, num_heads, num_kv_heads)
    p = _mha.validate(fn, backend._info, _lengths_to_numpy(backend), inputs, sdpa_options)
    backend.refuse_variants("mha_vjp", sdpa_options)
    mask, bias = sdpa_options.pop("mask"), sdpa_options.pop("bias")
    _check_d_out(fn, backend, d_out, (*p.batch, p.n, params.embed_dim), p.dtype, "query")
    sinks = sdpa_options.pop("sinks")
    options = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, mask=mask, **sdpa_options)
    names = [f.name for f in fields(MHAArrays) if getattr(params, f.name) is not None]

    def forward(query, key, value, *leaves):
        rest = list(leaves)
        p = MHAArrays(**dict(zip(names, rest[: len(names)])))
        del rest[: len(names)]
        b = rest.pop(0) if bias is not None else None
        return backend.mha(
            query, key, value, p, bias=b, sinks=rest.pop(0) if sinks is not None else None, **options
        )

    leaves = (
        [query, key, value]
        + [getattr(params, n) for n in names]
        + ([] if bias is None else [bias])
        + ([] if sinks is None else [sinks])
    )
    grads = ENGINES[engine](backend, forward, leaves, d_out)
    d_params = MHAArrays(**dict(zip(names, grads[3 : 3 + len(names)])))
    return (*grads[:3], d_params, *grads[3 + len(names) :])


def lsh_attention_vjp(backend, engine: str, x, v, d_out, **options) -> tuple:
    fn = f"{backend.name}.lsh_attention_vjp"
    _need(backend, "lsh_attention_vjp")
    p, options = _lsh_xp.plan(fn, backend._info, _lengths_to_numpy(backend), x, v, options, outputs=False)
    _check_d_out(fn, backend, d_out, (*p.batch, p.L, p.dv), p.dtype, "x")

    def forward(x, v):  # buckets and sort come from argmax/argsort: constants of the vjp
        return backend.lsh_attention(x, v, **options)

    return tuple(ENGINES[engine](backend, forward, [x, v], d_out))


if TYPE_CHECKING:  # a mixin listed before Backend: checked as one, so it sees Backend's members
    _AutodiffBase = Backend
else:
    _AutodiffBase = object


class Autodiff(_AutodiffBase):
    """The vjps of a framework backend, written once: its autodiff engine (a key of
    `ENGINES`) through its own forward methods. A framework's arrays class lists it before
    `Backend` (``class TorchArrays(Autodiff, Backend)``) and names its engine in ``_engine``."""

    _engine: ClassVar[str]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        cls.implements = with_forwards(cls.implements)  # no vjp without its forward

    def supports(self, feature: str, **case) -> list[str]:
        return refusals(self, feature, super().supports(feature, **case))

    @with_options(outputs=False)
    def sdpa_vjp(self, q, k, v, d_out, **options):
        options = take(f"{self.name}.sdpa_vjp", options, outputs=False)
        with self._routed(q, k, v, options):
            return sdpa_vjp(self, self._engine, q, k, v, d_out, **options)

    def _routed(self, q, k, v, options: dict):
        """A context around sdpa_vjp in which the forward may use what the concrete inputs tell
        (the conformant jax backend chooses its route there); none by default."""
        return contextlib.nullcontext()

    @with_options(outputs=False)
    def mha_vjp(self, query, key, value, params, d_out, *, num_heads, num_kv_heads=None, **options):
        return mha_vjp(
            self, self._engine, query, key, value, params, d_out, num_heads, num_kv_heads, **options
        )

    @with_options(outputs=False, table=LSH_OPTIONS)
    def lsh_attention_vjp(self, x, v, d_out, **options):
        return lsh_attention_vjp(self, self._engine, x, v, d_out, **options)
