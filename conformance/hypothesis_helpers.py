"""Hypothesis strategies for the conformance suite.

A drawn `SDPACase` holds NumPy inputs already rounded to the case dtype, the keyword options, the
feature it exercises and its tags (what the case contains: a row with no visible key, poisoned
masked keys...). Sizes come from small fixed menus so that compiling backends (JAX) reuse their
compiled functions across examples; the largest side is capped by ``ATTNSPEC_MAX_SIDE``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from attnspec.conformance.corners import corner_case, floor_levels, floor_rows
from attnspec.spec.options import VARIANT_FEATURES

MAX_SIDE = int(os.environ.get("ATTNSPEC_MAX_SIDE", "24"))
SIDES = tuple(s for s in (1, 2, 3, 5, 8, 13, 16, 24, 32, 64) if s <= MAX_SIDE)
DIMS = (1, 4, 8, 16)
NP_DTYPES = {
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float32": np.float32,
    "float64": np.float64,
}

# feature -> what the case exercises. Every case is one feature; "combined" mixes several.
SDPA_FEATURES = (
    "plain",
    "scale",
    "rank2",
    "batch_broadcast",
    "gqa",
    "mqa",
    "dk_ne_dv",
    "mask",
    "bias",
    "bias_neg_inf",
    "causal_upper_left",
    "causal_lower_right",
    "window",
    "window_lower_right",
    "kv_lengths",
    "q_lengths",
    "no_visible_rows",
    "masked_nonfinite",
    "empty",
    "large_logits",
    "ties_and_zeros",
    "combined",
)


_Case = TypeVar("_Case", bound="DrawnCase")


class DrawnCase:
    """What every drawn case (a dataclass with feature, dtype, options) shares: the shapes of the
    arrays it names (`ARRAYS`: (the name in messages, the attribute)), a one-line description
    for messages and reproducers, and a copy with more options."""

    ARRAYS: ClassVar[tuple[tuple[str, str], ...]]
    feature: str
    dtype: str
    options: dict[str, Any]

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: getattr(self, attr).shape for name, attr in self.ARRAYS}

    def describe(self) -> str:
        shapes = " ".join(f"{name}{shape}" for name, shape in self.shapes.items())
        return f"feature={self.feature} dtype={self.dtype} {shapes} {options_text(self.options)}".rstrip()

    def with_options(self: _Case, **options: Any) -> _Case:
        return replace(self, options={**self.options, **options})  # type: ignore[type-var]


@dataclass
class SDPACase(DrawnCase):
    ARRAYS = (("q", "q"), ("k", "k"), ("v", "v"))
    feature: str
    dtype: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    options: dict[str, Any] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    seed: int = 0


def brief(v: Any) -> str:
    """A keyword's value for a case's description: an array as its dtype and shape."""
    if isinstance(v, np.ndarray):
        return f"<{v.dtype.name}{list(v.shape)}>"
    return repr(v)


def array_source(x: np.ndarray, dtype: str) -> str:
    """Python that rebuilds ``x`` exactly, for a reproducer: booleans and integers as lists, floats
    through their float64 values (exact for every dtype the suite draws), cast to ``dtype`` (the
    expression naming the dtype, ``np.float32`` or ``ml_dtypes.bfloat16``). An empty array keeps
    its shape (a list literal of it would not: ``np.array([])`` is (0,))."""
    if x.size == 0:
        name = "bool" if x.dtype == bool else "np.int64" if x.dtype.kind in "iu" else dtype
        return f"np.zeros({tuple(x.shape)}, dtype={name})"
    if x.dtype == bool:
        return f"np.array({x.astype(int).tolist()}, dtype=bool)"
    if x.dtype.kind in "iu":
        return f"np.array({x.tolist()}, dtype=np.int64)"
    vals = (
        np.array2string(
            x.astype(np.float64), separator=", ", threshold=10**9, floatmode="unique", max_line_width=10**9
        )
        .replace("nan", "np.nan")
        .replace("inf", "np.inf")
    )
    return f"np.array({vals}, dtype={dtype})"


def options_text(options: dict[str, Any]) -> str:
    """A case's keywords, sorted, for its description: ``causal='upper_left', mask=<bool[2, 3]>``."""
    return ", ".join(f"{k}={brief(v)}" for k, v in sorted(options.items()))


