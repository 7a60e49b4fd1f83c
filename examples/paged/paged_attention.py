"""Paged-KV-cache attention in torch, reading keys and values through a block table.

``flash_style`` has the signature of FlashAttention's ``flash_attn_with_kvcache`` with a paged
cache (``attnspec check ... --convention flash_kvcache_paged``), ``vllm_style`` that of vLLM's
``ref_paged_attn`` (``--convention vllm_paged``). Both are written from those functions'
documented semantics, not from the spec: sequence b holds ``L = cache_seqlens[b]`` keys, key j in
slot ``j % block_size`` of block ``block_table[b, j // block_size]``; query i of the sequence's
sq queries anchors at ``i' = i + L - sq``; causal shows keys j <= i', the window keys in
[i' - left, i' + right] (-1 = unbounded), ALiBi adds ``-slope * |i' - j|``, softcap caps the
scaled score; query head h reads kv head h // G; a row with no visible key outputs 0 (lse -inf).
Hidden keys are removed with ``where``, never by multiplying by 0, so a NaN in a hidden key
cannot reach a row. Compute runs in float32 (float64 for float64 inputs); one rounding at the end.

Three deliberately wrong ones beside them, each a bug a paged kernel can have:
``ignores_block_table`` reads blocks 0, 1, ... of the pool in order; ``reads_past_seqlens``
loads the whole table (every slot of every entry) and masks the scores past the length to -inf,
but multiplies the values through a matmul, where 0 * NaN is NaN; ``causal_on_padded`` gathers
correctly but puts the causal and window diagonal on the padded cache size
(max_blocks * block_size) instead of the sequence's length.
"""

from __future__ import annotations

import math

import torch


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _gather(cache: torch.Tensor, blocks: torch.Tensor, length: int) -> torch.Tensor:
    """(num_blocks, P, H, d) through ``blocks`` -> (length, H, d): the first ``length`` slots."""
    if blocks.numel() == 0:
        return cache.new_zeros((length, *cache.shape[2:]))
    return cache[blocks.long()].reshape(-1, *cache.shape[2:])[:length]


def _sequence(q, k_cache, v_cache, table_row, length, scale, causal, window, softcap, slopes, bug=None):
    """One sequence: q (sq, Hq, dk) -> out (sq, Hq, dv) and lse (Hq, sq), in the compute dtype."""
    ct = _compute_dtype(q.dtype)
    sq, hq, _ = q.shape
    size = k_cache.shape[1]
    used = -(-length // size)
    if bug == "ignores_block_table":  # the first blocks of the pool, not the sequence's
        blocks = torch.arange(used, device=q.device)
    elif bug == "reads_past_seqlens":  # every entry of the table, every slot
        blocks = table_row
    else:
        blocks = table_row[:used]
    sk = blocks.numel() * size if bug == "reads_past_seqlens" else length
    k = _gather(k_cache, blocks, sk).to(ct)  # (sk, Hkv, dk)
    v = _gather(v_cache, blocks, sk).to(ct)  # (sk, Hkv, dv)
    if sk == 0 or sq == 0:  # no key (an empty cache): every row outputs 0, lse -inf
        return (
            q.new_zeros((sq, hq, v.shape[-1]), dtype=ct),
            torch.full((hq, sq), -math.inf, dtype=ct, device=q.device),
        )
    g = hq // max(k.shape[1], 1)
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)  # kv head h // G
    diag_len = table_row.numel() * size if bug == "causal_on_padded" else length
    i = torch.arange(sq, device=q.device)[:, None]
    j = torch.arange(sk, device=q.device)[None, :]
    anchor = i + diag_len - sq  # (sq, 1)
    vis = j < length  # (sq, sk)
    if causal:
        vis = vis & (j <= anchor)
    if window[0] >= 0:
        vis = vis & (j >= anchor - window[0])
    if window[1] >= 0:
        vis = vis & (j <= anchor + window[1])
    s = torch.einsum("ihd,jhd->hij", q.to(ct), k) * scale  # (Hq, sq, sk)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        s = s - slopes.to(ct)[:, None, None] * (i + length - sq - j).abs()
    if bug == "reads_past_seqlens":  # masks scores only; the values go through a matmul
        s = s.masked_fill(~vis, -math.inf)
        top = s.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(ct).min)
        p = torch.exp(s - top)
        denom = p.sum(-1, keepdim=True)
        out = (p @ v.transpose(0, 1)) / denom  # (Hq, sq, dv)
        lse = (top + denom.log()).squeeze(-1)
        return out.transpose(0, 1), lse
    vis = vis.expand_as(s)
    s = torch.where(vis, s, -math.inf)
    top = s.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    p = torch.where(vis, torch.exp(s - top), torch.zeros_like(s))  # (Hq, sq, sk)
    denom = p.sum(-1, keepdim=True)  # (Hq, sq, 1)
    vh = v.transpose(0, 1)  # (Hq, sk, dv)
    weighted = torch.where(vis[..., None], p[..., None] * vh[:, None], torch.zeros((), dtype=ct))
    out = weighted.sum(-2) / torch.where(denom > 0, denom, torch.ones_like(denom))  # (Hq, sq, dv)
    lse = torch.where(denom > 0, top + denom.log(), torch.full_like(denom, -math.inf)).squeeze(-1)
    return out.transpose(0, 1), lse


