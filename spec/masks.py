"""Boolean visibility masks (True = may attend).

Shape letters: n queries, m keys; ``...`` the leading dims of lengths or segment ids (they
broadcast against sdpa's batch dims). Every builder returns exactly the visibility that the
matching `sdpa` keyword produces, so ``sdpa(q, k, v, mask=causal_mask(n, m, "lower_right"))``
equals ``sdpa(q, k, v, causal="lower_right")`` bit for bit.
"""

from __future__ import annotations

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.validate import (
    INT_DTYPES,
    NO_EXTRAS,
    SDPAExtras,
    SDPAPlan,
    check_causal,
    check_lengths,
    check_window,
    is_int,
)

_PER_SEQUENCE = dict.fromkeys(("q_lengths", "kv_lengths", "q_segment_ids", "kv_segment_ids"))


def _check_size(fn: str, name: str, value: object) -> int:
    if not is_int(value) or value < 0:
        raise SpecError(f"{fn}: {name}={value!r} must be an int >= 0")
    return int(value)


def query_anchor(
    n: int,
    m: int,
    align: str | None,
    *,
    q_lengths: np.ndarray | None = None,
    kv_lengths: np.ndarray | None = None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
) -> np.ndarray:
    """i' for each query row i: the position the causal rule, the window and ALiBi measure from.

    ``None`` or ``"upper_left"``: i' = i. ``"lower_right"``: i' = i + m - n.
    ``"lower_right_lengths"``: i' = i + (kend - qend), the lower-right alignment of each sequence's
    actual lengths (FlashAttention's varlen alignment): qend = q_lengths (n if None) and kend =
    kv_lengths (m if None); with segment ids, qend and kend are one past the last query and the
    last key that carry query i's segment id, within those lengths. A row that sees no key anyway
    (negative id, id with no key, past q_lengths) gets i' = i.

    Returns int64 (n,), or (..., n) when lengths or segment ids are given with
    ``"lower_right_lengths"`` (their leading dims broadcast together). Arguments are NumPy arrays,
    assumed valid (sdpa validates them).
    """
    i = np.arange(n)
    if align == "lower_right":
        return i + (m - n)
    if align != "lower_right_lengths":
        return i
    if q_segment_ids is None:
        qend = n if q_lengths is None else np.asarray(q_lengths, np.int64)[..., None]
        kend = m if kv_lengths is None else np.asarray(kv_lengths, np.int64)[..., None]
        return i + (kend - qend)  # (..., n)
    qend, kend = _segment_ends(n, m, q_lengths, kv_lengths, q_segment_ids, kv_segment_ids)
    return i + (kend - qend)  # (..., n)


def _segment_ends(n, m, q_lengths, kv_lengths, q_ids, kv_ids) -> tuple[np.ndarray, np.ndarray]:
    """qend, kend (..., n) for each query row: one past the last valid query / key with its id.

    Rows that see nothing get qend = kend = 0. Sorting ids per sequence keeps this O(n + m) memory.
    """
    q_ids, kv_ids = np.asarray(q_ids, np.int64), np.asarray(kv_ids, np.int64)
    ql = np.asarray(n if q_lengths is None else q_lengths, np.int64)
    kl = np.asarray(m if kv_lengths is None else kv_lengths, np.int64)
    lead = np.broadcast_shapes(q_ids.shape[:-1], kv_ids.shape[:-1], ql.shape, kl.shape)
    q_ids = np.broadcast_to(q_ids, (*lead, n))
    kv_ids = np.broadcast_to(kv_ids, (*lead, m))
    ql, kl = np.broadcast_to(ql, lead), np.broadcast_to(kl, lead)
    qend = np.zeros((*lead, n), np.int64)
    kend = np.zeros((*lead, n), np.int64)
    for b in np.ndindex(*lead):
        qi, ki = q_ids[b], kv_ids[b]  # (n,), (m,)
        q_ok = (np.arange(n) < ql[b]) & (qi >= 0)
        k_ok = (np.arange(m) < kl[b]) & (ki >= 0)
        ids = np.unique(qi[q_ok])  # the segments some valid query belongs to
        if not ids.size:
            continue
        last_q = np.zeros(ids.size, np.int64)
        np.maximum.at(last_q, np.searchsorted(ids, qi[q_ok]), np.flatnonzero(q_ok) + 1)
        last_k = np.zeros(ids.size, np.int64)
        k_pos = np.searchsorted(ids, ki[k_ok])  # keys of an id no query has land anywhere:
        hit = (k_pos < ids.size) & (ids[np.minimum(k_pos, ids.size - 1)] == ki[k_ok])  # drop them
        np.maximum.at(last_k, k_pos[hit], np.flatnonzero(k_ok)[hit] + 1)
        at = np.searchsorted(ids, qi[q_ok])
        qend[b][q_ok] = last_q[at]
        kend[b][q_ok] = last_k[at]
    return qend, kend


