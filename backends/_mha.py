"""Multi-head attention for every backend: the spec's checks, the projections, the backend's sdpa.

Shape letters as in `attnspec.spec.mha`: ``...`` batch dims, n queries, m keys, E embed_dim,
H query heads, Hkv key/value heads, hd = E // H, P = Hkv * hd.

Each backend adds a thin ``mha`` method that calls `run` with its `HeadOps` (four array
operations: cast, linear, split heads, merge heads). Everything else is here, once:

* validation by `attnspec.spec.mha.validate_mha` on shapes and dtype names only, so a bad input
  raises the spec's `SpecError`, naming the backend's function;
* ``params``: an `MHAParams` (NumPy) is converted to the query's dtype and device by
  `Backend.asparams`; an `MHAArrays` of the backend's own arrays is used as it is, so autodiff
  reaches its fields;
* precision: projections, sdpa and the output projection run in float32 for float16, bfloat16 and
  float32 inputs and in float64 for float64 (`compute_dtype_name`, as the backends' exact sdpa
  paths do); the output and the weights are rounded once, to the query's dtype. The golden rounds
  only once too, so the error stays near one rounding of the result;
* the per-head attention is the backend's own conformant ``sdpa``, given every sdpa keyword
  unchanged, the variants of issue #15 included (they mean exactly what they mean to sdpa), so a
  row with no visible key gives attention output 0 and the layer's output is ``b_o``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnspec.backends._common import compute_dtype_name
from attnspec.backends.base import Backend, MHAArrays
from attnspec.errors import SpecError
from attnspec.spec.mha import MHAParams, ParamDims, check_param_infos, validate_mha
from attnspec.spec.validate import ArrayInfo, SDPAPlan

__all__ = ["HeadOps", "XPHeadOps", "arrays_of", "run", "validate"]

InfoFn = Callable[[str, str, Any], ArrayInfo]


class HeadOps:
    """The array operations mha needs besides sdpa; one subclass per framework."""

    def astype(self, x: Any, dtype: str) -> Any:
        raise NotImplementedError

    def linear(self, x: Any, w: Any, b: Any | None) -> Any:
        """x @ w.T + b: (..., L, in) -> (..., L, out), w in torch.nn.Linear's (out, in) layout."""
        raise NotImplementedError

    def split_heads(self, x: Any, heads: int) -> Any:
        """(..., L, H * hd) -> (..., H, L, hd): head h is columns h*hd : (h+1)*hd."""
        raise NotImplementedError

    def merge_heads(self, x: Any) -> Any:
        """(..., H, L, hd) -> (..., L, H * hd), the inverse of `split_heads`."""
        raise NotImplementedError

    def project(self, x: Any, w: Any, b: Any | None, heads: int, dtype: str) -> Any:
        """``split_heads(linear(x, w, b), heads)`` with x, w, b cast to ``dtype`` first:
        (..., L, in) -> (..., heads, L, hd). A framework that compiles may do it as one program."""
        x, w, b = (None if a is None else self.astype(a, dtype) for a in (x, w, b))
        return self.split_heads(self.linear(x, w, b), heads)

    def unproject(self, x: Any, w: Any, b: Any | None, dtype: str) -> Any:
        """``linear(merge_heads(x), w, b)`` with w, b cast to ``dtype``: (..., H, n, hd) -> (..., n, E)."""
        w, b = (None if a is None else self.astype(a, dtype) for a in (w, b))
        return self.linear(self.merge_heads(x), w, b)


