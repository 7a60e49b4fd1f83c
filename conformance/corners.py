"""The corner cases every property draws in every profile, however few examples it runs.

Hypothesis' derandomized draws are many, but with 12 examples (the ``dev`` profile) a property
and dtype can miss a row with no visible key, or never hide a NaN key. So each property also runs
three fixed cases (`with_corners`) besides its drawn ones:

- ``corner_finite_floor``: every row sees a key, four rows see them only at large negative biases;
- ``corner_empty_rows``: a row hidden by the mask and rows hidden by ``q_lengths``, next to keys
  hidden by the mask and by -inf biases;
- ``corner_hidden_nonfinite``: keys beyond ``kv_lengths`` holding NaN and inf, next to the same.

A backend that takes no bias (a mask-only function) refuses those three, so each property then
runs their mask-only twins (`MASK_ONLY`) in their place: floor rows whose logits come from q.k
(`mask_only_floor`); rows hidden by the mask alone and by ``q_lengths``; NaN and inf keys hidden
by the mask and by ``kv_lengths``. The floor twin's logits are exact (powers of two), but the
tolerance rule charges the rounding of eps * |q.k| (it cannot know a product is exact), one
allowance per case grown by the deepest level, so it holds only the levels whose leak the rule
resolves, decided by computing the golden, its allowed error and the output under the fill each
level catches (`mask_only_floor_levels`): -2**14 and -2**20 in float32 (they catch -1e4 and -1e6
fills; -1e9 would need a level whose allowance exceeds any leak), -2**30 too in float64, none in
float16 and bfloat16, where the twin is the same case without floor rows and without the
``finite_floor`` tag.

They are apart so that a backend's declared deviation for one rule (say, empty rows give
mean(V)) does not excuse a failure of another in the same case; so only the first (and its twin)
carries the ``finite_floor`` tag and floor rows (a backend declaring a finite mask fill, as jax.nn does, is
still held to empty rows and hidden NaN keys by the other two). The floor rows have visible keys
at the bottom of the dtype's finite range: the query row is zero, so each logit is
its bias alone, and the biases of the row's visible keys are one of
`floor_levels` (-1e4, -1e9, -0.7 * finfo.max, finfo.min, those the dtype can hold), next to keys
hidden by the mask and by -inf biases. A backend that masks with a finite fill F instead of
excluding keys gives a hidden key of such a row the weight exp(F - level) relative to a visible
one; every finite F >= finfo.min, so the finfo.min row catches every fill, and each level catches
the fills at or above it. The logits are exact (the bias is stored in the dtype, and 0 + bias is
exact), so the tolerance rule charges no rounding for their size (`attnspec.spec.tolerance`).

The shapes, (2, 2, 8, 4) for q, k and v, are among the drawn ones, so a compiling backend (JAX)
reuses its compiled functions.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import ml_dtypes
import numpy as np

#: the bases a refused tour falls back to (`Tour.fallbacks`): the plainest, and a causal one for
#: conventions that are always causal (vLLM's paged attention)
FALLBACK_BASES = ("plain", "causal_lower_right")
#: the fixed cases
CORNERS = ("corner_finite_floor", "corner_empty_rows", "corner_hidden_nonfinite")
#: their twins without a bias, run where a backend refuses the first (`with_corners`)
MASK_ONLY = (
    "corner_finite_floor_mask_only",
    "corner_empty_rows_mask_only",
    "corner_hidden_nonfinite_mask_only",
)
#: fixed cases of one rule's edges, run by `test_matches_golden` besides `CORNERS` and exported in
#: the sdpa bundles (a bundle must be as strong as the suite), each added when mutation testing
#: found drawn cases too rare to reach its rule (reports/mutation.md): a window's edges
#: (`window_edge_case`), NaN/inf values a row sees (`visible_nonfinite_case`), a NaN bias
#: (`nan_bias_case`), batch axes each of q, k, v carries alone (`batch_carriers_case`); and, when
#: the draws were seeded anew (session 20) and the dev profile's few examples no longer met them,
#: the default scale and the softmax axis (`plain_case`) and the causal diagonal (`causal_edge_case`)
EDGE_CORNERS = (
    "corner_window_edge",
    "corner_visible_nonfinite",
    "corner_nan_bias",
    "corner_batch_carriers",
    "corner_plain",
    "corner_causal_edge",
)
_N = _M = 8  # rows and keys: n, m of the corner cases
_FLOOR_ROWS = (1, 2, 3, 4)  # rows whose visible keys sit at a floor level


def floor_levels(dtype: str) -> tuple[float, ...]:
    """The large negative finite biases real code fills masks with, those finite in ``dtype``,
    rounded to it: -1e4, -1e9, -0.7 * finfo.max and finfo.min."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES

    npdt = NP_DTYPES[dtype]
    fi = ml_dtypes.finfo(npdt)
    levels = (-1e4, -1e9, -0.7 * float(fi.max), float(fi.min))
    return tuple(float(np.asarray(x).astype(npdt)) for x in levels if x >= float(fi.min))