def draw_mask(draw, rng, feature: str, n: int, full: tuple[int, ...], shapes: list) -> np.ndarray:
    """A boolean mask of one of ``shapes``, about 30%, 70% or 95% visible; for ``no_visible_rows``,
    widened to ``full`` with one query row hidden throughout."""
    mshape = draw(st.sampled_from(shapes))
    mask = rng.random(mshape) < draw(st.sampled_from([0.3, 0.7, 0.95]))
    if feature == "no_visible_rows" and n > 0:
        mask = np.broadcast_to(mask, full).copy()
        mask[..., rng.integers(0, n), :] = False
    return mask


def sdpa_cases(dtype: str, features: tuple[str, ...] = SDPA_FEATURES):
    """One sdpa call exercising a drawn feature, in ``dtype``; a `Corner` draws a corner case."""
    strategy = _sdpa_cases(dtype, features)
    strategy.attn_corner = lambda corner: corner_case(corner.kind, dtype)  # see corners.py
    strategy.attn_tour = lambda tour: _sdpa_case(tour.choosing(features), dtype, features)  # corners.Tour
    return strategy


def _sdpa_case(draw, dtype: str, features: tuple[str, ...]) -> SDPACase:
    feature = draw(st.sampled_from(features))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    tags = {feature, dtype}

    batch = draw(st.sampled_from([(), (2,), (1, 3)]))
    hkv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 3] if feature == "combined" else [1]))
    if feature == "gqa":  # several kv heads, each shared by G > 1 query heads: h // G and h % Hkv differ
        hkv, group = draw(st.sampled_from([2, 3])), draw(st.sampled_from([2, 3]))
    if feature == "mqa":
        hkv, group = 1, draw(st.sampled_from([2, 4]))
    hq = hkv * group
    n, m = draw(st.sampled_from(SIDES)), draw(st.sampled_from(SIDES))
    if feature == "empty":  # no queries, no keys, or none of either; no batch elements or no query heads
        zero = draw(st.sampled_from(["n", "m", "nm", "batch", "heads"]))
        n, m = 0 if "n" in zero else n, 0 if "m" in zero else m
        if zero == "batch":  # a serving step with no request left: often decode-shaped (n = 1)
            batch = (0, *batch[1:])
            n = draw(st.sampled_from([1, n]))
        if zero == "heads":  # Hq = 0 reads no kv head (Hkv >= 1 stays: Hq is a multiple of it)
            hq = 0
        tags.add({"batch": "zero_batch", "heads": "zero_heads"}.get(zero, "zero_length"))
    dk = draw(st.sampled_from(DIMS))
    dv = (
        draw(st.sampled_from([d for d in DIMS if d != dk] or [dk]))
        if feature == "dk_ne_dv"
        else (draw(st.sampled_from(DIMS)) if feature == "combined" else dk)
    )
    if dk != dv:
        tags.add("dk_ne_dv")
    if group > 1:
        tags.add("gqa")
    if n != m:
        tags.add("n_ne_m")
    if n > m:
        tags.add("n_gt_m")

    q_batch = batch
    k_batch = v_batch = batch
    if feature == "batch_broadcast" and batch:
        # some of q, k and v have size-1 batch axes that broadcast against the others', so that
        # each of them carries the batch alone in some case: each one's batch is its own (a bug taking the batch
        # from q and k only passed every property until mutation testing, reports/mutation.md)
        ones = (1,) * len(batch)
        small = draw(st.sampled_from(["kv", "k", "v", "q", "qk", "qv"]))
        q_batch = ones if "q" in small else batch
        k_batch = ones if "k" in small else batch
        v_batch = ones if "v" in small else batch
    rank2 = feature == "rank2"
    lifted = ""  # rank2: q with a head axis of 1 after all, beside rank-2 k and v (mixed ranks)
    if rank2:
        q_batch = k_batch = v_batch = batch = ()
        hkv = hq = 1
        # q rank 2 beside k, v of rank 3 is not drawn: the spec's output is rank 2 (q's rank says
        # whether there is a head axis), PyTorch's SDPA returns (1, n, dv), as matmul broadcasts;
        # that disagreement wants a decision of its own (spec/README.md) before the suite asks it
        lifted = draw(st.sampled_from(["", "", "q"]))
        if lifted:
            tags.add("mixed_ranks")

    def shape(b, h, length, d, which=""):
        return (length, d) if rank2 and which != lifted else (*b, h, length, d)

    magnitude = 1.0
    if feature == "large_logits":
        magnitude = float(draw(st.sampled_from([8.0, 16.0])))  # logits up to ~magnitude^2 * sqrt(dk)
    q = rng.standard_normal(shape(q_batch, hq, n, dk, "q")) * magnitude
    k = rng.standard_normal(shape(k_batch, hkv, m, dk, "kv")) * magnitude
    v = rng.standard_normal(shape(v_batch, hkv, m, dv, "kv"))
    if feature == "ties_and_zeros" and m > 1:
        k[..., 1::2, :] = k[..., :1, :]  # exact ties among logits
        q[..., ::2, :] = 0.0  # zero queries: uniform weights
        v[..., -1, :] = 0.0
    if feature == "large_logits":
        tags.add("large_logits")

    options: dict[str, Any] = {}
    full = (*batch, hq, n, m) if not rank2 else (n, m)
    if feature in ("mask", "combined", "no_visible_rows"):
        shapes = [(n, m), full, (*batch, 1, n, m) if not rank2 else (1, m)]
        options["mask"] = draw_mask(draw, rng, feature, n, full, shapes)
    if feature == "scale":
        options["scale"] = float(draw(st.sampled_from([0.05, 0.5, 2.0])))
    if feature in ("bias", "bias_neg_inf", "combined"):
        bshape = draw(st.sampled_from([(n, m), full]))
        bias = rng.standard_normal(bshape) * 2
        if feature != "bias":
            bias = np.where(rng.random(bshape) < 0.3, -np.inf, bias)
            tags.add("bias_neg_inf")
        if feature == "bias_neg_inf" and n and rng.random() < 0.5:
            rows = np.flatnonzero(rng.random(n) < 0.5)
            # rows of zero queries whose visible logits sit at large negative finite biases
            floor_rows(q, bias, rows, rng.choice(floor_levels(dtype), size=len(rows)))
            tags.add("finite_floor")
        options["bias"] = bias
    if feature in ("causal_upper_left", "window", "combined"):
        options["causal"] = draw(
            st.sampled_from(["upper_left", None] if feature == "window" else ["upper_left"])
        )
    if feature in ("causal_lower_right", "window_lower_right"):
        options["causal"] = "lower_right"
    if feature == "combined" and draw(st.booleans()):
        options["causal"] = "lower_right"
    if feature in ("window", "window_lower_right", "combined"):
        options["window"] = (draw(st.integers(0, 4)), draw(st.integers(0, 4)))
    if feature in ("kv_lengths", "no_visible_rows", "masked_nonfinite", "combined") and not rank2:
        options["kv_lengths"] = rng.integers(
            0 if feature == "no_visible_rows" else min(1, m), m + 1, size=batch
        )
    if feature in ("q_lengths", "combined") and not rank2:
        options["q_lengths"] = rng.integers(0, n + 1, size=batch)
    if feature == "masked_nonfinite":
        if rank2 or m == 0:
            options["mask"] = np.ones((n, m), bool)
        else:
            # poison keys beyond every batch element's length, and keys the causal rule hides
            poison = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            lengths = options["kv_lengths"]
            j = np.arange(m)
            hidden = j >= (lengths[..., None] if lengths.ndim else lengths)  # (*batch, m)
            if k.ndim - 3 == hidden.ndim - 1:
                hidden_kv = np.broadcast_to(hidden[..., None, :, None], k.shape[:-1] + (1,))
                k = np.where(hidden_kv, poison, k)
                v = np.where(np.broadcast_to(hidden[..., None, :, None], v.shape[:-1] + (1,)), poison, v)
            if draw(st.booleans()):
                options["causal"] = "upper_left"
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    if "bias" in options:
        options["bias"] = options["bias"].astype(npdt)
    tag_visibility(tags, q, k, v, options)
    return SDPACase(feature, dtype, q, k, v, options, frozenset(tags), seed)


