"""FlashAttention's varlen and KV-cache functions as conventions of `attnspec check`.

Both align causal masks, windows and ALiBi on each sequence's *actual* lengths: query i of a
sequence of sq queries and sk keys sees key j when j <= i + sk - sq, and ALiBi adds
``-slope * |i + sk - sq - j|`` (FlashAttention's docstrings of ``flash_attn_varlen_func`` and
``flash_attn_with_kvcache``). That is the spec's ``causal="lower_right_lengths"``; the spec's
other alignments are carried only where they coincide with it (no lengths or segments, and
n == m or lower-right), and refused otherwise.

``flash_varlen``  ``fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                  softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, return_attn_probs=False)`` on packed (total, H, D) arrays.
                  Each batch element's segments (or, without segment ids, the element itself)
                  become sequences: the rows of one id within q_lengths and kv_lengths must be
                  contiguous. ``cu_seqlens`` are int32; ALiBi slopes go per sequence, (S, H).
                  Rows in no sequence (padding ids, rows past q_lengths) are not given to the
                  function; the spec has them see no key, so they come back as 0 (lse -inf).
                  ``return_attn_probs=True`` returns (out, softmax_lse (H, total_q), S_dmask).
``flash_kvcache`` ``fn(q, k_cache, v_cache, cache_seqlens=None, softmax_scale=None, causal=False,
                  window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                  return_softmax_lse=False)`` on (B, L, H, D) arrays; the spec's kv_lengths are
                  ``cache_seqlens`` (int32, (B,)); ``return_softmax_lse=True`` returns
                  (out, lse (B, H, n)). No new k, v appended, no rotary, no paged cache.

Neither has a mask, bias, sinks or a given dropout mask; neither returns weights. Packing runs
through NumPy on the host: it is the convention's layout work, not the function's.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import numpy as np

from attnspec.backends.authoring import unflatten_batch
from attnspec.backends.base import Unsupported
from attnspec.backends.conventions import Call, Convention, _device, _first, flat_qkv

__all__ = ["FlashKVCache", "FlashVarlen"]

_COMMON_CANNOT: dict[str, str | None] = {
    "mask": "has no mask argument",
    "bias": "has no bias argument",
    "return_weights": "returns no attention weights",
    "sinks": "has no attention sinks",
    "dropout": "draws its own dropout mask (dropout_p) and takes no given one",
}
_ALIGNED_USES = ("causal_upper_left", "causal_lower_right", "window", "window_lower_right", "alibi")


def _alignment_refusals(name: str, call: Call) -> list[str]:
    """FlashAttention anchors causal, window and ALiBi at i + sk - sq of each sequence: refuse a
    spec alignment that can differ from that for this call."""
    if "causal_lower_right_lengths" in call.needs:
        return []
    sizes_are_lengths = not {"q_lengths", "kv_lengths", "segments"} & call.needs
    if sizes_are_lengths and (call.n == call.m or "causal_lower_right" in call.needs):
        return []  # one sequence of n queries and m keys: its anchor i + m - n is the spec's
    uses = [u for u in _ALIGNED_USES if u in call.needs]
    if not uses:
        return []
    return [
        f"the {name} convention anchors causal, window and ALiBi at i + sk - sq of each sequence's "
        f"actual lengths (causal='lower_right_lengths'): the spec's {', '.join(uses)} differs here"
    ]


def _options(p, lib, q, options: dict[str, Any], slopes_rows: np.ndarray | None = None) -> dict[str, Any]:
    """The keywords both functions share, each only when it differs from its default."""
    kw: dict[str, Any] = {}
    if options.get("scale") is not None:
        kw["softmax_scale"] = p.scale
    if p.causal is not None:
        kw["causal"] = True
    if p.window is not None:
        kw["window_size"] = p.window
    if p.softcap is not None:
        kw["softcap"] = p.softcap
    slopes = options.get("alibi_slopes")
    if slopes is not None:  # (Hq,) or (..., Hq) -> (B, Hq), or one row per sequence; float32
        s = np.broadcast_to(np.asarray(lib.to_numpy(slopes), np.float32), (*p.batch, p.hq))
        s = s.reshape(math.prod(p.batch), p.hq)
        s = s if slopes_rows is None else s[slopes_rows]
        kw["alibi_slopes"] = lib.asarray(np.ascontiguousarray(s), device=_device(lib, q))
    return kw


class FlashKVCache(Convention):
    name = "flash_kvcache"
    signature = (
        "fn(q, k_cache, v_cache, cache_seqlens=None, softmax_scale=None, causal=False, "
        "window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax_lse=False) on "
        "(B, L, H, D) arrays, causal, window and ALiBi aligned on cache_seqlens"
    )
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {
        **_COMMON_CANNOT,
        "q_lengths": "has no query lengths (cache_seqlens are the keys')",
        "segments": "has no segment ids (packed sequences are flash_varlen's)",
    }
    causal_flag = "lower_right"
    window_argument = True
    variants = frozenset({"softcap", "alibi", "lse", "causal_lower_right_lengths"})

    def refusals(self, call: Call) -> list[str]:
        return super().refusals(call) + _alignment_refusals(self.name, call)

    def call(self, fn, lib, p, q, k, v, options):
        qf, kf, vf = flat_qkv(p, q, k, v, "blhd")  # (B, n, Hq, dk), (B, m, Hkv, dk), (B, m, Hkv, dv)
        kw = _options(p, lib, q, options)
        if p.kv_lengths is not None:
            lengths = np.ascontiguousarray(p.kv_lengths.reshape(-1), np.int32)  # (B,)
            kw["cache_seqlens"] = lib.asarray(lengths, device=_device(lib, q))
        if p.return_lse:
            kw["return_softmax_lse"] = True
        result = fn(qf, kf, vf, **kw)
        out = unflatten_batch(p, _first(result), layout="blhd")  # (B, n, Hq, dv) -> spec's
        if not p.return_lse:
            return out, None
        return (out, lib.reshape(result[1], p.lse_shape)), None  # (B, Hq, n)


def _sequences(p, options: dict[str, Any], lib) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(batch element, query rows, key rows) of every sequence, in order; rows within the lengths."""
    B = math.prod(p.batch)
    q_len = np.full(B, p.n) if p.q_lengths is None else p.q_lengths.reshape(-1)
    kv_len = np.full(B, p.m) if p.kv_lengths is None else p.kv_lengths.reshape(-1)
    ids = [options.get(name) for name in ("q_segment_ids", "kv_segment_ids")]
    if ids[0] is None:
        return [(b, np.arange(q_len[b]), np.arange(kv_len[b])) for b in range(B)]
    q_ids, kv_ids = (
        np.broadcast_to(lib.to_numpy(x), (*p.batch, size)).reshape(B, size)
        for x, size in zip(ids, (p.n, p.m))
    )
    seqs = []
    for b in range(B):
        qi, ki = q_ids[b, : q_len[b]], kv_ids[b, : kv_len[b]]
        for s in sorted(set(qi[qi >= 0].tolist()) | set(ki[ki >= 0].tolist())):
            rows = (np.flatnonzero(qi == s), np.flatnonzero(ki == s))
            if any(r.size and r[-1] - r[0] + 1 != r.size for r in rows):
                raise Unsupported(
                    f"the flash_varlen convention packs each segment as one contiguous "
                    f"sequence: segment {s} of batch element {b} is not contiguous"
                )
            seqs.append((b, *rows))
    return seqs


