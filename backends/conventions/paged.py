"""Paged KV caches as conventions of `attnspec check`: FlashAttention's ``block_table`` and vLLM's
``ref_paged_attn``.

The spec's keys and values are contiguous; paging is a layout, so it lives here, and it is
adversarial. For each call the convention scatters every sequence's keys and values (rows
``j < L_b``, ``L_b`` its kv length) into a shuffled pool of blocks, and every slot that holds no
key of a sequence is NaN: the slots past ``L_b`` in a sequence's last block, blocks in no table,
and at least two *trap* blocks that every unused table entry points at (never -1, which a kernel
would read out of bounds, and never a live block, whose finite leak would look like a plain
tolerance failure). A function that reads outside its table or past its length therefore turns
a row NaN, and `Convention.output_causes` names it ("a hidden key's NaN/inf reached ...",
clause ``sdpa.hidden_nonfinite``) when the row's own query, keys and values are all finite.

The block size is drawn from `BLOCK_SIZES` (FlashInfer tests page sizes 1, 5 and 16) and the
pool's order from the same deterministic seed, a CRC of the call's shapes, lengths and key bytes:
each call is reproducible, and a run exercises every size. GQA keeps Hkv heads in the pool (both
kernels map query head h to kv head h // G).

``flash_kvcache_paged``  ``fn(q, k_cache, v_cache, cache_seqlens=..., block_table=...,
        softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
        return_softmax_lse=False)``: FlashAttention 2's ``flash_attn_with_kvcache`` (signature in
        ``flash_attn/flash_attn_interface.py`` of Dao-AILab/flash-attention @0251105a, lines
        1485-1505; paged layout ``k_cache (num_blocks, page_block_size, nheads_k, headdim)``,
        ``block_table (batch_size, max_num_blocks_per_seq)`` int32, ``cache_seqlens (batch_size,)``
        int32, lines 1548-1568). q is (B, n, Hq, dk); ``cache_seqlens`` is always passed (without
        it FlashAttention reads the whole table). Causal, window and ALiBi are aligned on each
        sequence's length, the spec's ``causal="lower_right_lengths"``, as for ``flash_kvcache``.
        No q_lengths, mask, bias, segments, sinks, given dropout mask or weights. FlashAttention 2
        itself wants page_block_size % 256 == 0; FA3's hopper API calls the table ``page_table``
        and takes any block size.
``vllm_paged``  ``fn(query, key_cache, value_cache, query_lens, kv_lens, block_tables, scale,
        sliding_window=None, soft_cap=None)``: vLLM's test reference ``ref_paged_attn``
        (vllm-project/vllm ``tests/kernels/attention/test_flash_attn.py`` @0001b995). query is
        packed (sum(query_lens), Hq, dk), sequence after sequence; ``query_lens`` and ``kv_lens``
        are lists of ints; caches (num_blocks, block_size, Hkv, d); ``block_tables`` (B, W) int32;
        the output is packed like query. It is always causal, lower-right on each sequence's
        lengths; ``sliding_window`` counts the query's own key (key j visible from anchor i' when
        i' - sliding_window < j <= i'), so the spec's window (left, right) under causal passes
        ``sliding_window = left + 1``. Rows past q_lengths are not passed and come back 0. The
        function gets its own copy of query (``ref_paged_attn`` scales it in place). No mask,
        bias, ALiBi, sinks, lse, segments, given dropout or weights; no non-causal call.

Packing and paging run through NumPy on the host: the convention's layout work, not the
function's.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnspec.backends.authoring import unflatten_batch
from attnspec.backends.conventions import Call, Convention, _device, _first, flat_qkv
from attnspec.backends.conventions.flash import _COMMON_CANNOT, _alignment_refusals, _options

__all__ = ["BLOCK_SIZES", "FlashKVCachePaged", "Paging", "VllmPaged", "page", "paging_for"]

#: the block (page) sizes a call is paged with, one per call (FlashInfer's tests use 1, 5, 16)
BLOCK_SIZES = (1, 5, 16)
#: trap blocks in every pool, besides one more per two sequences
TRAPS = 2


@dataclass(frozen=True)
class Paging:
    """Where each sequence's keys live: ``table[b, j // block_size]`` is the physical block of
    key j, slot ``j % block_size``; entries past ``ceil(lengths[b] / block_size)`` are traps."""

    block_size: int
    table: np.ndarray  # (B, W) int32
    lengths: np.ndarray  # (B,) int32
    num_blocks: int
    traps: tuple[int, ...]  # the physical ids of the all-NaN trap blocks


def paging_for(lengths: np.ndarray, m: int, seed: int, block_sizes: tuple[int, ...] = BLOCK_SIZES) -> Paging:
    """A shuffled paging of sequences of ``lengths`` keys (each <= m) for ``seed``: the table has
    at least one unused entry per sequence, and unused entries point at trap blocks."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    rng = np.random.default_rng(seed)
    size = block_sizes[seed % len(block_sizes)]
    used = [-(-int(L) // size) for L in lengths]  # ceil(L / size), 0 for an empty cache
    width = -(-m // size) + 1
    n_traps = TRAPS + len(lengths) // 2
    total = sum(used) + n_traps
    perm = rng.permutation(total)  # logical block -> physical id
    traps = tuple(int(t) for t in perm[sum(used) :])
    table = np.empty((len(lengths), width), np.int32)
    start = 0
    for b, nb in enumerate(used):
        table[b, :nb] = perm[start : start + nb]
        table[b, nb:] = [traps[(b + e) % n_traps] for e in range(width - nb)]
        start += nb
    return Paging(size, table, lengths.astype(np.int32), total, traps)


def page(x: np.ndarray, paging: Paging) -> np.ndarray:
    """(B, m, H, d) -> the pool (num_blocks, block_size, H, d): row j < lengths[b] of sequence b at
    its table's slot, every other slot NaN (in x's dtype)."""
    B, _, H, d = x.shape
    pool = np.full((paging.num_blocks, paging.block_size, H, d), np.nan, x.dtype)
    for b in range(B):
        j = np.arange(int(paging.lengths[b]))
        pool[paging.table[b, j // paging.block_size], j % paging.block_size] = x[b, : len(j)]
    return pool


def paging_seed(*arrays: np.ndarray, lengths: np.ndarray) -> int:
    """A deterministic seed for one call: a CRC of its shapes, lengths and key bytes."""
    crc = zlib.crc32(repr([a.shape for a in arrays]).encode())
    crc = zlib.crc32(np.ascontiguousarray(lengths, np.int64).tobytes(), crc)
    for a in arrays:
        crc = zlib.crc32(np.ascontiguousarray(a).tobytes()[:4096], crc)
    return crc


def _kv_lengths(p) -> np.ndarray:
    B = math.prod(p.batch)
    return np.full(B, p.m, np.int64) if p.kv_lengths is None else p.kv_lengths.reshape(-1).astype(np.int64)


def _q_lengths(p) -> np.ndarray:
    B = math.prod(p.batch)
    return np.full(B, p.n, np.int64) if p.q_lengths is None else p.q_lengths.reshape(-1).astype(np.int64)


class _Paged(Convention):
    """What both paged conventions share: the pool, and naming a NaN read from it."""

    arrays = "torch"
    causal_flag = "lower_right"
    window_argument = True
    #: the block sizes calls are paged with (one per call, from the call's seed)
    block_sizes: tuple[int, ...] = BLOCK_SIZES

    def refusals(self, call: Call) -> list[str]:
        return super().refusals(call) + _alignment_refusals(self.name, call)

    def _pools(self, p, lib, q, k, v):
        """(q (B, n, Hq, dk) NumPy, pools of k and v, the paging, the device)."""
        qf, kf, vf = (lib.to_numpy(x) for x in flat_qkv(p, q, k, v, "blhd"))  # (B, L, H, d) each
        lengths = _kv_lengths(p)
        paging = paging_for(lengths, p.m, paging_seed(qf, kf, vf, lengths=lengths), self.block_sizes)
        return qf, page(kf, paging), page(vf, paging), paging, _device(lib, q)

    def output_causes(self, p, lib, q, k, v, options, out) -> list[str]:
        """Rows the function returned NaN/inf although their query and their sequence's keys and
        values are finite: it read a pool slot that holds no key of the sequence."""
        try:  # the spec's (*batch, Hq, n, dv) -> (B, n, Hq, dv)
            got = np.asarray(lib.to_numpy(out), np.float64).reshape(math.prod(p.batch), p.hq, p.n, p.dv)
        except Exception:  # not an array of the output's size: the judge says so
            return []
        got = got.transpose(0, 2, 1, 3)
        qf, kf, vf = (lib.to_numpy(x).astype(np.float64) for x in flat_qkv(p, q, k, v, "blhd"))
        kv_len, q_len = _kv_lengths(p), _q_lengths(p)
        rows = []
        for b in range(qf.shape[0]):
            L = int(kv_len[b])
            keys_ok = np.isfinite(kf[b, :L]).all(axis=(0, 2)) & np.isfinite(vf[b, :L]).all(
                axis=(0, 2)
            )  # (Hkv,)
            for i in range(int(q_len[b])):
                for h in range(p.hq):
                    if (
                        not np.isfinite(got[b, i, h]).all()
                        and np.isfinite(qf[b, i, h]).all()
                        and keys_ok[h // p.group]
                    ):
                        rows.append((b, h, i))
        if not rows:
            return []
        shown = ", ".join(map(str, rows[:3])) + (f" and {len(rows) - 3} more" if len(rows) > 3 else "")
        return [
            f"a hidden key's NaN/inf reached rows {shown} of (B, Hq, n) through the paged cache: their "
            f"query and their sequence's keys and values are finite, and the {self.name} convention "
            "fills every slot that holds no key of a sequence with NaN (slots past its length, "
            "blocks outside its table, the trap blocks unused table entries point at), so the "
            "function read past its length or outside its block table"
        ]


class FlashKVCachePaged(_Paged):
    name = "flash_kvcache_paged"
    signature = (
        "fn(q, k_cache, v_cache, cache_seqlens=..., block_table=..., softmax_scale=None, "
        "causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, "
        "return_softmax_lse=False): q (B, n, H, D), paged caches (num_blocks, block_size, Hkv, D), "
        "block_table (B, max_blocks) int32, cache_seqlens (B,) int32; causal, window and ALiBi "
        "aligned on cache_seqlens"
    )
    cannot: ClassVar[dict[str, str | None]] = {
        **_COMMON_CANNOT,
        "q_lengths": "has no query lengths (cache_seqlens are the keys')",
        "segments": "has no segment ids (packed sequences are flash_varlen's)",
    }
    variants = frozenset({"softcap", "alibi", "lse", "causal_lower_right_lengths"})
    #: the keyword of the table (FlashAttention 3's hopper API: "page_table")
    table_keyword = "block_table"

    def call(self, fn, lib, p, q, k, v, options):
        qf, k_pool, v_pool, paging, device = self._pools(p, lib, q, k, v)
        kw = _options(p, lib, q, options)
        kw["cache_seqlens"] = lib.asarray(paging.lengths, device=device)  # (B,) int32
        kw[self.table_keyword] = lib.asarray(paging.table, device=device)  # (B, W) int32
        if p.return_lse:
            kw["return_softmax_lse"] = True
        # each in its own dtype: an FP8 call's plan is of the dequantised (float64) inputs
        q_arg, k_arg, v_arg = (
            lib.asarray(np.ascontiguousarray(x), lib.dtype_name(orig), device)
            for x, orig in ((qf, q), (k_pool, k), (v_pool, v))
        )
        result = fn(q_arg, k_arg, v_arg, **kw)
        out = unflatten_batch(p, _first(result), layout="blhd")  # (B, n, Hq, dv) -> spec's
        if not p.return_lse:
            return out, None
        return (out, lib.reshape(result[1], p.lse_shape)), None  # (B, Hq, n)


class VllmPaged(_Paged):
    name = "vllm_paged"
    signature = (
        "fn(query, key_cache, value_cache, query_lens, kv_lens, block_tables, scale, "
        "sliding_window=None, soft_cap=None): vLLM's ref_paged_attn; query packed (sum(query_lens), "
        "Hq, D), caches (num_blocks, block_size, Hkv, D), block_tables (B, max_blocks) int32, "
        "query_lens and kv_lens lists of ints; always causal on each sequence's lengths; "
        "sliding_window counts the query's own key"
    )
    cannot: ClassVar[dict[str, str | None]] = {
        **_COMMON_CANNOT,
        "segments": "has no segment ids (one sequence per batch element)",
        "alibi": "has no ALiBi slopes",
        "lse": "returns no log-sum-exp",
    }
    variants = frozenset({"softcap", "causal_lower_right_lengths"})

    def refusals(self, call: Call) -> list[str]:
        why = super().refusals(call)
        causal = {"causal_upper_left", "causal_lower_right", "causal_lower_right_lengths"} & call.needs
        if not causal and call.n > 1 and "empty" not in call.needs:  # an empty output cannot differ
            why.append(
                f"the {self.name} convention is always causal (lower-right on each sequence's "
                "lengths): a call without causal differs when n > 1"
            )
        return why

    def call(self, fn, lib, p, q, k, v, options):
        qf, k_pool, v_pool, paging, device = self._pools(p, lib, q, k, v)
        q_len = _q_lengths(p)
        packed = (
            np.concatenate([qf[b, : int(q_len[b])] for b in range(qf.shape[0])]) if qf.shape[0] else qf[:0, 0]
        )
        kw: dict[str, Any] = {}
        if p.window is not None:  # under causal only the left side matters: i' - left <= j
            kw["sliding_window"] = p.window[0] + 1
        if p.softcap is not None:
            kw["soft_cap"] = p.softcap
        q_arg, k_arg, v_arg = (
            lib.asarray(np.ascontiguousarray(x), p.dtype, device) for x in (packed, k_pool, v_pool)
        )
        result = fn(
            q_arg,
            k_arg,
            v_arg,
            [int(x) for x in q_len],
            [int(x) for x in paging.lengths],
            lib.asarray(paging.table, device=device),
            p.scale,
            **kw,
        )
        got = lib.to_numpy(_first(result))  # (total_q, Hq, dv)
        out = np.zeros((qf.shape[0], p.n, p.hq, p.dv), got.dtype)  # rows past q_lengths see no key
        start = 0
        for b in range(qf.shape[0]):
            out[b, : int(q_len[b])] = got[start : start + int(q_len[b])]
            start += int(q_len[b])
        return unflatten_batch(p, lib.asarray(out, p.dtype, device), layout="blhd"), None  # -> spec's
