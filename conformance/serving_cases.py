"""Serving-shaped sdpa cases: decode, chunked prefill, empty caches, and the shapes kernels ship.

The base strategy (`attnspec.conformance.hypothesis_helpers.sdpa_cases`) draws tiny shapes from
small menus, one feature at a time. The bugs serving kernels ship sit elsewhere: one query (or a
few, speculative decoding) over a long cache, batches whose sequences have different lengths,
a sequence whose cache is empty (FlashInfer PR 363: decode with an empty KV cache disagreed with
prefill), chunked prefill (a chunk of queries at the end of a longer context), sliding windows
with sinks (gpt-oss), and the head dims and tile-edge lengths kernels special-case (64, 96, 128,
256, DeepSeek MLA's dk = 576, dv = 512 with one kv head; 63/64/65, 127/128/129, 255/256/257;
llama.cpp #7903 broke only at batch sizes 3 to 8). These cases draw exactly those, as plain sdpa
calls judged by the golden, so every backend and every convention runs them.

They are a strategy of their own, not more entries of ``SDPA_FEATURES``: appending there would
change every derandomized draw and every vectors bundle id made before.

Every case in a batch with lengths anchors causal on each sequence's own lengths
(``causal="lower_right_lengths"``, the rule of FlashAttention's ``cache_seqlens``, vLLM and
FlashInfer: the last query of a sequence sees up to its last key), and at times the keys past a
sequence's length hold NaN, as the unused slots of a real cache may: a kernel that reads past
``kv_lengths`` leaks it.

The kernel-shaped feature is drawn under the ``default`` and larger profiles; every profile runs
its fixed cases (`KERNEL_CASES`, the property's corners): a ``dev`` run stays within minutes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

#: the features of `serving_cases`, each a kind of call serving kernels make
SERVING_FEATURES = (
    "decode",
    "decode_gqa",
    "chunked_prefill",
    "empty_cache",
    "decode_window_sinks",
    "kernel_shapes",
)
#: cache lengths a decode case draws: tile edges past a power of two, and the largest is capped by
#: ``ATTNSPEC_MAX_KV`` (the cost is n * m per head, small for n <= 4)
MAX_KV = int(os.environ.get("ATTNSPEC_MAX_KV", "257"))
KV_SIDES = tuple(s for s in (1, 17, 64, 129, 257) if s <= MAX_KV)
#: the head dims kernels special-case, and MLA's absorbed form (dk, dv) = (576, 512), one kv head
KERNEL_DIMS: tuple[tuple[int, int], ...] = ((64, 64), (96, 96), (128, 128), (256, 256), (576, 512))
#: lengths at the tile edges kernels use (64, 128, 256)
TILE_EDGES = (63, 64, 65, 127, 128, 129, 255, 256, 257)
#: a drawn kernel-shaped case costs at most this many multiply-adds (2 * B * Hq * n * m * (dk + dv))
#: in the golden: ~0.3 GFLOP is about 30 ms of float64 BLAS here
KERNEL_MAX_FLOP = float(os.environ.get("ATTNSPEC_KERNEL_MAX_FLOP", "3e8"))

#: the fixed kernel-shaped cases every profile runs (name -> shape and options), each <= 7e7 FLOP
KERNEL_CASES: dict[str, dict[str, Any]] = {
    "kernel_d64_gqa_65": dict(b=3, hq=8, hkv=2, n=65, m=65, dk=64, dv=64, causal="lower_right"),
    "kernel_d96_127x129": dict(b=1, hq=2, hkv=2, n=127, m=129, dk=96, dv=96, causal=None),
    "kernel_d128_decode_g16": dict(b=8, hq=16, hkv=1, n=1, m=257, dk=128, dv=128, lengths="kv"),
    "kernel_d256_64x256": dict(b=2, hq=2, hkv=1, n=64, m=256, dk=256, dv=256, causal="lower_right"),
    "kernel_mla_576_512": dict(b=4, hq=16, hkv=1, n=2, m=129, dk=576, dv=512, lengths="kv"),
    "kernel_d128_batch5_63": dict(b=5, hq=4, hkv=4, n=63, m=63, dk=128, dv=128, lengths="q_kv"),
}


def serving_cases(dtype: str, features: tuple[str, ...] | None = None):
    """One serving-shaped sdpa call in ``dtype``. Without ``features``: every feature but
    ``kernel_shapes`` under the ``dev`` profile (which runs the fixed `KERNEL_CASES` instead),
    every feature otherwise. A `Corner` whose kind names a `KERNEL_CASES` entry draws it; a
    `Tour` draws one case of its feature (``kernel_shapes`` included)."""
    if features is None:
        dev = settings.get_current_profile_name() == "dev"
        features = tuple(f for f in SERVING_FEATURES if not (dev and f == "kernel_shapes"))
    strategy: Any = _serving_cases(dtype, features)  # a SearchStrategy carrying the corner/tour hooks
    strategy.attn_corner = lambda corner: kernel_case(corner.kind, dtype)  # see corners.py
    strategy.attn_tour = lambda tour: _serving_case(tour.choosing(SERVING_FEATURES), dtype, SERVING_FEATURES)
    return strategy


def _mixed_lengths(rng: np.random.Generator, b: int, low: int, high: int) -> np.ndarray:
    """(b,) lengths in [low, high], mixed: the first element at ``high`` when b > 1 (a batch's
    longest sequence fills the cache), the others drawn."""
    lengths = rng.integers(low, high + 1, size=b)
    if b > 1:
        lengths[0] = high
    return lengths.astype(np.int64)


def _serving_case(draw, dtype: str, features: tuple[str, ...]) -> SDPACase:
    feature = draw(st.sampled_from(features))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    spec: dict[str, Any] = {}
    if feature == "decode":
        spec = dict(
            b=draw(st.sampled_from([1, 2, 4])),
            hkv=draw(st.sampled_from([1, 2])),
            n=1,
            m=draw(st.sampled_from(KV_SIDES)),
            dk=draw(st.sampled_from([16, 64])),
        )
        spec["hq"] = spec["hkv"] * draw(st.sampled_from([1, 2]))
        # n = 1: causal on the lengths sees the same keys as no causal at all; both are drawn
        spec["lengths"] = draw(st.sampled_from(["kv", None]))
        spec["causal"] = draw(
            st.sampled_from(["lower_right_lengths" if spec["lengths"] else "lower_right", None])
        )
    elif feature == "decode_gqa":  # one to four queries (speculative decoding), many query heads per kv head
        hkv = draw(st.sampled_from([1, 2]))
        spec = dict(
            b=draw(st.sampled_from([1, 3])),
            hkv=hkv,
            hq=hkv * draw(st.sampled_from([4, 8, 16])),
            n=draw(st.sampled_from([1, 2, 4])),
            m=draw(st.sampled_from(KV_SIDES)),
            dk=16,
            lengths="kv",
            causal="lower_right_lengths",
        )
    elif feature == "chunked_prefill":  # a chunk of queries after each sequence's earlier context
        n = draw(st.sampled_from([3, 5, 13, 24]))
        spec = dict(
            b=draw(st.sampled_from([2, 3])),
            hkv=draw(st.sampled_from([1, 2])),
            n=n,
            m=n + draw(st.sampled_from([0, 7, 40])),
            dk=draw(st.sampled_from([8, 16])),
            lengths="chunk",
            causal="lower_right_lengths",
        )
        spec["hq"] = spec["hkv"] * draw(st.sampled_from([1, 2]))
    elif feature == "empty_cache":  # decode where some (at times every) sequence has no key yet
        spec = dict(
            b=draw(st.sampled_from([2, 3, 4])),
            hkv=1,
            hq=draw(st.sampled_from([1, 4])),
            n=draw(st.sampled_from([1, 2])),
            m=draw(st.sampled_from(KV_SIDES[:3])),
            dk=16,
            lengths="empty",
            causal=draw(st.sampled_from(["lower_right_lengths", None])),
        )
    elif feature == "decode_window_sinks":  # gpt-oss: a sliding window on the lengths, with sinks
        spec = dict(
            b=draw(st.sampled_from([1, 3])),
            hkv=2,
            hq=draw(st.sampled_from([2, 4])),
            n=draw(st.sampled_from([1, 4])),
            m=draw(st.sampled_from(KV_SIDES)),
            dk=16,
            lengths="kv",
            causal="lower_right_lengths",
            window=(draw(st.sampled_from([0, 1, 3, 7, 31])), 0),
            sinks=draw(st.booleans()),
        )
    elif feature == "kernel_shapes":
        spec = _kernel_draw(draw)
    else:
        raise ValueError(f"serving_cases: feature={feature!r}, expected one of {SERVING_FEATURES}")
    spec.setdefault("dv", spec["dk"])
    spec["poison"] = spec.get("lengths") is not None and draw(st.booleans())
    return _build(feature, dtype, spec, rng, seed)


def _kernel_draw(draw) -> dict[str, Any]:
    """A kernel-shaped call: a head dim kernels special-case, tile-edge lengths, a batch of one to
    eight with mixed lengths, GQA ratios up to 16; shrunk (batch first, then heads) to at most
    `KERNEL_MAX_FLOP`."""
    dk, dv = draw(st.sampled_from(KERNEL_DIMS))
    hkv, group = (
        (1, 16) if dk == 576 else (draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 4, 8, 16])))
    )
    n = draw(st.sampled_from((1, 2, *TILE_EDGES)))
    m = draw(st.sampled_from(TILE_EDGES))
    spec = dict(
        b=draw(st.integers(1, 8)),
        hkv=hkv,
        hq=hkv * group,
        n=n,
        m=m,
        dk=dk,
        dv=dv,
        lengths=draw(st.sampled_from([None, "kv", "q_kv"])),
    )
    spec["causal"] = draw(
        st.sampled_from(
            ["lower_right_lengths", None] if spec["lengths"] else ["lower_right", "upper_left", None]
        )
    )
    while _flop(spec) > KERNEL_MAX_FLOP and spec["b"] > 1:
        spec["b"] -= 1
    while _flop(spec) > KERNEL_MAX_FLOP and spec["hkv"] > 1:
        spec["hkv"] -= 1
        spec["hq"] = spec["hkv"] * group
    while _flop(spec) > KERNEL_MAX_FLOP and spec["hq"] > spec["hkv"]:
        spec["hq"] //= 2
    return spec


def _flop(spec: dict[str, Any]) -> float:
    return 2.0 * spec["b"] * spec["hq"] * spec["n"] * spec["m"] * (spec["dk"] + spec["dv"])


def kernel_case(kind: str, dtype: str) -> SDPACase:
    """The fixed kernel-shaped case ``kind`` (a key of `KERNEL_CASES`) in ``dtype``."""
    if kind not in KERNEL_CASES:
        raise ValueError(f"kernel_case: kind={kind!r}, expected one of {tuple(KERNEL_CASES)}")
    seed = 27_000 + list(KERNEL_CASES).index(kind)
    spec = {**KERNEL_CASES[kind], "poison": True}
    spec.setdefault("causal", "lower_right_lengths" if spec.get("lengths") else None)
    return _build("kernel_shapes", dtype, spec, np.random.default_rng(seed), seed, kind=kind)


def _build(
    feature: str,
    dtype: str,
    spec: dict[str, Any],
    rng: np.random.Generator,
    seed: int,
    kind: str | None = None,
) -> SDPACase:
    """The case ``spec`` describes: (B, Hq, n, dk) queries over (B, Hkv, m, dk|dv) keys and values,
    standard normal, with its lengths, causal rule, window and sinks."""
    b, hq, hkv, n, m, dk, dv = (spec[x] for x in ("b", "hq", "hkv", "n", "m", "dk", "dv"))
    q = rng.standard_normal((b, hq, n, dk))
    k = rng.standard_normal((b, hkv, m, dk))
    v = rng.standard_normal((b, hkv, m, dv))
    options: dict[str, Any] = {}
    lengths = spec.get("lengths")
    if lengths in ("kv", "q_kv"):
        options["kv_lengths"] = _mixed_lengths(rng, b, min(1, m), m)
    if lengths == "q_kv":
        options["q_lengths"] = np.minimum(_mixed_lengths(rng, b, min(1, n), n), options["kv_lengths"])
    if lengths == "chunk":  # each sequence: q_len new queries at the end of its context
        q_len = _mixed_lengths(rng, b, 1, n)
        context = rng.integers(0, m - n + 1, size=b)
        options["q_lengths"], options["kv_lengths"] = q_len, (context + q_len).astype(np.int64)
    if lengths == "empty":
        kv = _mixed_lengths(rng, b, 0, m)
        kv[rng.integers(0, b)] = 0  # at least one empty cache
        if rng.random() < 0.25:
            kv[:] = 0  # every cache empty
        options["kv_lengths"] = kv
    if spec.get("causal"):
        options["causal"] = spec["causal"]
    if spec.get("window") is not None:
        options["window"] = tuple(spec["window"])
    if spec.get("sinks"):
        options["sinks"] = rng.standard_normal(hq) * 2
    if spec.get("poison") and "kv_lengths" in options:
        # the cache slots past each sequence's length hold NaN, as a real cache's unused slots may
        past = np.arange(m)[None, :] >= options["kv_lengths"][:, None]  # (B, m)
        k[np.broadcast_to(past[:, None, :], k.shape[:-1])] = np.nan
        v[np.broadcast_to(past[:, None, :], v.shape[:-1])] = np.nan
    npdt = NP_DTYPES[dtype]
    q, k, v = q.astype(npdt), k.astype(npdt), v.astype(npdt)
    if "sinks" in options:
        options["sinks"] = options["sinks"].astype(npdt)
    tags = {feature, dtype, "serving"} | ({kind} if kind else set())
    if n <= 4 and m >= 4 * max(n, 1):
        tags.add("decode")
    if "kv_lengths" in options and not options["kv_lengths"].all():
        tags.add("empty_kv")
    if dk != dv:
        tags.add("dk_ne_dv")
    if hq != hkv:
        tags.add("gqa")
    if n != m:
        tags.add("n_ne_m")
    tag_visibility(tags, q, k, v, options)
    return SDPACase(feature, dtype, q, k, v, options, frozenset(tags), seed)


_serving_cases = st.composite(_serving_case)