def floor_rows(q: np.ndarray, bias: np.ndarray, rows, levels) -> None:
    """In place: query rows ``rows`` become zero and their finite biases one level each (-inf
    biases stay), so each of those rows' logits is exactly its level."""
    rows = np.asarray(rows, dtype=np.int64)
    q[..., rows, :] = 0.0
    b = bias[..., rows, :]  # (..., r, m)
    bias[..., rows, :] = np.where(b == -np.inf, -np.inf, np.asarray(levels, np.float64)[:, None])


def _drawn(seed: int):
    """A corner's generator (``seed``), its q, k, v of the corner shape, the key index j, and its
    mask: row r hides the keys with (j + r) % 3 == 0, where a finite fill would land."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, 2, _N, 4))  # (B, H, n, dk)
    k = rng.standard_normal((2, 2, _M, 4))  # (B, H, m, dk)
    v = rng.standard_normal((2, 2, _M, 4))  # (B, H, m, dv)
    j = np.arange(_M)
    mask = np.ones((_N, _M), bool)
    for r in range(_N):
        mask[r, (j + r) % 3 == 0] = False
    return rng, q, k, v, j, mask


def corner_case(kind: str, dtype: str):
    """The fixed case ``kind`` (one of `CORNERS`) in ``dtype``."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    if kind in MASK_ONLY:
        return mask_only_case(kind, dtype)
    if kind in EDGE_CORNERS:
        return {
            "corner_window_edge": window_edge_case,
            "corner_visible_nonfinite": visible_nonfinite_case,
            "corner_nan_bias": nan_bias_case,
            "corner_batch_carriers": batch_carriers_case,
            "corner_plain": plain_case,
            "corner_causal_edge": causal_edge_case,
        }[kind](dtype)
    if kind not in CORNERS:
        raise ValueError(f"corner_case: kind={kind!r}, expected one of {CORNERS + MASK_ONLY + EDGE_CORNERS}")
    rng, q, k, v, j, mask = _drawn(19 + CORNERS.index(kind))
    bias = rng.standard_normal((_N, _M)) * 2
    for r in range(_N):
        bias[r, (j + r) % 3 == 1] = -np.inf  # hidden by the bias
    tags = {kind, dtype}
    # the floor rows only here: a declared finite fill excuses no other rule
    if kind == "corner_finite_floor":
        levels = floor_levels(dtype)
        floor_rows(q, bias, _FLOOR_ROWS, [levels[i % len(levels)] for i in range(len(_FLOOR_ROWS))])
        tags.add("finite_floor")
    options: dict[str, Any] = {"mask": mask}
    if kind == "corner_empty_rows":
        mask[0] = False  # row 0 sees no key
        options["q_lengths"] = np.array([_N, 6], dtype=np.int64)  # rows 6, 7 of batch 1 see nothing
    elif kind == "corner_hidden_nonfinite":
        lengths = np.array([6, 4], dtype=np.int64)  # every floor row keeps a visible key below 4
        options["kv_lengths"] = lengths
        beyond = j[None, :] >= lengths[:, None]  # (B, m)
        k[np.broadcast_to(beyond[:, None, :], k.shape[:-1])] = np.nan  # (B, H, m) selects keys
        v[np.broadcast_to(beyond[:, None, :], v.shape[:-1])] = np.inf
        v[1, :, -1] = -np.inf
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    options["bias"] = bias.astype(npdt)
    tag_visibility(tags, q, k, v, options)
    return SDPACase(kind, dtype, q, k, v, options, frozenset(tags), 19)


