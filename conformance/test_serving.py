"""Conformance of sdpa on the calls serving kernels make: decode over long caches, chunked
prefill, empty caches, windows with sinks, and kernel-shaped head dims, lengths and batches
(`attnspec.conformance.serving_cases`). The same golden and tolerance rule as every sdpa case.

Every profile runs the fixed kernel-shaped cases (`KERNEL_CASES`) as this property's corners;
the drawn examples add the decode features, and under ``default`` and larger profiles drawn
kernel shapes.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance.corners import with_corners
from attnspec.conformance.serving_cases import KERNEL_CASES, serving_cases
from attnspec.spec.validate import FLOAT_DTYPES

DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES)


@DTYPES
@with_corners(kinds=tuple(KERNEL_CASES))
@given(data=st.data())
def test_serving_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """Output equals the golden within the tolerance rule on decode, chunked-prefill, empty-cache
    and kernel-shaped calls; NaN in the cache slots past a sequence's length never reaches it."""
    case = data.draw(serving_cases(dtype), label="case")

    judge.sdpa("matches_golden", case)