_sdpa_cases = st.composite(_sdpa_case)


def case_plan(q, k, v, options: dict[str, Any]):
    """(plan, extras) of a call with these options: the spec's validated plan and the variants'
    arrays (`SDPAExtras`)."""
    from attnspec.backends.compare import sdpa_plan  # the judge's own: one reading of the options

    return sdpa_plan(q, k, v, options)


def tag_visibility(tags: set[str], q, k, v, options) -> None:
    """Add the tags that depend on the final visibility: empty rows, poisoned absent keys."""
    plan, _ = case_plan(q, k, v, options)
    vis = full_visibility(plan, options)
    if plan.n and plan.hq and (plan.m == 0 or not vis.any(axis=-1).all()):
        tags.add("no_visible_row")
    nonfinite = ~np.isfinite(k.astype(np.float64)).all(axis=-1) | ~np.isfinite(v.astype(np.float64)).all(
        axis=-1
    )
    if nonfinite.any():
        tags.add("masked_nonfinite")
    if options.get("causal"):
        tags.add(f"causal_{options['causal']}")
    if _mask_batch_beyond_qk(q, k, options, plan):
        tags.add("mask_batch_beyond_qk")
    for name in ("mask", "bias", "window", "kv_lengths", "q_lengths", "scale"):
        if name in options:
            tags.add(name)
    from attnspec.backends.base import variant_features

    tags.update(variant_features(options))