def _with_head_axis(rows: np.ndarray) -> np.ndarray:
    """(n, m) stays; (..., n, m) becomes (..., 1, n, m), which broadcasts over the heads."""
    return rows if rows.ndim == 2 else rows[..., None, :, :]


def _anchor_for(fn: str, n: int, m: int, align: str | None, per_sequence: dict) -> np.ndarray:
    if align != "lower_right_lengths" and any(x is not None for x in per_sequence.values()):
        raise SpecError(
            f"{fn}: lengths and segment ids only shape the 'lower_right_lengths' "
            f"alignment, got align={align!r}"
        )
    ql = per_sequence["q_lengths"]
    kl = per_sequence["kv_lengths"]
    q_ids, kv_ids = per_sequence["q_segment_ids"], per_sequence["kv_segment_ids"]
    if ql is not None:
        ql = _lengths(fn, ql, n, "n", "q_lengths")
    if kl is not None:
        kl = _lengths(fn, kl, m, "m", "kv_lengths")
    if (q_ids is None) != (kv_ids is None):
        raise SpecError(f"{fn}: q_segment_ids and kv_segment_ids must be given together")
    if q_ids is not None:
        q_ids = _segment_ids(fn, "q_segment_ids", q_ids, n)
        kv_ids = _segment_ids(fn, "kv_segment_ids", kv_ids, m)
    return query_anchor(n, m, align, q_lengths=ql, kv_lengths=kl, q_segment_ids=q_ids, kv_segment_ids=kv_ids)[
        ..., :, None
    ]  # (..., n, 1)


def causal_mask(n: int, m: int, align: str = "upper_left", **per_sequence) -> np.ndarray:
    """(n, m) causal visibility: key j is visible from query i iff j <= i' (see `query_anchor`).

    ``"upper_left"``: iff j <= i (torch and JAX ``is_causal``).
    ``"lower_right"``: iff j <= i + m - n, so the last query sees the last key (FlashAttention,
    and what a KV cache of m keys with n new queries needs).
    ``"lower_right_lengths"``: iff j <= i + kend - qend, the lower-right alignment of each
    sequence's actual lengths; pass ``q_lengths``, ``kv_lengths``, ``q_segment_ids`` and
    ``kv_segment_ids`` as keywords, as for sdpa. With any of them the result is (..., 1, n, m).
    This rule alone does not hide keys past kv_lengths or of another segment: AND `padding_mask`
    and `segment_mask` for the whole of what sdpa applies.
    """
    n, m = _check_size("causal_mask", "n", n), _check_size("causal_mask", "m", m)
    if check_causal("causal_mask", align) is None:
        raise SpecError(
            "causal_mask: align=None is not an alignment; expected 'upper_left', "
            "'lower_right' or 'lower_right_lengths'"
        )
    anchor = _anchor_for("causal_mask", n, m, align, _per_sequence("causal_mask", per_sequence))
    return _with_head_axis(np.arange(m) <= anchor)


def window_mask(
    n: int, m: int, left: int, right: int, align: str | None = None, **per_sequence
) -> np.ndarray:
    """(n, m) sliding-window visibility: key j visible iff i' - left <= j <= i' + right.

    i' is `query_anchor`'s: i unless ``align`` is ``"lower_right"`` (i + m - n) or
    ``"lower_right_lengths"`` (per sequence, with the same keywords as `causal_mask`). This is
    the window that ``sdpa(window=(left, right), causal=align)`` applies (the causal rule itself
    is separate).
    """
    n, m = _check_size("window_mask", "n", n), _check_size("window_mask", "m", m)
    check_window("window_mask", (left, right))
    check_causal("window_mask", align)
    anchor = _anchor_for("window_mask", n, m, align, _per_sequence("window_mask", per_sequence))
    j = np.arange(m)
    return _with_head_axis((j >= anchor - left) & (j <= anchor + right))


def _per_sequence(fn: str, given: dict) -> dict:
    unknown = sorted(set(given) - set(_PER_SEQUENCE))
    if unknown:
        raise SpecError(
            f"{fn}: unexpected keyword {unknown[0]!r}; expected one of {', '.join(_PER_SEQUENCE)}"
        )
    return {**_PER_SEQUENCE, **given}


