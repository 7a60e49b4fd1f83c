"""FlashAttention-style varlen and KV-cache functions on NumPy arrays, for `attnspec check`.

Written from FlashAttention's documented semantics (the docstrings of ``flash_attn_varlen_func``
and ``flash_attn_with_kvcache``), not from the spec: per sequence of sq queries and sk keys,
query i sees key j when j <= i + sk - sq (causal), and within
[i + sk - sq - left, i + sk - sq + right] (window, -1 = unbounded); ALiBi adds
-slope * |i + sk - sq - j|; softcap caps the scaled score; a row with no key outputs 0. The lse is
the log of each row's softmax denominator (-inf for an empty row, as the formula says; FlashAttention
2's kernel writes +inf there), float32, or float64 for float64 inputs.
Two deliberately wrong ones: upper-left causal on each varlen sequence, and a KV cache whose
causal diagonal sits on the padded cache size instead of cache_seqlens.
"""

from __future__ import annotations

import math

import numpy as np


def _lse_dtype(dtype) -> type:
    """FlashAttention's lse is float32 (it has no float64); float64 inputs keep float64 here."""
    return np.float64 if dtype == np.float64 else np.float32


def _attend(q, k, v, scale, causal, window, softcap, slopes, anchor_on_padded=None, upper_left=False):
    """One sequence: q (sq, H, d), k (sk, Hkv, d), v (sk, Hkv, dv) in float64 -> out (sq, H, dv),
    lse (H, sq). ``anchor_on_padded`` (the wrong KV cache): the diagonal's sk is that size."""
    sq, h, _ = q.shape
    sk, hkv, dv = v.shape
    g = h // hkv
    out = np.zeros((sq, h, dv))
    lse = np.full((h, sq), -np.inf)
    diag_sk = sk if anchor_on_padded is None else anchor_on_padded
    for head in range(h):
        for i in range(sq):
            diag = i if upper_left else i + diag_sk - sq
            logits, values = [], []
            for j in range(sk):
                if causal and j > diag:
                    continue
                if window[0] >= 0 and j < diag - window[0]:
                    continue
                if window[1] >= 0 and j > diag + window[1]:
                    continue
                s = scale * float(q[i, head] @ k[j, head // g])
                if softcap:
                    s = softcap * math.tanh(s / softcap)
                if slopes is not None:
                    s -= slopes[head] * abs(i + sk - sq - j)
                logits.append(s)
                values.append(v[j, head // g])
            if not logits:
                continue  # no key: output 0
            top = max(logits)
            e = np.exp(np.array(logits) - top)
            out[i, head] = (e[:, None] * np.array(values)).sum(0) / e.sum()
            lse[head, i] = top + math.log(e.sum())
    return out, lse


# FlashAttention's signatures, kept on few lines as its docs write them (formatted one argument a
# line, they would be most of this file). Each wrong subject is its right one with a flag.
def flash_varlen_numpy(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None,
                       causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                       return_attn_probs=False, *, upper_left=False):  # fmt: skip
    """``flash_attn_varlen_func``'s semantics on packed (total, H, D) NumPy arrays."""
    dtype = q.dtype
    q, k, v = (np.asarray(x).astype(np.float64) for x in (q, k, v))  # (total, H, d)
    cq, ck = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    assert max_seqlen_q == int(np.diff(cq).max(initial=0)) and max_seqlen_k == int(np.diff(ck).max(initial=0))
    scale = softmax_scale or 1 / math.sqrt(q.shape[-1])
    out = np.zeros((q.shape[0], q.shape[1], v.shape[-1]))
    lse = np.full((q.shape[1], q.shape[0]), -np.inf, _lse_dtype(dtype))
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
    for s in range(len(cq) - 1):
        rows, keys = slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])
        sl = None if slopes is None else (slopes if slopes.ndim == 1 else slopes[s])
        o, l_ = _attend(
            q[rows], k[keys], v[keys], scale, causal, window_size, softcap, sl, upper_left=upper_left
        )
        out[rows], lse[:, rows] = o, l_
    out = out.astype(dtype)
    return (out, lse, None) if return_attn_probs else out


def flash_varlen_upper_left(*args, **kwargs):
    """Wrong: causal and window anchored upper-left (j <= i) in each sequence."""
    return flash_varlen_numpy(*args, **kwargs, upper_left=True)


def flash_kvcache_numpy(q, k_cache, v_cache, cache_seqlens=None, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_softmax_lse=False,
                        *, padded=False):  # fmt: skip
    """``flash_attn_with_kvcache``'s semantics (no new k, v) on (B, L, H, D) NumPy arrays."""
    dtype = q.dtype
    q, k, v = (np.asarray(x).astype(np.float64) for x in (q, k_cache, v_cache))  # (B, L, H, d)
    b, n, h, _ = q.shape
    m = k.shape[1]
    lengths = np.full(b, m) if cache_seqlens is None else np.asarray(cache_seqlens)
    scale = softmax_scale or 1 / math.sqrt(q.shape[-1])
    slopes = None if alibi_slopes is None else np.asarray(alibi_slopes, np.float64)
    out = np.zeros((b, n, h, v.shape[-1]))
    lse = np.full((b, h, n), -np.inf, _lse_dtype(dtype))
    for e in range(b):
        sk = int(lengths[e])
        sl = None if slopes is None else (slopes if slopes.ndim == 1 else slopes[e])
        out[e], lse[e] = _attend(
            q[e],
            k[e, :sk],
            v[e, :sk],
            scale,
            causal,
            window_size,
            softcap,
            sl,
            anchor_on_padded=m if padded else None,
        )
    out = out.astype(dtype)
    return (out, lse) if return_softmax_lse else out


def flash_kvcache_padded(*args, **kwargs):
    """Wrong: the causal and window diagonal on the padded cache size m, keys past cache_seqlens
    hidden (the spec's "lower_right" with kv_lengths, where FlashAttention aligns on the lengths)."""
    return flash_kvcache_numpy(*args, **kwargs, padded=True)