class FlashVarlen(Convention):
    name = "flash_varlen"
    signature = (
        "fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, "
        "causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, "
        "return_attn_probs=False) on packed (total, H, D) arrays, causal, window and ALiBi "
        "aligned on each sequence"
    )
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = dict(_COMMON_CANNOT)
    causal_flag = "lower_right"
    window_argument = True
    variants = frozenset({"softcap", "alibi", "lse", "segments", "causal_lower_right_lengths"})

    def refusals(self, call: Call) -> list[str]:
        return super().refusals(call) + _alignment_refusals(self.name, call)

    def call(self, fn, lib, p, q, k, v, options):
        seqs = _sequences(p, options, lib)
        qf, kf, vf = (lib.to_numpy(x) for x in flat_qkv(p, q, k, v, "blhd"))  # (B, L, H, d) each
        device = _device(lib, q)

        def pack(x, which: int):  # (B, L, H, d) -> (total, H, d), sequence after sequence
            parts = [x[s[0], s[which]] for s in seqs]
            return np.concatenate(parts) if parts else x[:0, 0]

        def cu(which: Literal[1, 2]):  # (S + 1,) int32 cumulative lengths
            return np.concatenate([[0], np.cumsum([len(s[which]) for s in seqs])]).astype(np.int32)

        cu_q, cu_k = cu(1), cu(2)
        kw = _options(p, lib, q, options, np.array([s[0] for s in seqs], np.int64))
        if p.return_lse:
            kw["return_attn_probs"] = True
        args = [
            lib.asarray(np.ascontiguousarray(pack(x, which)), p.dtype, device)
            for x, which in ((qf, 1), (kf, 2), (vf, 2))
        ]  # (total, H, d) each
        args += [lib.asarray(c, device=device) for c in (cu_q, cu_k)]
        args += [int(np.diff(cu_q).max(initial=0)), int(np.diff(cu_k).max(initial=0))]
        result = fn(*args, **kw)
        packed = lib.to_numpy(_first(result))  # (total_q, Hq, dv)
        out = np.zeros((qf.shape[0], p.n, p.hq, p.dv), packed.dtype)  # rows in no sequence see no key
        for (b, rows, _), start in zip(seqs, cu_q[:-1]):
            out[b, rows] = packed[start : start + len(rows)]
        out = unflatten_batch(p, lib.asarray(out, p.dtype, device), layout="blhd")  # -> spec's
        if not p.return_lse:
            return out, None
        packed_lse = lib.to_numpy(result[1])  # (Hq, total_q)
        lse = np.full((qf.shape[0], p.hq, p.n), -np.inf, packed_lse.dtype)
        for (b, rows, _), start in zip(seqs, cu_q[:-1]):
            lse[b][:, rows] = packed_lse[:, start : start + len(rows)]
        return (out, lib.reshape(lib.asarray(lse, device=device), p.lse_shape)), None