def _mask_batch_beyond_qk(q, k, options, plan) -> bool:
    """Whether a mask, bias or lengths (a visibility with batch axes) carries batch axes that q and
    k lack, as when v alone carries the batch (PyTorch's SDPA adds the mask into q @ k^T in place:
    the torch.mask-batch-beyond-qk deviation)."""
    qk = tuple(np.broadcast_shapes(q.shape[:-3], k.shape[:-3]))
    carried = [
        tuple(np.shape(options[name]))[:-3] for name in ("mask", "bias") if options.get(name) is not None
    ]
    if options.get("q_lengths") is not None or options.get("kv_lengths") is not None:
        carried.append(tuple(plan.batch))
    return any(tuple(np.broadcast_shapes(qk, c)) != qk for c in carried)


def full_visibility(plan, options) -> np.ndarray:
    """The case's visibility (the spec's `visible`) as a new array of shape (*batch, Hq, n, m)."""
    from attnspec.spec.masks import visible
    from attnspec.spec.validate import SDPAExtras

    ids = SDPAExtras(q_segment_ids=options.get("q_segment_ids"), kv_segment_ids=options.get("kv_segment_ids"))
    vis = visible(plan, options.get("mask"), options.get("bias"), ids)
    full = np.ones(plan.full_weights_shape, bool)
    if vis is not None:
        full &= vis
    return full


# -- the attention variants of issue #15 --------------------------------------------------------

#: the variant cases: one per variant (`attnspec.spec.options.VARIANT_FEATURES`), and all together
VARIANT_CASE_FEATURES = (*VARIANT_FEATURES, "variants_combined")
#: the sdpa features a variant case is drawn on top of (rank-2 and empty cases are the base
#: suite's business)
_VARIANT_BASES = (
    "plain",
    "gqa",
    "mask",
    "bias",
    "kv_lengths",
    "q_lengths",
    "causal_lower_right",
    "window_lower_right",
    "large_logits",
    "combined",
)