def window_edge_case(dtype: str):
    """``corner_window_edge``: a window with no causal rule, where its right edge shows.

    Under any causal rule a window's right edge is hidden anyway (j <= i'), so a backend that
    shows one key too many on the right, ``window=(left, right + 1)``, differs from the spec only
    without one, and on rows whose extra key exists: drawn cases meet that too rarely (mutation
    testing found the gap, reports/mutation.md). Here q = 0, so every row averages its visible
    values exactly, and v[j] = j + 1 (exact in every dtype): with ``window=(1, 2)`` row i averages
    keys i - 1 .. i + 2, and a key gained or lost at either edge moves the mean by at least 0.4,
    far past the tolerance. The shape is the other corners' (B, H, n, m) = (2, 2, 8, 8), square,
    so conventions that anchor windows lower-right express it too."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    _, q, k, v, j, _ = _drawn(29)
    q[:] = 0.0
    v[:] = (j + 1.0)[:, None]
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    options: dict[str, Any] = {"window": (1, 2)}
    tags = {"corner_window_edge", dtype, "window"}
    tag_visibility(tags, q, k, v, options)
    return SDPACase("corner_window_edge", dtype, q, k, v, options, frozenset(tags), 19)


def plain_case(dtype: str):
    """``corner_plain``: attention with no option at all, on shapes where its rules show.

    The default scale 1/sqrt(dk) differs from 1 and from 1/dk only when dk > 1, and a softmax taken
    over the wrong axis differs from the spec's only when n > 1 and m > 1: a drawn case can be as
    small as n = m = dk = 1 (Hypothesis' first example is the smallest), and the dev profile draws
    few. Here (B, H, n, m, dk) = (2, 2, 8, 8, 4) with q, k, v standard normal."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    _, q, k, v, _, _ = _drawn(43)
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    options: dict[str, Any] = {}
    tags = {"corner_plain", dtype}
    tag_visibility(tags, q, k, v, options)
    return SDPACase("corner_plain", dtype, q, k, v, options, frozenset(tags), 19)


def causal_edge_case(dtype: str):
    """``corner_causal_edge``: the causal diagonal, where a key too many (or too few) shows.

    As `window_edge_case` does for a window: q = 0, so every row averages its visible values
    exactly, and v[j] = j + 1 (exact in every dtype). Under ``causal="upper_left"`` row i averages
    keys 0 .. i, mean (i + 2) / 2; a rule that lets row i see key i + 1 too (or hides key i) moves
    that mean by 0.5, far past the tolerance. Square, so the lower-right rule is the same and
    every convention with a causal flag expresses it."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    _, q, k, v, j, _ = _drawn(47)
    q[:] = 0.0
    v[:] = (j + 1.0)[:, None]
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    options: dict[str, Any] = {"causal": "upper_left"}
    tags = {"corner_causal_edge", dtype, "causal_upper_left"}
    tag_visibility(tags, q, k, v, options)
    return SDPACase("corner_causal_edge", dtype, q, k, v, options, frozenset(tags), 19)


def visible_nonfinite_case(dtype: str):
    """``corner_visible_nonfinite``: a NaN or inf value a row sees reaches its output.

    Hidden non-finite values must never reach a row, visible ones always do (spec decisions 2
    and 3). Drawn cases poison hidden keys only, so an implementation that scrubs non-finite
    values (or takes them as 0) passed. This corner is causal (square, so every convention takes
    it), and every non-finite value sits on key 0, which every row sees, so nothing here is
    hidden (hidden ones are the other corners' business): in batch 0 key 0's value is NaN, and row
    0 sees key 0 alone, so every row of batch 0 is NaN; in batch 1 key 0's value is +inf in its
    first component only, so every row is +inf there and finite in the others."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    _, q, k, v, _, _ = _drawn(31)
    v[0, :, 0, :] = np.nan
    v[1, :, 0, 0] = np.inf
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    options: dict[str, Any] = {"causal": "lower_right"}
    tags = {"corner_visible_nonfinite", dtype, "causal_lower_right"}
    tag_visibility(tags, q, k, v, options)
    tags.discard("masked_nonfinite")  # no non-finite value is hidden: no deviation about hidden ones applies
    return SDPACase("corner_visible_nonfinite", dtype, q, k, v, options, frozenset(tags), 19)


def batch_carriers_case(dtype: str):
    """``corner_batch_carriers``: three batch axes, each of which only one of q, k, v has.

    q is (2, 1, 1, H, n, dk), k (1, 2, 1, H, m, dk), v (1, 1, 2, H, m, dv): the batch is (2, 2, 2)
    only if it is taken from all three. An implementation that takes it from q and k alone (or
    reads one of them as if it had the whole batch) fails here; drawn cases broadcast one of the
    three at a time, and the dev profile met too few of them to catch it (mutation testing)."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    rng = np.random.default_rng(41)
    q = rng.standard_normal((2, 1, 1, 2, _N, 4))
    k = rng.standard_normal((1, 2, 1, 2, _M, 4))
    v = rng.standard_normal((1, 1, 2, 2, _M, 4))
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    options: dict[str, Any] = {}
    tags = {"corner_batch_carriers", dtype, "batch_broadcast"}
    tag_visibility(tags, q, k, v, options)
    return SDPACase("corner_batch_carriers", dtype, q, k, v, options, frozenset(tags), 19)


def nan_bias_case(dtype: str):
    """``corner_nan_bias``: a NaN bias on a visible key makes its row NaN, like any NaN logit;
    only -inf hides a key. Row 2 of batch 0, head 0 has a NaN bias at key 5; every other row is
    finite. An implementation that tests visibility as ``bias > -inf`` drops the key instead."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    rng, q, k, v, _, _ = _drawn(37)
    bias = rng.standard_normal((2, 2, _N, _M))
    bias[0, 0, 2, 5] = np.nan
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    options: dict[str, Any] = {"bias": bias.astype(npdt)}
    tags = {"corner_nan_bias", dtype, "bias"}
    tag_visibility(tags, q, k, v, options)
    return SDPACase("corner_nan_bias", dtype, q, k, v, options, frozenset(tags), 19)


def mask_only_case(kind: str, dtype: str):
    """The mask-only twin ``kind`` (one of `MASK_ONLY`) in ``dtype``: no bias, keys hidden by the
    mask and lengths only, drawn q and k (logits of a few units; the floor twin's are built,
    `mask_only_floor`)."""
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    if kind not in MASK_ONLY:
        raise ValueError(f"mask_only_case: kind={kind!r}, expected one of {MASK_ONLY}")
    if kind == "corner_finite_floor_mask_only":
        q, k, v, floor_options = mask_only_floor(dtype, mask_only_floor_levels(dtype))
        tags = {kind, dtype} | ({"finite_floor"} if mask_only_floor_levels(dtype) else set())
        tag_visibility(tags, q, k, v, floor_options)
        return SDPACase(kind, dtype, q, k, v, floor_options, frozenset(tags), 19)
    _, q, k, v, j, mask = _drawn(23 + MASK_ONLY.index(kind))
    options: dict[str, Any] = {"mask": mask}
    if kind == "corner_empty_rows_mask_only":
        mask[0] = False  # row 0 sees no key
        options["q_lengths"] = np.array([_N, 6], dtype=np.int64)  # rows 6, 7 of batch 1 see nothing
    else:
        lengths = np.array([6, 4], dtype=np.int64)
        options["kv_lengths"] = lengths
        beyond = j[None, :] >= lengths[:, None]  # (B, m)
        k[np.broadcast_to(beyond[:, None, :], k.shape[:-1])] = np.nan  # (B, H, m) selects keys
        v[np.broadcast_to(beyond[:, None, :], v.shape[:-1])] = np.inf
        v[1, :, -1] = -np.inf
        mask[:, 5] = False  # key 5 of batch 0 is within its length, hidden by the mask alone
        k[0, :, 5], v[0, :, 5] = np.nan, -np.inf
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    tags = {kind, dtype}
    tag_visibility(tags, q, k, v, options)
    return SDPACase(kind, dtype, q, k, v, options, frozenset(tags), 19)


#: the finite mask fills the mask-only floor tries to catch, each by a floor level at or below it
MASK_ONLY_FILLS = ("-1e4", "-1e6", "-1e9", "-0.7 * finfo.max", "finfo.min")
#: a level is kept where the leak of the fill it catches is at least this many times `allowed`
FLOOR_MARGIN = 2.0
_B = 7  # floor keys have k[0] = -2**_B; a floor row at level -2**p has q[0] = 2**(p + 1 - _B)
_FLOOR_KEYS, _HIDDEN_KEYS = (0, 1, 2, 3), (4, 5, 6, 7)  # k[0] = -2**_B, and k[0] = 0


def mask_only_floor(dtype: str, levels: tuple[float, ...]):
    """q, k, v and options of the mask-only floor twin with floor levels ``levels`` (powers of two,
    <= 0; none gives the same case with no floor rows): (2, 2, 8, 4), dk = 4, so scale = 0.5.

    Floor row r gets q = [2**(p + 1 - _B), 0, 0, 0] for its level -2**p and sees only keys 0-3,
    whose k[0] = -2**_B: each logit is 0.5 * q[0] * k[0] = -2**p exactly in any dtype that holds
    the factors. The keys hidden from it (4-7: by the mask, and in batch 1 keys 6, 7 by
    ``kv_lengths`` alone) have k[0] = 0, so under a finite fill F their logit is F whether F
    replaces it or is added to it. Visible values are +1, hidden -1: hidden keys that take the
    weight move the row by up to 2. The other rows have q[0] = 0 (logits of a few units) and the
    mask of `_drawn`.
    """
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES

    _, q, k, v, j, drawn = _drawn(29)
    mask = np.broadcast_to(drawn, (2, 1, _N, _M)).copy()  # (B, 1, n, m): batch 1 differs below
    floor = list(_FLOOR_ROWS) if levels else []
    q[..., 0] = 0.0
    for i, r in enumerate(floor):
        p = round(np.log2(-levels[i % len(levels)]))
        q[..., r, :] = 0.0
        q[..., r, 0] = 2.0 ** (p + 1 - _B)
        mask[:, :, r] = np.isin(j, _FLOOR_KEYS)
        mask[1, :, r, 6:] = True  # hidden by kv_lengths alone
    k[..., _FLOOR_KEYS, 0] = -(2.0**_B)
    k[..., _HIDDEN_KEYS, 0] = 0.0
    v[..., _FLOOR_KEYS, :] = 1.0
    v[..., _HIDDEN_KEYS, :] = -1.0
    options: dict[str, Any] = {"mask": mask, "kv_lengths": np.array([_M, 6], dtype=np.int64)}
    npdt = NP_DTYPES[dtype]
    return q.astype(npdt), k.astype(npdt), v.astype(npdt), options


@functools.cache
def mask_only_floor_levels(dtype: str) -> tuple[float, ...]:
    """The floor levels of the mask-only twin in ``dtype``, decided by computation.

    For each fill F of `MASK_ONLY_FILLS` (finite in ``dtype``), shallowest first, the level is
    the power of two at or below it, -2**ceil(log2 |F|). It is kept if, with it and the levels
    kept before, every level's row under its fill (F in place of the hidden keys' logits) is off
    the golden by at least `FLOOR_MARGIN` times the case's allowed error (`attnspec.spec.tolerance`:
    one number per case, grown by the deepest level through L). The first level that fails ends
    the list: a deeper one only grows L.
    """
    from attnspec.backends.compare import sdpa_golden
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES

    fi = ml_dtypes.finfo(NP_DTYPES[dtype])
    fills = {
        "-1e4": -1e4,
        "-1e6": -1e6,
        "-1e9": -1e9,
        "-0.7 * finfo.max": -0.7 * float(fi.max),
        "finfo.min": float(fi.min),
    }
    kept: list[tuple[float, float]] = []  # (level, the fill it catches)
    for name in MASK_ONLY_FILLS:
        fill = fills[name]
        p = int(np.ceil(np.log2(-fill)))
        if fill < float(fi.min) or p + 1 >= fi.maxexp or any(lv <= -(2.0**p) for lv, _ in kept):
            break  # the fill or the level's factors overflow the dtype, or a kept level catches it
        trial = [*kept, (-(2.0**p), fill)]
        levels = tuple(lv for lv, _ in trial)
        q, k, v, options = mask_only_floor(dtype, levels)
        golden = sdpa_golden(q, k, v, **options)
        if not np.isfinite(golden.allowed_out):
            break
        for i, (lv, f) in enumerate(trial):
            rows = [r for n, r in enumerate(_FLOOR_ROWS) if n % len(trial) == i]
            leak = np.abs(_filled(q, k, v, options, f) - golden.out)[..., rows, :].max()
            if not leak >= FLOOR_MARGIN * golden.allowed_out:
                return tuple(lv for lv, _ in kept)
        kept = trial
    return tuple(lv for lv, _ in kept)


def _filled(q, k, v, options, fill: float) -> np.ndarray:
    """sdpa of the floor twin with ``fill`` in place of each hidden key's logit, rounded to the
    inputs' dtype, (B, H, n, dv): what a backend masking with that fill returns."""
    from attnspec.conformance.hypothesis_helpers import case_plan, full_visibility

    plan, _ = case_plan(q, k, v, options)
    vis = full_visibility(plan, options)  # (B, H, n, m)
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    s = np.where(vis, plan.scale * (q64 @ np.swapaxes(k64, -1, -2)), fill)  # (B, H, n, m)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    out = (w / w.sum(axis=-1, keepdims=True)) @ v64  # (B, H, n, dv)
    return out.astype(q.dtype).astype(np.float64)


class Corner:
    """Stands in for Hypothesis' ``data`` in a corner's run: a draw of a case strategy
    (`sdpa_cases`, `variant_cases`) gives the corner case ``kind``, every other draw its simplest
    value (the first of a sampled_from, False, the lower bound, the identity permutation)."""

    def __init__(self, kind: str):
        self.kind = kind

    def draw(self, strategy, label: Any = None) -> Any:
        build = getattr(strategy, "attn_corner", None)
        return build(self) if build is not None else simplest(strategy)

    __call__ = draw  # a composite strategy's body takes ``draw``

    def __repr__(self) -> str:
        return f"Corner({self.kind!r})"


class NotThisProperty(Exception):
    """A `Tour` of a feature the property does not draw."""


class Tour:
    """Stands in for Hypothesis' ``data`` in a feature tour: the property's case strategy draws
    one case of the feature ``feature`` (`sdpa_cases` and `variant_cases` know how, through
    ``attn_tour``), every other draw a value from a generator seeded by the tour, so each tour is
    the same on every run. A check of a plain function tours every feature of every property
    (``ATTNSPEC_TOUR=1``, set by ``attnspec check``), so no feature its convention can express is
    left to the luck of a few drawn examples."""

    def __init__(self, feature: str, seed: int, base: str | None = None) -> None:
        self.kind = f"tour_{feature}"
        self.feature = feature
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.armed: tuple[str, ...] | None = None  # the features the next feature draw chooses among
        self.chosen = False
        #: a fallback tour (`fallbacks`): the base feature its case is built on, and no optional
        #: output (weights, lse) asked for; None: the tour draws both
        self.base = base
        self.optional_outputs = base is None
        #: what the draws gave: weights asked for, a base drawn (besides the tour's feature)
        self.asked_weights = False
        self.drew_base = False

    def fallbacks(self) -> list[Tour]:
        """The tours to run, one after the other, while a backend refuses this one: the same feature
        on the bases of `FALLBACK_BASES` with no optional output, so a convention that takes only
        some bases (no mask, no bias, always causal) or returns no weights still meets the feature.
        Only what the first tour drew can differ: none when it drew neither a base nor weights."""
        if self.drew_base:
            return [Tour(self.feature, self.seed, base) for base in FALLBACK_BASES]
        return [Tour(self.feature, self.seed, FALLBACK_BASES[0])] if self.asked_weights else []

    def choosing(self, features: tuple[str, ...]) -> Tour:
        """Arm the next ``sampled_from(features)`` to give the tour's feature (the first such draw
        only; a property without the feature is skipped)."""
        if not self.chosen:
            if self.feature not in features:
                raise NotThisProperty(self.feature)
            self.armed = tuple(features)
        return self

    def draw(self, strategy, label: Any = None) -> Any:
        build = getattr(strategy, "attn_tour", None)
        if build is not None:
            return build(self)
        s = getattr(strategy, "wrapped_strategy", strategy)
        if label == "return_weights":  # drawn in every tour, so the draws after it are the same
            self.asked_weights = bool(_seeded(s, self.rng)) and self.optional_outputs
            return self.asked_weights
        if type(s).__name__ == "SampledFromStrategy":
            if self.armed is not None and tuple(s.elements) == self.armed:
                self.armed, self.chosen = None, True
                return self.feature
            if self.chosen and "plain" in s.elements:  # a base feature, under the tour's feature
                drawn = _seeded(s, self.rng)
                self.drew_base = True
                return drawn if self.base is None or self.base not in s.elements else self.base
        return _seeded(s, self.rng)

    __call__ = draw

    def __repr__(self) -> str:
        return f"Tour({self.feature!r})"


def _seeded(s, rng: np.random.Generator) -> Any:
    """A value of one of the plain strategies the properties draw, from ``rng``."""
    name = type(s).__name__
    if name == "BooleansStrategy":
        return bool(rng.integers(0, 2))
    if name == "SampledFromStrategy":
        return s.elements[int(rng.integers(0, len(s.elements)))]
    if name == "IntegersStrategy":
        lo = s.start if s.start is not None else 0
        hi = s.end if s.end is not None else lo + 100
        return (
            int(rng.integers(lo, min(hi, 2**63 - 2) + 1)) if hi - lo < 2**62 else int(rng.integers(0, 2**32))
        )
    if name == "ListStrategy":
        return [_seeded(s.element_strategy, rng) for _ in range(s.min_size)]
    if name == "PermutationStrategy":
        return [s.values[i] for i in rng.permutation(len(s.values))]
    return simplest(s)


#: every feature a tour visits: the sdpa cases', the variants' and the serving cases'
def tour_features() -> tuple[str, ...]:
    from attnspec.conformance.hypothesis_helpers import SDPA_FEATURES, VARIANT_CASE_FEATURES
    from attnspec.conformance.serving_cases import SERVING_FEATURES

    return tuple(dict.fromkeys((*SDPA_FEATURES, *VARIANT_CASE_FEATURES, *SERVING_FEATURES)))


def simplest(strategy) -> Any:
    """The simplest value of the few plain strategies the suite's properties draw."""
    s = getattr(strategy, "wrapped_strategy", strategy)
    name = type(s).__name__
    if name == "BooleansStrategy":
        return False
    if name == "SampledFromStrategy":
        return s.elements[0]
    if name == "JustStrategy":
        return s.value
    if name == "IntegersStrategy":
        return max(s.start, min(0, s.end)) if s.start is not None else 0
    if name == "ListStrategy":
        return [simplest(s.element_strategy) for _ in range(s.min_size)]
    if name == "PermutationStrategy":
        return list(s.values)
    if name == "BuildsStrategy":  # lists(..., max_size=0) is builds(list): a zero-length axis
        return s.target(*(simplest(a) for a in s.args), **{k: simplest(v) for k, v in s.kwargs.items()})
    raise TypeError(f"Corner.draw: no simplest value for {strategy!r} ({name}); add it to corners.simplest")


def with_corners(test=None, *, kinds: tuple[str, ...] = CORNERS):
    """Run the ``@given(data=st.data())`` property ``test`` (apply above ``@given``) on every
    corner case, then on its drawn examples, in every profile. ``kinds`` names the corners (the
    strategy's ``attn_corner`` builds each): `CORNERS` unless a property has fixed cases of its
    own (``@with_corners(kinds=...)``, the serving property's kernel-shaped cases).

    The corners run outside Hypothesis' own phases, through ``test.hypothesis.inner_test``: an
    explicit example that fails would end the test before any drawn case ran, and a backend would
    learn of one corner only. Every case is recorded; the first failure of the drawn examples is
    raised (Hypothesis' shrunk one), else the first corner's. After a drawn failure the judge's
    sweep (`attnspec.conformance.conftest.pytest_runtest_call`) runs the test again and judges the
    examples after it; the corners, already judged, are skipped then.

    A corner the backend refuses (the ``judge`` fixture never runs its body, or the body raises
    `Unsupported`) is followed by its mask-only twin; a backend that takes a bias runs no twin,
    so costs no extra compile.
    """
    if test is None:
        return functools.partial(with_corners, kinds=kinds)
    inner = test.hypothesis.inner_test

    @functools.wraps(test)
    def run(*args, **kwargs):
        failed = None
        judge = kwargs["judge"]
        state = getattr(judge, "state", None)
        sweep = state is not None and state.phase == "sweep"  # the judge skips what it has judged
        if state is not None and not sweep:
            state.phase = "corner"  # every corner is judged on its own, whatever failed before it
        for kind in kinds:
            refused, exc = _attempt(inner, args, kwargs, Corner(kind))
            failed = failed or exc
            twin = f"{kind}_mask_only"
            if refused and twin in MASK_ONLY:
                _, exc = _attempt(inner, args, kwargs, Corner(twin))
                failed = failed or exc
        if failed is not None and os.environ.get("ATTNSPEC_FAIL_FAST") == "1":
            raise failed  # the run asks only whether anything fails
        if os.environ.get("ATTNSPEC_TOUR") == "1":
            for i, feature in enumerate(tour_features()):
                try:
                    exc = run_tour(inner, args, kwargs, Tour(feature, 1009 * i + 17))
                except NotThisProperty:
                    continue
                failed = failed or exc
        if failed is not None and os.environ.get("ATTNSPEC_FAIL_FAST") == "1":
            raise failed
        if state is not None and not sweep:
            state.phase = "drawn"
        test(*args, **kwargs)
        if failed is not None:
            raise failed

    return run


def run_tour(inner, args, kwargs, tour: Tour) -> AssertionError | None:
    """Run the property body ``inner`` on ``tour``, then on its `Tour.fallbacks` while the backend
    refuses each; the first failure raised, if any (`NotThisProperty` goes on to the caller)."""
    refused, failed = _attempt(inner, args, kwargs, tour)
    for fallback in tour.fallbacks() if refused else ():
        refused, exc = _attempt(inner, args, kwargs, fallback)
        failed = failed or exc
        if not refused:
            break
    return failed


def _attempt(inner, args, kwargs, data) -> tuple[bool, AssertionError | None]:
    """Run the property body ``inner`` on one fixed example ``data`` (a `Corner` or a `Tour`):
    whether the backend refused it (the judge never ran its body, or the body raised
    `Unsupported`), and the failure it raised, if any."""
    refused = [True]
    try:
        inner(
            *args,
            data=data,
            **{**kwargs, "judge": kwargs["judge"].through(functools.partial(_watched, refused))},
        )
    except AssertionError as exc:
        return refused[0], exc
    return refused[0], None


def _watched(refused: list[bool], judge, function, prop, case, body, *rest, **kw):
    """``judge``, noting in ``refused[0]`` whether the backend declined the case."""
    from attnspec.backends import Unsupported

    def ran():
        refused[0] = False
        try:
            return body()
        except Unsupported:
            refused[0] = True
            raise

    return judge(function, prop, case, ran, *rest, **kw)
