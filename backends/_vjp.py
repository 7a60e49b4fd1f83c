"""Vector-Jacobian products through a backend's own autodiff, written once over its forward.

A framework backend's ``sdpa_vjp``, ``mha_vjp`` and ``lsh_attention_vjp`` differentiate the
backend's own forward method (``self.sdpa``, ``self.mha``, ``self.lsh_attention``) with the
framework's autodiff, as a user training through it would: ``torch.autograd.grad`` or
``jax.vjp``. So the conformant backends' gradients are those of their conformant forward (its
fix-ups included: a ``where`` that drops a masked key also drops its gradient), and the native
backends' gradients are those of the native primitive. The results follow the spec's signatures
and return conventions (`attnspec.spec.sdpa_vjp`, `mha_vjp`, `lsh_attention_vjp`).

A vjp is offered only where its forward is: ``missing_forward`` gives `supports` the reason.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Callable

from attnspec._errors import SpecError
from attnspec.backends._base import MHAArrays

#: vjp -> the forward method it differentiates
FORWARD = {"sdpa_vjp": "sdpa", "mha_vjp": "mha", "lsh_attention_vjp": "lsh_attention"}


def missing_forward(backend, feature: str) -> list[str]:
    """``["needs mha"]``-style reasons when ``feature`` is a vjp whose forward the backend lacks."""
    forward = FORWARD.get(feature)
    if forward is None or forward in type(backend).implements:
        return []
    return [f"{backend.name}.{feature} needs {forward}, which {backend.name} does not implement yet"]


def _need(backend, feature: str) -> None:
    from attnspec.backends._base import Unsupported

    if reasons := missing_forward(backend, feature):
        raise Unsupported("; ".join(reasons))


def _check_d_out(fn: str, backend, out, d_out, first: str) -> None:
    info = backend._info(fn, "d_out", d_out)  # refuses anything but the backend's own arrays
    shape, dtype = tuple(out.shape), backend.dtype_name(out)
    if info.shape != shape:
        raise SpecError(f"{fn}: d_out.shape={info.shape} must equal the output shape {shape}")
    if info.dtype != dtype:
        raise SpecError(f"{fn}: d_out.dtype={info.dtype} must equal {first}.dtype={dtype}")


# -- the two autodiff engines: (forward, leaves, d_out) -> gradients of every leaf ---------------

def torch_grads(fn: str, backend, forward: Callable, leaves: list, d_out, first: str) -> list:
    import torch

    leaves = [x.detach().requires_grad_(True) for x in leaves]
    with torch.enable_grad():
        out = forward(*leaves)
    _check_d_out(fn, backend, out, d_out, first)
    if not out.requires_grad:  # an empty case: the forward returned constant zeros
        return [torch.zeros_like(x) for x in leaves]
    grads = torch.autograd.grad(out, leaves, grad_outputs=d_out, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves)]


def jax_grads(fn: str, backend, forward: Callable, leaves: list, d_out, first: str) -> list:
    import jax

    out, pullback = jax.vjp(forward, *leaves)
    _check_d_out(fn, backend, out, d_out, first)
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

def sdpa_vjp(backend, engine: str, q, k, v, d_out, *, mask=None, bias=None, causal=None,
             window=None, scale=None, q_lengths=None, kv_lengths=None) -> tuple:
    fn = f"{backend.name}.sdpa_vjp"
    _need(backend, "sdpa_vjp")
    p = backend._plan(fn, q, k, v, mask, bias, causal, window, scale, q_lengths, kv_lengths)  # the spec's checks
    leaves = [q, k, v] + ([] if bias is None else [bias])
    if p.n == 0 or p.m == 0 or p.hq == 0:  # nothing is visible: every gradient is 0, no forward to trace
        info = backend._info(fn, "d_out", d_out)
        if info.shape != p.out_shape or info.dtype != p.dtype:
            raise SpecError(f"{fn}: d_out has shape {info.shape} and dtype {info.dtype}; expected the "
                            f"output's shape {p.out_shape} and q's dtype {p.dtype}")
        return tuple(_zeros_like(engine, x) for x in leaves)  # not x * 0: NaN * 0 is NaN
    options = dict(mask=mask, causal=causal, window=window, scale=scale, q_lengths=q_lengths,
                   kv_lengths=kv_lengths)

    def forward(q, k, v, *b):
        return backend.sdpa(q, k, v, bias=b[0] if b else None, **options)

    return tuple(ENGINES[engine](fn, backend, forward, leaves, d_out, "q"))


def mha_vjp(backend, engine: str, query, key, value, params, d_out, *, num_heads, num_kv_heads=None,
            mask=None, bias=None, causal=None, window=None, scale=None, q_lengths=None,
            kv_lengths=None) -> tuple:
    fn = f"{backend.name}.mha_vjp"
    _need(backend, "mha_vjp")
    if not isinstance(params, MHAArrays):
        raise SpecError(f"{fn}: params must be an MHAArrays (from {backend.name}.asparams), "
                        f"got {type(params).__name__}")
    names = [f.name for f in fields(MHAArrays) if getattr(params, f.name) is not None]
    options = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, mask=mask, causal=causal,
                   window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths)

    def forward(query, key, value, *rest):
        p = MHAArrays(**dict(zip(names, rest[:len(names)])))
        return backend.mha(query, key, value, p, bias=rest[len(names)] if bias is not None else None,
                           **options)

    leaves = [query, key, value] + [getattr(params, n) for n in names] + ([] if bias is None else [bias])
    grads = ENGINES[engine](fn, backend, forward, leaves, d_out, "query")
    d_params = MHAArrays(**dict(zip(names, grads[3:3 + len(names)])))
    return (*grads[:3], d_params, *grads[3 + len(names):])


def lsh_attention_vjp(backend, engine: str, x, v, d_out, *, rotations, chunk_length, causal=False,
                      kv_lengths=None, dedup=False, scale=None) -> tuple:
    fn = f"{backend.name}.lsh_attention_vjp"
    _need(backend, "lsh_attention_vjp")
    options: dict[str, Any] = dict(rotations=rotations, chunk_length=chunk_length, causal=causal,
                                   kv_lengths=kv_lengths, dedup=dedup, scale=scale)

    def forward(x, v):  # buckets and sort come from argmax/argsort: constants of the vjp
        return backend.lsh_attention(x, v, **options)

    return tuple(ENGINES[engine](fn, backend, forward, [x, v], d_out, "x"))
