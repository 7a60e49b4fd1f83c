"""Everything a backend author needs, under public names.

    from attnspec.backends.authoring import Backend, Unsupported, plan_sdpa, attend_mask, ...

The contract: `Backend`, `Unsupported`, `MHAArrays`, `FLOAT_DTYPES`. Validation: `plan_sdpa`
checks one sdpa call on any framework's arrays with the spec's rules (so the spec's `SpecError`
messages) and returns an `SDPAPlan`; `validate_sdpa` + `ArrayInfo` do the same from shapes and
dtype names alone. Visibility: the spec's mask builders (`causal_mask`, `window_mask`,
`padding_mask`, `query_padding_mask`), and `attend_mask` / `additive_mask`, which fold every rule
of a call into the one mask an implementation takes. Layout: `to_blhd` / `to_bhld`,
`expand_kv_heads` (GQA: query head h reads kv head h // G), `flatten_batch` / `unflatten_batch`
(rank-2 inputs and broadcast batch dims -> one batch axis, and back).

Shape letters as in `attnspec.spec.sdpa`: ``batch`` the broadcast leading dims (flattened: B),
Hq / Hkv heads, G = Hq // Hkv, n queries, m keys, dk / dv head dims.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnspec.backends.arrays import ArrayLibrary, array_library, library_of
from attnspec.backends.base import FLOAT_DTYPES, Backend, MHAArrays, Unsupported
from attnspec.errors import SpecError
from attnspec.spec.masks import causal_mask, padding_mask, query_padding_mask, visible, window_mask
from attnspec.spec.options import ARRAY_NAMES, OPTIONS, VALUE_NAMES, take, with_options
from attnspec.spec.validate import ArrayInfo, SDPAExtras, SDPAPlan, validate_sdpa

__all__ = [
    "FLOAT_DTYPES",
    "ArrayInfo",
    "ArrayLibrary",
    "Backend",
    "MHAArrays",
    "SDPAPlan",
    "SpecError",
    "Unsupported",
    "additive_mask",
    "array_library",
    "attend_mask",
    "causal_mask",
    "expand_kv_heads",
    "flatten_batch",
    "flatten_mask",
    "library_of",
    "padding_mask",
    "plan_sdpa",
    "query_padding_mask",
    "to_bhld",
    "to_blhd",
    "unflatten_batch",
    "validate_sdpa",
    "window_mask",
]


#: plan_sdpa's keywords: sdpa's but return_weights, which asks for a result and changes no check
_PLANNED = tuple(o for o in OPTIONS if o.name != "return_weights")


@with_options(after=("library",), table=_PLANNED)
def plan_sdpa(
    fn: str, q: Any, k: Any, v: Any, *, library: ArrayLibrary | str | None = None, **options: Any
) -> SDPAPlan:
    """Validate one sdpa call on a framework's arrays by the spec's rules; return its plan.

    ``fn`` names the caller in messages (``"mine.sdpa"``). The keywords are sdpa's (but
    return_weights). q, k, v, mask, bias and the variants' arrays (alibi_slopes, sinks, segment
    ids, dropout_mask) must be arrays of one library (``library``, default: q's); softcap,
    dropout_p and return_lse land in the plan; lengths may be that library's integer arrays, NumPy
    arrays or ints. Nothing is converted silently: an array of another library is refused, and so
    is a keyword sdpa does not have.

    Raises:
        SpecError: the first problem, worded as the spec words it.
        TypeError: a keyword sdpa does not have, as Python words it.
    """
    o = take(fn, options, table=_PLANNED)
    lib = array_library(library) if library is not None else _library(fn, "q", q)

    arrays = {name: None if o[name] is None else lib.info(fn, name, o[name]) for name in ARRAY_NAMES}
    values = {
        name: lib.lengths_to_numpy(o[name]) if name.endswith("_lengths") else o[name] for name in VALUE_NAMES
    }
    q_info, k_info, v_info = (lib.info(fn, name, x) for name, x in (("q", q), ("k", k), ("v", v)))
    return validate_sdpa(fn, q_info, k_info, v_info, **arrays, **values, return_lse=o["return_lse"])


def _library(fn: str, name: str, x: object) -> ArrayLibrary:
    try:
        return library_of(x)
    except SpecError:
        raise SpecError(
            f"{fn}: {name} must be an array, got {type(x).__module__}.{type(x).__name__}"
        ) from None


def _numpy(x: Any) -> np.ndarray | None:
    return None if x is None else (x if isinstance(x, np.ndarray) else library_of(x).to_numpy(x))


def attend_mask(
    plan: SDPAPlan,
    mask: Any = None,
    bias: Any = None,
    *,
    structure: bool = True,
    lengths: bool = True,
    full: bool = False,
    q_segment_ids: Any = None,
    kv_segment_ids: Any = None,
) -> np.ndarray | None:
    """The one boolean "may attend" mask of a call (NumPy, True = attend), or None if all visible.

    Folds in, with AND: causal and window on the plan's alignment (``structure``), q/kv lengths
    (``lengths``), the explicit ``mask``, and ``bias != -inf``. Pass ``structure=False`` or
    ``lengths=False`` for what an implementation takes through arguments of its own. Segment ids
    (any library's integer arrays) are ANDed in when given, and anchor "lower_right_lengths".
    The result broadcasts against (*batch, Hq, n, m) -- for rank-2 inputs it is (n, m), the
    shape of their scores -- or has exactly ``plan.weights_shape`` with ``full``.
    ``mask`` and ``bias`` may be any library's arrays; they are read, never modified.
    """
    if structure and not lengths and plan.causal == "lower_right_lengths":
        raise SpecError(
            "attend_mask: causal='lower_right_lengths' is anchored on the lengths; it needs lengths=True"
        )
    ids = SDPAExtras(q_segment_ids=_numpy(q_segment_ids), kv_segment_ids=_numpy(kv_segment_ids))
    vis = visible(plan, _numpy(mask), _numpy(bias), ids, structure=structure, lengths=lengths)
    if full and vis is None:
        vis = np.ones((), bool)
    if vis is not None and (full or plan.squeeze_head):
        vis = np.broadcast_to(vis, plan.full_weights_shape).reshape(plan.weights_shape)
    return vis


def additive_mask(
    plan: SDPAPlan, mask: Any = None, bias: Any = None, *, dtype: str | None = None, **visibility: Any
) -> np.ndarray | None:
    """The call as one additive float mask (NumPy): ``bias`` (or 0) where visible, -inf elsewhere.

    None when nothing is masked and there is no bias. ``dtype`` defaults to the plan's (q's)
    dtype; -inf is exact in every float dtype. Broadcasts against (*batch, Hq, n, m).
    ``visibility`` are `attend_mask`'s keywords (``structure``, ``lengths``, the segment ids),
    which say what the mask folds in.
    """
    from attnspec.backends._common import numpy_dtype

    if "full" in visibility:  # the one attend_mask keyword that shapes its result, not its rules
        raise TypeError("additive_mask() got an unexpected keyword argument 'full'")
    vis = attend_mask(plan, mask, None, **visibility)
    b = _numpy(bias)
    if vis is None and b is None:
        return None
    b = np.zeros((), np.float64) if b is None else b
    out = np.where(True if vis is None else vis, b, -np.inf)
    if plan.squeeze_head:
        out = np.broadcast_to(out, plan.full_weights_shape).reshape(plan.weights_shape)
    return out.astype(numpy_dtype(dtype or plan.dtype))


def to_blhd(x: Any) -> Any:
    """(..., H, L, d) -> (..., L, H, d): swaps the head and length axes (FlashAttention's, JAX's layout)."""
    lib = library_of(x)
    axes = tuple(range(x.ndim - 3)) + (x.ndim - 2, x.ndim - 3, x.ndim - 1)
    return lib.permute(x, axes)


def to_bhld(x: Any) -> Any:
    """(..., L, H, d) -> (..., H, L, d), the inverse of `to_blhd` (the spec's layout)."""
    return to_blhd(x)  # the swap is its own inverse


def expand_kv_heads(x: Any, group: int) -> Any:
    """(..., Hkv, L, d) -> (..., Hkv * group, L, d), kv head j repeated for query heads
    j * G ... j * G + G - 1, so query head h reads kv head h // G (the spec's GQA mapping)."""
    if group == 1:
        return x
    return library_of(x).repeat(x, group, axis=x.ndim - 3)


def flatten_batch(plan: SDPAPlan, x: Any, heads: int, length: int) -> Any:
    """q, k or v -> (B, H, L, d): a rank-2 input gets its head axis, batch dims are broadcast to the
    plan's and flattened into one axis B = prod(batch) (1 when there are none)."""
    lib = library_of(x)
    if x.ndim == 2:
        x = lib.reshape(x, (1, *x.shape))  # (1, L, d): one head
    x = lib.broadcast_to(x, (*plan.batch, heads, length, x.shape[-1]))  # (*batch, H, L, d)
    return lib.reshape(x, (math.prod(plan.batch), heads, length, x.shape[-1]))  # (B, H, L, d)


def flatten_mask(plan: SDPAPlan, x: Any, *, keep_heads: bool = True) -> Any:
    """A mask or bias broadcasting to (*batch, Hq, n, m) -> (B, Hq or 1, n, m).

    With ``keep_heads=False`` a per-head mask is refused (SpecError) rather than flattened,
    for implementations whose mask has no head axis.
    """
    lib = library_of(x)
    heads = x.shape[-3] if x.ndim >= 3 else 1
    if heads != 1 and not keep_heads:
        raise SpecError(f"flatten_mask: a mask with {heads} heads cannot drop its head axis")
    x = lib.broadcast_to(x, (*plan.batch, heads, plan.n, plan.m))  # (*batch, Hq or 1, n, m)
    return lib.reshape(x, (math.prod(plan.batch), heads, plan.n, plan.m))  # (B, Hq or 1, n, m)


def unflatten_batch(plan: SDPAPlan, out: Any, *, layout: str = "bhld") -> Any:
    """An output (B, Hq, n, dv) -- or (B, n, Hq, dv) with ``layout="blhd"`` -- back to the spec's
    ``plan.out_shape``: (*batch, Hq, n, dv), or (n, dv) for rank-2 inputs."""
    lib = library_of(out)
    if layout == "blhd":
        out = to_bhld(out)  # (B, Hq, n, dv)
    elif layout != "bhld":
        raise SpecError(f"unflatten_batch: layout={layout!r} must be 'bhld' or 'blhd'")
    return lib.reshape(out, plan.out_shape)
