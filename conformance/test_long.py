"""Long sequences: one n = m = 16384 case per backend, judged against the memory-efficient golden.

Opt-in, because it costs seconds to minutes of CPU per backend (the golden alone is ~70 GFLOP of
float64, the float32 reference as much again): it runs under ``--attn-profile thorough``, or with
the environment variable ``ATTNSPEC_LONG=1`` under any profile:

    ATTNSPEC_LONG=1 python -m pytest --pyargs attnspec.conformance --attn-backend NAME -k long

The golden (`attnspec.spec.sdpa`) computes such a case tile by tile and the tolerance's reference
in blocks of query rows (`pytest_helpers.golden_for`), so the suite's own side needs a few hundred
MB (the (n, m) causal mask as bool is the largest array), not the ~10 GB of (n, m) float64
intermediates. What the backend needs is its own business: one that materializes (n, m) float32
logits needs ~1 GB per copy.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from attnspec.conformance.hypothesis_helpers import SDPACase
from attnspec.conformance.judge import judge_call

N = 16384
D = 64


def _enabled(pytestconfig) -> bool:
    return os.environ.get("ATTNSPEC_LONG") == "1" or pytestconfig._attn_recorder.profile == "thorough"


def long_case(dtype: str = "float32", seed: int = 16384) -> SDPACase:
    """(1, 1, N, D) causal self-attention in ``dtype``: the shape of a long-context prefill."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 1, N, D)).astype(dtype) for _ in range(3))
    tags = frozenset({"long", dtype, "causal_upper_left"})
    return SDPACase("long", dtype, q, k, v, {"causal": "upper_left"}, tags, seed)


def test_long_sequence_matches_golden(attn_backend, attn_device, judge, pytestconfig):
    """n = m = 16384, causal, float32: the output equals the golden within the tolerance rule."""
    if not _enabled(pytestconfig):
        pytest.skip("n = 16384 is opt-in: ATTNSPEC_LONG=1 or --attn-profile thorough")
    case = long_case()

    def body():
        return judge_call(attn_backend, attn_device, "matches_golden", case)

    judge("sdpa", "long", case, body)
