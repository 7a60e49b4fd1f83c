"""Conformance of sdpa_blocked: the tiled online softmax is sdpa, whatever the tile sizes.

Tiles are drawn small (1 to 9 rows and keys against sides up to 24), so most cases cross several
tile boundaries: a running max that grows from one key tile to the next, rows whose visible keys
start in a later tile, tiles that are hidden or partly hidden. The golden and the tolerance are
those of sdpa (`pytest_helpers.golden_for`); a backend runs its own ``sdpa_blocked``.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance.corners import with_corners
from attnspec.conformance.hypothesis_helpers import sdpa_cases
from attnspec.conformance.judge import judge_output
from attnspec.conformance.pytest_helpers import (
    Verdict,
    to_backend,
)
from attnspec.conformance.test_sdpa import DTYPES

FN = "sdpa_blocked"
BLOCKS = st.integers(1, 9)


def judge_blocked(backend, device, prop, case, block_q: int, block_k: int) -> Verdict:
    """Call ``backend.sdpa_blocked`` on the case and judge it as sdpa's output (`judge_output`)."""
    (q, k, v), opts = to_backend(backend, case, device)
    result = backend.sdpa_blocked(q, k, v, **opts, block_q=block_q, block_k=block_k)
    return judge_output(backend, device, prop, case, result, fn=FN, block_q=block_q, block_k=block_k)


@DTYPES
@with_corners
@given(data=st.data())
def test_blocked_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """sdpa_blocked's output (and weights, when asked) equal the golden sdpa within the tolerance rule."""
    case = data.draw(sdpa_cases(dtype), label="case")
    if data.draw(st.booleans(), label="return_weights"):
        case = case.with_options(return_weights=True)
    block_q, block_k = data.draw(BLOCKS, label="block_q"), data.draw(BLOCKS, label="block_k")
    judge(
        FN,
        "matches_golden",
        case,
        lambda: judge_blocked(attn_backend, attn_device, "matches_golden", case, block_q, block_k),
    )


@DTYPES
@with_corners
@given(data=st.data())
def test_blocked_one_key_tiles(attn_backend, attn_device, judge, dtype, data):
    """block_k = 1: every key is its own tile, so the running max is rescaled at every new maximum."""
    case = data.draw(
        sdpa_cases(
            dtype,
            features=("plain", "large_logits", "mask", "causal_lower_right", "bias_neg_inf", "combined"),
        ),
        label="case",
    )
    block_q = data.draw(BLOCKS, label="block_q")
    judge(
        FN,
        "one_key_tiles",
        case,
        lambda: judge_blocked(attn_backend, attn_device, "one_key_tiles", case, block_q, 1),
    )