def segment_ids(
    rng: np.random.Generator, shape: tuple[int, ...], segments: int, padded: bool = False
) -> np.ndarray:
    """Sorted ids in [0, segments) along the last axis, with a tail of -1 (padding) at times;
    ``padded``: always, at least one position (a feature tour pads queries and keys both). Now and
    then (not on a tour) the positions are shuffled: a segment need not be contiguous, and a packed
    varlen kernel must refuse such ids rather than pack them as if they were (mutation testing
    found that refusal untested)."""
    ids = np.sort(rng.integers(0, segments, size=shape), axis=-1)
    if shape[-1] and (padded or rng.random() < 0.5):
        pad = int(rng.integers(0, shape[-1] // 2 + 1))
        if padded:
            pad = max(pad, 1)
        ids[..., shape[-1] - pad :] = -1
    if not padded and shape[-1] > 2 and rng.random() < 0.25:
        ids = rng.permuted(ids, axis=-1)
    return ids.astype(np.int64)


def variant_cases(
    dtype: str, features: tuple[str, ...] = VARIANT_CASE_FEATURES, bases: tuple[str, ...] = _VARIANT_BASES
):
    """One sdpa call with a drawn variant (or all of them) on top of a drawn base case; a `Corner`
    puts the first of ``features`` on the corner case."""
    strategy = _variant_cases(dtype, features, bases)
    strategy.attn_corner = lambda corner: _variant_case(corner, dtype, features, bases)
    strategy.attn_tour = lambda tour: _variant_case(tour.choosing(features), dtype, features, bases)
    return strategy


def _variant_case(draw, dtype: str, features: tuple[str, ...], bases: tuple[str, ...]) -> SDPACase:
    feature = draw(st.sampled_from(features))
    base = draw(sdpa_cases(dtype, bases))
    rng = np.random.default_rng(base.seed ^ 0x15)
    q, k, v = base.q, base.k, base.v
    batch = tuple(np.broadcast_shapes(q.shape[:-3], k.shape[:-3]))
    hq, n, m = q.shape[-3], q.shape[-2], k.shape[-2]
    options = {key: val for key, val in base.options.items()}
    every = feature == "variants_combined"
    if feature == "alibi_lower_right_lengths":  # ALiBi anchored on each sequence's lengths
        feature = "alibi"
        options["causal"] = "lower_right_lengths"
        options["kv_lengths"] = rng.integers(0, m + 1, size=batch)
    if feature == "softcap" or every:
        options["softcap"] = float(draw(st.sampled_from([0.5, 2.0, 5.0, 30.0])))
    if feature == "alibi" or every:
        shape = draw(st.sampled_from([(hq,), (*batch, hq)]))
        options["alibi_slopes"] = (2.0 ** -rng.uniform(0, 8, size=shape)).astype(np.float32)
    if feature == "sinks" or every:
        options["sinks"] = (rng.standard_normal(hq) * 2).astype(NP_DTYPES[dtype])
    # a fallback tour (corners.Tour.fallbacks) draws the same boolean and asks for no lse
    if feature == "lse" or every or (draw(st.booleans()) and getattr(draw, "optional_outputs", True)):
        options["return_lse"] = True
    draw_packing_and_dropout(draw, rng, feature, every, options, batch, hq, n, m)
    tags = {t for t in base.tags if t not in SDPA_FEATURES or t == base.feature} | {feature, "variants"}
    tag_visibility(tags, q, k, v, options)
    return SDPACase(feature, dtype, q, k, v, options, frozenset(tags), base.seed)


_variant_cases = st.composite(_variant_case)


def draw_packing_and_dropout(
    draw, rng, feature: str, every: bool, options: dict, batch: tuple, heads: int, n: int, m: int
) -> None:
    """In place: a variant case's segment ids, lengths-aligned causal and dropout options (the
    sdpa and the mha variant strategies share them; the order of the draws is part of the cases)."""
    if feature == "segments" or every or (feature == "causal_lower_right_lengths" and draw(st.booleans())):
        segments = draw(st.sampled_from([1, 2, 3]))
        # the segments tour pads both sides, which few drawn cases do: padding queries must see no
        # padding key (mutation testing found flash_varlen's packing could pair them unseen; the
        # tour reaches flash_varlen through its weight-free fallback, corners.Tour.fallbacks)
        padded = getattr(draw, "kind", None) == "tour_segments"
        options["q_segment_ids"] = segment_ids(rng, (*batch, n), segments, padded)
        options["kv_segment_ids"] = segment_ids(rng, (*batch, m), segments, padded)
        if not padded and rng.random() < 0.2:  # every position padding: nothing at all to pack
            options["q_segment_ids"][...] = -1
            options["kv_segment_ids"][...] = -1
    if feature == "causal_lower_right_lengths" or (every and draw(st.booleans())):
        options["causal"] = "lower_right_lengths"
        options["kv_lengths"] = rng.integers(0, m + 1, size=batch)
        if draw(st.booleans()):
            options["q_lengths"] = rng.integers(0, n + 1, size=batch)
        if draw(st.booleans()):
            options["window"] = (draw(st.integers(0, 4)), draw(st.integers(0, 4)))
    if feature == "dropout" or every:
        p = float(draw(st.sampled_from([0.1, 0.5, 0.9])))
        options["dropout_p"] = p
        options["dropout_mask"] = rng.random(draw(st.sampled_from([(*batch, heads, n, m), (n, m)]))) >= p