def segment_mask(q_segment_ids: np.ndarray, kv_segment_ids: np.ndarray) -> np.ndarray:
    """Packed sequences: shape (..., 1, n, m), True where the ids are equal and >= 0.

    A negative id marks padding: it matches nothing, not even the same negative id. The leading
    dims of the two arrays broadcast together; the result broadcasts against (..., Hq, n, m)
    exactly like ``sdpa(q_segment_ids=..., kv_segment_ids=...)``.
    """
    q_ids = _segment_ids("segment_mask", "q_segment_ids", q_segment_ids, None)
    kv_ids = _segment_ids("segment_mask", "kv_segment_ids", kv_segment_ids, None)
    try:
        np.broadcast_shapes(q_ids.shape[:-1], kv_ids.shape[:-1])
    except ValueError:
        raise SpecError(
            f"segment_mask: leading dims of q_segment_ids {q_ids.shape[:-1]} and "
            f"kv_segment_ids {kv_ids.shape[:-1]} do not broadcast"
        ) from None
    q_col, kv_row = q_ids[..., :, None], kv_ids[..., None, :]  # (..., n, 1), (..., 1, m)
    return ((q_col == kv_row) & (q_col >= 0))[..., None, :, :]  # (..., 1, n, m)


def _segment_ids(fn: str, name: str, ids: object, length: int | None) -> np.ndarray:
    if not isinstance(ids, np.ndarray):
        raise SpecError(f"{fn}: {name} must be an integer numpy.ndarray, got {type(ids).__name__}")
    if ids.dtype.name not in INT_DTYPES:
        raise SpecError(f"{fn}: {name}.dtype={ids.dtype.name} must be an integer dtype")
    if ids.ndim < 1 or (length is not None and ids.shape[-1] != length):
        raise SpecError(f"{fn}: {name}.shape={ids.shape} must be (..., {length})")
    return ids.astype(np.int64)


def segment_ids_from_cu_seqlens(cu_seqlens: np.ndarray, total: int) -> np.ndarray:
    """Segment ids (total,) int64 from FlashAttention-style cumulative sequence lengths.

    Position t belongs to sequence s when cu_seqlens[s] <= t < cu_seqlens[s + 1]; positions at
    or past cu_seqlens[-1] are padding, id -1. So ``sdpa(q_segment_ids=segment_ids_from_cu_seqlens(
    cu_q, n), kv_segment_ids=segment_ids_from_cu_seqlens(cu_k, m), ...)`` is varlen attention over
    packed q (n, ...) and k (m, ...). cu_seqlens must be a 1-D integer array (a list of ints is
    accepted) starting at 0, non-decreasing, with cu_seqlens[-1] <= total.
    """
    fn = "segment_ids_from_cu_seqlens"
    total = _check_size(fn, "total", total)
    if isinstance(cu_seqlens, (list, tuple)) and all(map(is_int, cu_seqlens)):
        cu_seqlens = np.asarray(cu_seqlens, np.int64).reshape(len(cu_seqlens))
    if not isinstance(cu_seqlens, np.ndarray) or cu_seqlens.dtype.name not in INT_DTYPES:
        what = (
            type(cu_seqlens).__name__
            if not isinstance(cu_seqlens, np.ndarray)
            else (f"dtype {cu_seqlens.dtype.name}")
        )
        raise SpecError(f"{fn}: cu_seqlens must be a 1-D integer array, got {what}")
    if cu_seqlens.ndim != 1 or cu_seqlens.size == 0:
        raise SpecError(f"{fn}: cu_seqlens.shape={cu_seqlens.shape} must be (S + 1,) with S >= 0")
    cu = cu_seqlens.astype(np.int64)
    if cu[0] != 0:
        raise SpecError(f"{fn}: cu_seqlens[0]={int(cu[0])} must be 0")
    if np.any(np.diff(cu) < 0):
        raise SpecError(f"{fn}: cu_seqlens={cu.tolist()} must be non-decreasing")
    if cu[-1] > total:
        raise SpecError(f"{fn}: cu_seqlens[-1]={int(cu[-1])} must be <= total={total}")
    t = np.arange(total)
    ids = np.searchsorted(cu, t, side="right") - 1  # empty sequences own no position
    return np.where(t < cu[-1], ids, -1).astype(np.int64)


def padding_mask(lengths: np.ndarray | int, m: int) -> np.ndarray:
    """Key padding: shape ``lengths.shape + (1, 1, m)``, True where key j < length.

    Broadcasts against (..., Hq, n, m) when ``lengths`` is over the batch dims, exactly like
    ``sdpa(kv_lengths=lengths)``.
    """
    m = _check_size("padding_mask", "m", m)
    lengths = _lengths("padding_mask", lengths, m, "m")
    return np.arange(m) < lengths[..., None, None, None]


