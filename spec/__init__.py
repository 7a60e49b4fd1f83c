"""The golden specification: plain NumPy functions that define attnspec's semantics.

Every decision where frameworks disagree is listed in ``spec/README.md`` with its reason.
"""

from attnspec.errors import SpecError
from attnspec.spec.blocked import sdpa_blocked
from attnspec.spec.clauses import CLAUSES, SPEC_VERSION
from attnspec.spec.fp8 import sdpa_fp8
from attnspec.spec.grads import sdpa_vjp
from attnspec.spec.grads_lsh import lsh_attention_vjp
from attnspec.spec.grads_mha import mha_vjp
from attnspec.spec.lsh import lsh_attention, lsh_bucket_margins, lsh_buckets, lsh_rotations
from attnspec.spec.masks import (
    causal_mask,
    padding_mask,
    query_anchor,
    query_padding_mask,
    segment_ids_from_cu_seqlens,
    segment_mask,
    window_mask,
)
from attnspec.spec.mha import MHAParams, merge_heads, mha, split_heads
from attnspec.spec.positions import sinusoidal_positions
from attnspec.spec.sdpa import sdpa
from attnspec.spec.sdpa_loops import sdpa_loops

__all__ = [
    "CLAUSES",
    "SPEC_VERSION",
    "MHAParams",
    "SpecError",
    "causal_mask",
    "lsh_attention",
    "lsh_attention_vjp",
    "lsh_bucket_margins",
    "lsh_buckets",
    "lsh_rotations",
    "merge_heads",
    "mha",
    "mha_vjp",
    "padding_mask",
    "query_anchor",
    "query_padding_mask",
    "sdpa",
    "sdpa_blocked",
    "sdpa_fp8",
    "sdpa_loops",
    "sdpa_vjp",
    "segment_ids_from_cu_seqlens",
    "segment_mask",
    "sinusoidal_positions",
    "split_heads",
    "window_mask",
]
