"""Serving-kernel bugs as mutants: each is `mutants.Naive` (the independent plain implementation)
with one bug that only shows on the shapes serving kernels see: tile-edge lengths, large head
dims, batches of 4 to 8 (llama.cpp #7903 broke at 3 to 8; the base strategy has batches of 3),
many query heads per kv head, empty caches, decode reading whole tiles.

The base sdpa properties draw tiny shapes (sides up to 24, head dims up to 16, one or two kv
heads, at most three query heads each), so most of these bugs cannot show there; the serving
property (`attnspec.conformance.test_serving`) must catch every one (tests/test_mutants_serving.py).
"""

from __future__ import annotations

import numpy as np
from mutants import Naive

#: the tile a mutant's kernel works in
TILE = 64


class ServingBug(Naive):
    """Naive with one serving bug applied to the call's arguments or to its output."""

    bug_name = ""

    def sdpa(self, q, k, v, **options):
        b = self.bug_name
        m, dk = k.shape[-2], q.shape[-1]
        lengths = options.get("kv_lengths")
        if b == "tile_edge_drops_last_key" and m > TILE and m % TILE == 1:
            # the key one past the last full tile is never loaded
            last = np.arange(m) < m - 1  # (m,)
            mask = options.get("mask")
            options["mask"] = last if mask is None else mask & last
        if b == "head_dim_cap_256" and dk > 256:  # the dot product runs over the first 256 dims only
            options.setdefault("scale", 1.0 / np.sqrt(dk))
            q, k = q[..., :256], k[..., :256]
        if b == "batch_4_to_8_first_length" and lengths is not None and 4 <= np.size(lengths) <= 8:
            first = lengths.reshape(-1)[0]  # element 0's length for all
            options["kv_lengths"] = np.full_like(lengths, first)
        if b == "decode_reads_whole_tiles" and lengths is not None and q.shape[-2] <= 4:
            # a decode kernel that loads whole 16-key tiles and forgets the tail check
            options["kv_lengths"] = np.minimum(-(-lengths // 16) * 16, m)
        out = super().sdpa(q, k, v, **options)
        if b == "gqa_ratio_16_heads_copied" and min(q.ndim, k.ndim) > 2 and q.shape[-3] // k.shape[-3] >= 16:
            out = np.array(out, copy=True)
            out[..., 8:, :, :] = out[..., :8, :, :][..., np.arange(q.shape[-3] - 8) % 8, :, :]
        if b == "empty_cache_nan" and lengths is not None:
            out = np.array(out, copy=True)
            empty = np.asarray(lengths) == 0  # (B,): a sequence with no key gets no chunk to write
            out[empty] = np.nan
        return out


#: mutant -> the serving features one of which must fail (the decode features all decode)
DECODING = ("decode", "decode_gqa", "empty_cache", "decode_window_sinks")
SERVING_MUTANTS = {
    "tile_edge_drops_last_key": ("kernel_shapes",),
    "head_dim_cap_256": ("kernel_shapes",),
    "batch_4_to_8_first_length": ("kernel_shapes",),
    "gqa_ratio_16_heads_copied": ("kernel_shapes", "decode_gqa"),
    "empty_cache_nan": ("empty_cache",),
    "decode_reads_whole_tiles": DECODING,
}


def make(bug: str):
    return type(f"Serving_{bug}", (ServingBug,), {"name": f"serving-{bug}", "bug_name": bug})


for _bug in SERVING_MUTANTS:
    globals()[f"mutant_{_bug}"] = (lambda b: lambda: make(b)())(_bug)