def flash_style(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    return_softmax_lse=False,
    *,
    _bug=None,
):
    """``flash_attn_with_kvcache``'s semantics with a paged cache: q (B, n, Hq, dk), caches
    (num_blocks, block_size, Hkv, d), cache_seqlens (B,) int32, block_table (B, W) int32
    (``_bug`` makes the wrong ones below)."""
    bug = _bug
    b, n, hq, dk = q.shape
    scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(dk)
    out = q.new_zeros((b, n, hq, v_cache.shape[-1]), dtype=_compute_dtype(q.dtype))
    lse = torch.full((b, hq, n), -math.inf, dtype=_compute_dtype(q.dtype), device=q.device)
    for e in range(b):
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.ndim == 1 else alibi_slopes[e]
        out[e], lse[e] = _sequence(
            q[e],
            k_cache,
            v_cache,
            block_table[e],
            int(cache_seqlens[e]),
            scale,
            causal,
            tuple(window_size),
            softcap,
            slopes,
            bug,
        )
    out = out.to(q.dtype)
    return (out, lse) if return_softmax_lse else out


def vllm_style(
    query,
    key_cache,
    value_cache,
    query_lens,
    kv_lens,
    block_tables,
    scale,
    sliding_window=None,
    soft_cap=None,
    *,
    _bug=None,
):
    """``ref_paged_attn``'s semantics: query packed (sum(query_lens), Hq, dk), always causal on
    each sequence's lengths, ``sliding_window`` counting the query's own key (``_bug`` makes the
    wrong ones below)."""
    bug = _bug
    outputs, start = [], 0
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, -1)
    for e, (sq, sk) in enumerate(zip(query_lens, kv_lens)):
        out, _ = _sequence(
            query[start : start + sq],
            key_cache,
            value_cache,
            block_tables[e],
            int(sk),
            scale,
            True,
            window,
            soft_cap or 0.0,
            None,
            bug,
        )
        outputs.append(out)
        start += sq
    if not outputs:
        return query.new_zeros((0, query.shape[1], value_cache.shape[-1]))
    return torch.cat(outputs).to(query.dtype)


def _wrong(bug: str):
    def flash(*args, **kwargs):
        return flash_style(*args, **kwargs, _bug=bug)

    def vllm(*args, **kwargs):
        return vllm_style(*args, **kwargs, _bug=bug)

    flash.__name__ = flash.__qualname__ = f"flash_{bug}"
    vllm.__name__ = vllm.__qualname__ = f"vllm_{bug}"
    return flash, vllm


#: Wrong: reads blocks 0, 1, ... of the pool in order, ignoring the block table.
flash_ignores_block_table, vllm_ignores_block_table = _wrong("ignores_block_table")
#: Wrong: loads every slot of the whole table and lets 0 * NaN through the value matmul.
flash_reads_past_seqlens, vllm_reads_past_seqlens = _wrong("reads_past_seqlens")
#: Wrong: the causal and window diagonal on max_blocks * block_size instead of cache_seqlens.
flash_causal_on_padded, vllm_causal_on_padded = _wrong("causal_on_padded")