class XPHeadOps(HeadOps):
    """`HeadOps` from an array API namespace ``xp`` (also ``jax.numpy``): standard functions only."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def astype(self, x, dtype):
        return self.xp.astype(x, getattr(self.xp, dtype))

    def linear(self, x, w, b):
        y = self.xp.matmul(x, self.xp.matrix_transpose(w))  # (..., L, in) @ (in, out) -> (..., L, out)
        return y if b is None else y + b

    def split_heads(self, x, heads):
        xp = self.xp
        x = xp.reshape(x, (*x.shape[:-1], heads, x.shape[-1] // heads))  # (..., L, H, hd)
        return xp.permute_dims(x, _swap_last_two_but_one(x.ndim))  # (..., H, L, hd)

    def merge_heads(self, x):
        xp = self.xp
        x = xp.permute_dims(x, _swap_last_two_but_one(x.ndim))  # (..., L, H, hd)
        return xp.reshape(x, (*x.shape[:-2], x.shape[-2] * x.shape[-1]))  # (..., L, H*hd)


def _swap_last_two_but_one(ndim: int) -> tuple[int, ...]:
    axes = list(range(ndim))
    axes[-3], axes[-2] = axes[-2], axes[-3]
    return tuple(axes)


def validate(
    fn: str, info: InfoFn, lengths_to_numpy: Callable[[Any], Any], inputs: tuple, options: dict[str, Any]
) -> SDPAPlan:
    """The spec's mha checks on a backend's arrays; returns the plan of the per-head sdpa call.

    ``inputs`` are mha's ``(query, key, value, params, num_heads, num_kv_heads)``, in that order;
    ``options`` its keywords as `attnspec.spec.options.take` gives them, mask and bias among them
    (return_weights, the caller's to act on, is not read; one the dict lacks is at its default).

    ``params`` may be an `MHAParams` (checked when it was built) or an `MHAArrays`, whose fields
    get MHAParams' checks here, named ``params.w_q`` and so on.
    """
    query, key, value, params, num_heads, num_kv_heads = inputs
    mask, bias = options.get("mask"), options.get("bias")
    rest = {name: x for name, x in options.items() if name not in ("mask", "bias", "return_weights")}

    def dims() -> ParamDims:
        if isinstance(params, MHAParams):
            return ParamDims(params.embed_dim, params.kdim, params.vdim, params.kv_dim)
        if isinstance(params, MHAArrays):

            def field_info(name: str) -> ArrayInfo | None:
                x = getattr(params, name)
                return None if x is None and name.startswith("b_") else info(fn, f"params.{name}", x)

            return check_param_infos(fn, field_info, prefix="params.")
        raise SpecError(
            f"{fn}: params must be an MHAParams or an MHAArrays of this backend's arrays, "
            f"got {type(params).__name__}"
        )

    return validate_mha(
        fn, info, query, key, value, dims, num_heads, num_kv_heads, mask, bias, rest, lengths_to_numpy
    )


def arrays_of(backend: Backend, params, dtype: str, device: str | None) -> MHAArrays:
    """``params`` as an `MHAArrays` of the backend's arrays (MHAParams in ``dtype`` on ``device``)."""
    if isinstance(params, MHAArrays):
        return params
    return backend.asparams(params, dtype, device)


def run(
    backend: Backend,
    fn: str,
    ops: HeadOps,
    lengths_to_numpy: Callable[[Any], Any],
    device: Callable[[], str | None],
    inputs: tuple,
    options: dict[str, Any],
):
    """mha on one backend, by `attnspec.spec.mha`'s definition.

    ``inputs`` are mha's ``(query, key, value, params, num_heads, num_kv_heads)``; ``options`` its
    keywords as `attnspec.spec.options.take` gives them, passed to the backend's sdpa per head
    unchanged but for bias and sinks, which go in the compute dtype, as that sdpa wants them in
    q's. A variant the backend lacks is refused (`Unsupported`), named as mha's. ``device()``
    names the query's device for `Backend.asparams` (called only for MHAParams).
    """
    query, key, value, params, num_heads, _ = inputs
    plan = validate(fn, backend._info, lengths_to_numpy, inputs, options)
    backend.refuse_variants("mha", options)
    hkv = plan.hkv
    prm = arrays_of(backend, params, plan.dtype, None if isinstance(params, MHAArrays) else device())
    ct = compute_dtype_name(plan.dtype)

    def c(x):
        return None if x is None else ops.astype(x, ct)

    q = ops.project(query, prm.w_q, prm.b_q, num_heads, ct)  # (..., H, n, hd)
    k = ops.project(key, prm.w_k, prm.b_k, hkv, ct)  # (..., Hkv, m, hd)
    v = ops.project(value, prm.w_v, prm.b_v, hkv, ct)  # (..., Hkv, m, hd)
    per_head = {**options, "bias": c(options.get("bias")), "sinks": c(options.get("sinks"))}
    return_weights, return_lse = options.get("return_weights", False), options.get("return_lse", False)
    result = backend.sdpa(q, k, v, **per_head)  # (..., H, n, hd)[, (.., H, n, m)][, (.., H, n)]
    result = list(result) if return_weights or return_lse else [result]
    out = ops.unproject(result[0], prm.w_o, prm.b_o, ct)  # (..., n, E)
    results = [ops.astype(out, plan.dtype)]
    if return_weights:
        results.append(ops.astype(result[1], plan.dtype))
    if return_lse:
        results.append(ops.astype(result[-1], plan.lse_dtype))
    return results[0] if len(results) == 1 else tuple(results)
