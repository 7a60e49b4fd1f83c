"""Functions for tests/test_verdict.py: the verdict of `attnspec check` on code shaped the way
outside code is (#25). NumPy, written here from the spec's definition, never through attnspec.

Shape letters as in `attnspec.spec.sdpa`: q (..., Hq, n, dk), k (..., Hkv, m, dk), v (..., Hkv, m, dv).
"""

from __future__ import annotations

import math

import numpy as np


def _attend(q, k, v, vis, scale, bias=None, softcap=None):
    """softmax over the visible keys only, in float64; an empty row gives 0."""
    dtype = q.dtype
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = (q @ np.swapaxes(k, -1, -2)) * scale  # (..., Hq, n, m)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if bias is not None:
        s = s + np.where(bias == -np.inf, 0.0, bias)  # -inf hides (vis); NaN stays NaN (corner_nan_bias)
    vis = np.broadcast_to(vis, s.shape)
    s = np.where(vis, s, -np.inf)
    top = s.max(axis=-1, keepdims=True, initial=-np.inf)
    e = np.where(vis, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    w = e / np.where(total == 0, 1.0, total)
    terms = np.where(vis[..., None], w[..., None] * v[..., None, :, :], 0.0)  # (..., Hq, n, m, dv)
    return terms.sum(axis=-2).astype(dtype)


def _sdpa(
    query,
    key,
    value,
    attn_mask=None,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    tiled=False,
    own_scale=False,
    softcap=None,
):
    hq, hkv = query.shape[-3] if query.ndim > 2 else 1, key.shape[-3] if key.ndim > 2 else 1
    if hq != hkv:
        g = hq // hkv
        key, value = (
            (np.tile(x, (1,) * (x.ndim - 3) + (g, 1, 1)) if tiled else np.repeat(x, g, axis=-3))
            for x in (key, value)
        )
    n, m = query.shape[-2], key.shape[-2]
    vis = np.tril(np.ones((n, m), bool)) if is_causal else np.ones((n, m), bool)
    bias = None
    if attn_mask is not None and attn_mask.dtype == bool:
        vis = vis & attn_mask
    elif attn_mask is not None:  # additive: -inf hides a key
        bias = np.asarray(attn_mask, np.float64)
        vis = vis & (bias != -np.inf)
    d = query.shape[-1]
    return _attend(
        query, key, value, vis, 1 / math.sqrt(d) if scale is None or own_scale else scale, bias, softcap
    )


def correct(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """torch's SDPA signature on NumPy arrays, as the spec defines it (bool masks)."""
    return _sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa)


def two_bugs(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Two independent bugs the drawn cases find one after the other: GQA heads tiled (h % Hkv
    instead of h // G), and the scale argument ignored."""
    return _sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, tiled=True, own_scale=True)


def attention(q, k):
    """Cannot be called the way torch_sdpa calls (three arrays): a wrapper bug a new user makes."""
    return q


def prefix_masks_only(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A textbook valid_lens attention: only key-padding (prefix) masks; any other mask raises."""
    if attn_mask is not None:
        full = np.broadcast_to(attn_mask, attn_mask.shape[:-1] + (attn_mask.shape[-1],))
        lens = full.sum(axis=-1, keepdims=True)
        if not np.array_equal(full, np.arange(full.shape[-1]) < lens):
            raise ValueError("valid_lens attention takes key-padding masks only")
    return _sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa)


def four_d_only(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """A library that unpacks four axes and takes full-size masks only (paddle's habit)."""
    b, h, n, _ = query.shape  # "too many values to unpack" on any other rank
    if attn_mask is not None and attn_mask.shape != (b, h, n, key.shape[-2]):
        raise ValueError(f"attn_mask must be (B, H, n, m), got {attn_mask.shape}")
    return _sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa)


def capped(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **keywords):
    """torch's SDPA signature plus a logit softcap (cap * tanh(s / cap), before the mask)."""
    enable_gqa, softcap = keywords.pop("enable_gqa", False), keywords.pop("softcap", None)
    if keywords:
        raise TypeError(f"capped() got unexpected keyword arguments {sorted(keywords)}")
    return _sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, softcap=softcap)
