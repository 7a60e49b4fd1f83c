"""Pieces every adapter needs: structural visibility, per-sequence rules, dtype names. (A call is
checked by the public `attnspec.backends.authoring.plan_sdpa`, through `Backend.library`.)

Shape letters as in `attnspec.spec.sdpa`: ``batch`` the broadcast leading dims, Hq / Hkv heads,
n queries, m keys, dk / dv head dims.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from attnspec.spec.dtypes import NUMPY_DTYPES, compute_dtype_name, numpy_dtype  # noqa: F401  (re-exported)
from attnspec.spec.options import VARIANT_KEYWORDS
from attnspec.spec.validate import ArrayInfo, SDPAPlan

InfoFn = Callable[[str, str, Any], ArrayInfo]


def variant_keywords(scope: dict[str, Any]) -> dict[str, Any]:
    """The variant keywords of a call, picked from its ``locals()`` (those the method takes)."""
    return {name: scope[name] for name in VARIANT_KEYWORDS if name in scope}


def per_sequence_rules(p: SDPAPlan, q_segment_ids, kv_segment_ids) -> bool:
    """Whether the call's visibility depends on segment ids or each sequence's own lengths
    (``causal="lower_right_lengths"``): then `spec_visibility` builds it, in NumPy."""
    return q_segment_ids is not None or p.causal == "lower_right_lengths"


def spec_visibility(p: SDPAPlan, q_ids: np.ndarray | None, kv_ids: np.ndarray | None) -> np.ndarray | None:
    """The structural visibility of the call, segment ids and per-sequence alignment included,
    from the spec's own builder (NumPy, broadcastable to (*batch, Hq, n, m)); None if all visible.

    The anchors of "lower_right_lengths" with segment ids come from a per-sequence scan of the ids,
    which is data-dependent: backends read the (small, integer) ids back and build it here.
    """
    from attnspec.spec.masks import visible
    from attnspec.spec.validate import SDPAExtras

    return visible(p, extras=SDPAExtras(q_segment_ids=q_ids, kv_segment_ids=kv_ids))


def fold_per_sequence(p: SDPAPlan, q_ids: np.ndarray | None, kv_ids: np.ndarray | None):
    """(plan, vis): for a call with per-sequence rules, the plan without its structural rules
    (causal, window, lengths) and those rules with the segment ids as one NumPy bool array, to be
    ANDed into the mask; otherwise ``(p, None)``. Anchors for ALiBi come from the original plan."""
    if not per_sequence_rules(p, q_ids, kv_ids):
        return p, None
    vis = spec_visibility(p, q_ids, kv_ids)
    return dataclasses.replace(p, causal=None, window=None, q_lengths=None, kv_lengths=None), vis


def alibi_distance(p: SDPAPlan, q_ids: np.ndarray | None, kv_ids: np.ndarray | None) -> np.ndarray:
    """|i' - j| as float64 (1, n, m) or (*batch, 1, n, m), i' the spec's anchor (`query_anchor`):
    times -alibi_slopes[..., :, None, None] it is the ALiBi term of the logits."""
    from attnspec.spec.masks import plan_anchor

    anchor = plan_anchor(p, q_ids, kv_ids)  # (n,) or (..., n)
    dist = np.abs(anchor[..., :, None] - np.arange(p.m)).astype(np.float64)  # (..., n, m)
    return dist[..., None, :, :]  # (..., 1, n, m)


def is_empty(p: SDPAPlan) -> bool:
    """No query, no key, no head or no batch element: the result is all zeros, nothing to compute
    (a reduction over the empty batch, a tile's running maximum, has no identity)."""
    return p.n == 0 or p.m == 0 or p.hq == 0 or 0 in p.batch


def lengths_column(p: SDPAPlan) -> tuple[np.ndarray | None, np.ndarray | None]:
    """q_lengths and kv_lengths reshaped to (*batch, 1, 1, 1), ready to compare with positions."""

    def col(x):
        return None if x is None else np.ascontiguousarray(x).reshape(*p.batch, 1, 1, 1)

    return col(p.q_lengths), col(p.kv_lengths)


def visibility(
    n: int,
    m: int,
    causal: str | None,
    window: tuple[int, int] | None,
    q_len,
    kv_len,
    arange: Callable[[int], Any],
):
    """Structural visibility (causal, window, lengths) as a bool array, or None if all visible.

    Built from `arange`, indexing with None and comparison operators only, so torch, JAX and any
    array API namespace run the same code; the rules are those of `attnspec.spec.masks`.
    ``q_len``/``kv_len`` are framework int arrays shaped (*batch, 1, 1, 1) (see `lengths_column`).
    The result broadcasts against (*batch, Hq, n, m): (n, m), or (*batch, 1, n, m) with lengths.
    """
    if causal == "lower_right_lengths":  # its anchors depend on the data: see `fold_per_sequence`
        raise ValueError("visibility: causal='lower_right_lengths' needs spec_visibility")
    i = arange(n)[:, None]  # (n, 1)
    j = arange(m)[None, :]  # (1, m)
    anchor = i + (m - n) if causal == "lower_right" else i  # (n, 1): i', the diagonal
    vis = None

    def both(a, b):
        return b if a is None else a & b

    if causal is not None:
        vis = both(vis, j <= anchor)
    if window is not None:
        vis = both(vis, (j >= anchor - window[0]) & (j <= anchor + window[1]))
    if kv_len is not None:
        vis = both(vis, j < kv_len)  # (*batch, 1, 1, m)
    if q_len is not None:
        vis = both(vis, i < q_len)  # (*batch, 1, n, 1)
    return vis


def with_mask_and_bias(vis: Any, mask: Any, bias: Any, neg_inf: Any) -> Any:
    """AND the data rules into `vis`: an explicit mask, and bias != -inf (an absent key)."""
    if mask is not None:
        vis = mask if vis is None else vis & mask
    if bias is not None:
        finite = bias != neg_inf
        vis = finite if vis is None else vis & finite
    return vis


def static_plan(p: SDPAPlan) -> SDPAPlan:
    """The plan without its length arrays: hashable, so it can be a static argument of a jit.

    The lengths travel as traced arrays instead, so new length values do not recompile.
    """
    return dataclasses.replace(p, q_lengths=None, kv_lengths=None)


def to_reference(x: np.ndarray, dtype: str | None) -> np.ndarray:
    """``x`` as NumPy in the requested dtype, rounded once, in NumPy (ml_dtypes for bfloat16).

    Every backend rounds here and then moves the already-rounded values, so the golden and the
    backend see the same bits.
    """
    x = np.asarray(x)
    return x if dtype is None else x.astype(numpy_dtype(dtype))
