"""Hypothesis strategies for the spec's own tests: GQA calls of every shape, zero sizes included,
with a random mask, causal alignment and window. (The conformance suite draws its cases in
`attnspec.conformance.hypothesis_helpers`; these are the spec tests' smaller, simpler ones.)"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


def gqa_strategies(
    *,
    batch_dims: int = 2,
    group: int = 3,
    n: tuple[int, int] = (0, 5),
    m: tuple[int, int] = (0, 5),
    dk: int = 4,
    dv: tuple[int, int] = (0, 3),
    window: int = 3,
) -> dict[str, st.SearchStrategy]:
    """``@given(**gqa_strategies(...))`` keywords: batch, hkv, group, n, m, dk, dv, causal, window, seed."""
    return {
        "batch": st.lists(st.integers(1, 2), max_size=batch_dims).map(tuple),
        "hkv": st.integers(1, 2),
        "group": st.integers(1, group),
        "n": st.integers(*n),
        "m": st.integers(*m),
        "dk": st.integers(1, dk),
        "dv": st.integers(*dv),
        "causal": st.sampled_from([None, "upper_left", "lower_right"]),
        "window": st.none() | st.tuples(st.integers(0, window), st.integers(0, window)),
        "seed": st.integers(0, 2**16),
    }


def every_option(rng, n: int, m: int, window: tuple[int, int], q_lengths, kv_lengths) -> dict:
    """Every sdpa option at once on (2, Hq, n, dk) queries: a mask hiding 20% of the keys, a bias,
    causal lower-right, ``window``, the lengths (two batch elements), a scale of 0.7."""
    return {
        "mask": rng.random((2, 1, n, m)) < 0.8,
        "bias": rng.standard_normal((n, m)),
        "causal": "lower_right",
        "window": window,
        "kv_lengths": np.array(kv_lengths),
        "q_lengths": np.array(q_lengths),
        "scale": 0.7,
    }


def gqa_call(batch, hkv, group, n, m, dk, dv, seed):
    """(the seeded generator, q, k, v, a mask hiding 30% of the keys) for those drawn sizes."""
    r = np.random.default_rng(seed)
    q = r.standard_normal((*batch, hkv * group, n, dk))
    k = r.standard_normal((*batch, hkv, m, dk))
    v = r.standard_normal((*batch, hkv, m, dv))
    return r, q, k, v, r.random((n, m)) < 0.7