def query_padding_mask(lengths: np.ndarray | int, n: int) -> np.ndarray:
    """Query padding: shape ``lengths.shape + (1, n, 1)``, True where query i < length.

    A masked query row has no visible key, so its output is 0: the same as ``sdpa(q_lengths=...)``.
    """
    n = _check_size("query_padding_mask", "n", n)
    lengths = _lengths("query_padding_mask", lengths, n, "n")
    return (np.arange(n) < lengths[..., None, None])[..., None]


def _lengths(fn: str, lengths: object, limit: int, limit_name: str, name: str = "lengths") -> np.ndarray:
    if isinstance(lengths, np.ndarray):
        shape = lengths.shape
    elif is_int(lengths):
        shape = ()
    else:
        shape = None  # check_lengths reports the type
    return check_lengths(fn, name, lengths, shape or (), limit, limit_name)


def visibility(
    n: int,
    m: int,
    *,
    causal: str | None,
    window: tuple[int, int] | None,
    q_lengths: np.ndarray | None,
    kv_lengths: np.ndarray | None,
    q_segment_ids: np.ndarray | None = None,
    kv_segment_ids: np.ndarray | None = None,
) -> np.ndarray | None:
    """The structural visibility of an sdpa call, AND-combined; None when everything is visible.

    The result broadcasts against (*batch, Hq, n, m). `visible` adds the explicit mask and bias
    (data rather than rules) for a whole call. Arguments are assumed valid (as in a plan).
    """
    vis = None
    per_sequence = dict(
        q_lengths=q_lengths, kv_lengths=kv_lengths, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids
    )
    anchor = query_anchor(n, m, causal, **per_sequence)[..., :, None]  # (..., n, 1): i'
    j = np.arange(m)

    def both(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
        return b if a is None else a & b

    if causal is not None:
        vis = both(vis, _with_head_axis(j <= anchor))
    if window is not None:
        vis = both(vis, _with_head_axis((j >= anchor - window[0]) & (j <= anchor + window[1])))
    if q_segment_ids is not None:
        q_col, kv_row = q_segment_ids[..., :, None], kv_segment_ids[..., None, :]
        vis = both(vis, ((q_col == kv_row) & (q_col >= 0))[..., None, :, :])  # (..., 1, n, m)
    if kv_lengths is not None:
        vis = both(vis, padding_mask(kv_lengths, m))
    if q_lengths is not None:
        vis = both(vis, query_padding_mask(q_lengths, n))
    return vis


def plan_anchor(
    plan: SDPAPlan, q_segment_ids: np.ndarray | None = None, kv_segment_ids: np.ndarray | None = None
) -> np.ndarray:
    """`query_anchor` of a validated call: i' per query row, (n,) or (..., n), from the plan's
    alignment and lengths and the call's segment ids."""
    p = plan
    return query_anchor(
        p.n,
        p.m,
        p.causal,
        q_lengths=p.q_lengths,
        kv_lengths=p.kv_lengths,
        q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids,
    )


def visible(
    plan: SDPAPlan,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    extras: SDPAExtras = NO_EXTRAS,
    *,
    structure: bool = True,
    lengths: bool = True,
) -> np.ndarray | None:
    """visible(i, j) of `attnspec.spec.sdpa`: every rule of a call ANDed, None when all is visible.

    The one place the rules meet: the structural ones of the plan (causal with its alignment and
    window when ``structure``, q/kv lengths when ``lengths``), the segment ids of ``extras``, the
    explicit ``mask`` and ``bias != -inf``. The golden, the tolerance rule, the gradients, the
    suite's strategies and the authoring kit's `attend_mask` all call it. The result broadcasts
    against (*batch, Hq, n, m) without being expanded to it; NumPy ``mask`` and ``bias`` are read,
    never modified. Arguments are assumed valid (as in a plan).
    """
    vis = visibility(
        plan.n,
        plan.m,
        causal=plan.causal if structure else None,
        window=plan.window if structure else None,
        q_lengths=plan.q_lengths if lengths else None,
        kv_lengths=plan.kv_lengths if lengths else None,
        q_segment_ids=extras.q_segment_ids,
        kv_segment_ids=extras.kv_segment_ids,
    )
    if mask is not None:
        vis = mask if vis is None else vis & mask
    if bias is not None:
        finite = bias != -np.inf  # -inf is an absent key; NaN stays visible (and propagates)
        vis = finite if vis is None else vis & finite
    return vis
