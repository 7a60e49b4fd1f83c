"""Functions with the built-in conventions' signatures, for the conventions' mutation run.

Each ``<convention>_ok`` decodes its convention's arguments (layouts, packed sequences, block
tables, FlashAttention's alignment, vLLM's sliding window) and computes what a correct function of
that signature returns, through the reference sdpa (reference_sdpa.py). A convention mutant is
killed when the suite fails such a correct function through it. The known-wrong twins are
``<convention>_tiled_gqa`` (query head h reads kv head h % Hkv instead of h // G) and, where the
function takes a mask, ``<convention>_fill_1e9`` (a hidden key gets the logit -1e9, so a row that
sees no key averages V instead of giving 0); besides, ``torch_sdpa_causal_lower_right`` (is_causal
on FlashAttention's diagonal, where PyTorch's is upper-left), ``tutorial_three_values`` (a third
value past the tutorial's (output, weights)), ``tutorial_4d_only`` (refuses arrays that are not
4-D, as only ``+canonical`` may assume), and ``jax_ignores_lengths`` / ``jax_ignores_window``
(take jax's length and window arguments and drop them, which a convention that folds those into
the mask instead would hide). A convention mutant is killed too when the suite
passes one of them through it, since the convention then hides a wrong function.

Four more kinds of subject reach code the built-in conventions' plain calls leave alone: the
``NAME+canonical`` conventions (paddle's canonical inputs: ``<convention>_canonical_ok`` refuses an
array that is not 4-D or a mask with a size-1 axis, as such a library does), and a convention
made with ``Convention.extend`` that passes the spec's softcap and sinks through keywords
(``TORCH_SDPA_KEYWORDS``; its wrong twin takes sinks and ignores them), and the atlas's ``keras``
convention (jax's with no lengths or window arguments: ``keras_ok`` has no such keywords).
``tutorial_ok`` multiplies as the tutorial does (Q @ K^T), so K and V with fewer heads than Q work
only when they have one.

The arrays are NumPy's (``--arrays numpy``). These functions are not mutated.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np


def _load_reference():
    path = Path(__file__).with_name("reference_sdpa.py")
    spec = importlib.util.spec_from_file_location("attnspec_mutation_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.sdpa


sdpa = _load_reference()


# -- the FlashAttention family: one sequence at a time -----------------------------------------


def _one_sequence(q, k, v, offset, causal, window, softcap, slopes, scale):
    """q (n, Hq, dk), k (m, Hkv, dk), v (m, Hkv, dv) of one sequence, FlashAttention's rules:
    causal, window and ALiBi anchored at i + offset; window -1 = unbounded. (out (n, Hq, dv),
    lse (Hq, n))."""
    n, m = q.shape[0], k.shape[0]
    anchor = np.arange(n)[:, None] + offset
    j = np.arange(m)[None, :]
    vis = np.ones((n, m), bool)
    if causal:
        vis &= j <= anchor
    left, right = (-1, -1) if window is None else window
    if left >= 0:
        vis &= j >= anchor - left
    if right >= 0:
        vis &= j <= anchor + right
    bias = None
    if slopes is not None:
        bias = -np.asarray(slopes, np.float64).reshape(-1)[:, None, None] * np.abs(anchor - j)[None]
    out, lse = sdpa(
        q.transpose(1, 0, 2),
        k.transpose(1, 0, 2),
        v.transpose(1, 0, 2),
        mask=vis,
        bias=bias,
        scale=scale,
        softcap=softcap or None,
        return_lse=True,
    )
    return out.transpose(1, 0, 2), lse


def _slopes_row(alibi_slopes, row):
    if alibi_slopes is None:
        return None
    s = np.asarray(alibi_slopes)
    return s[row] if s.ndim == 2 else s


#: FlashAttention's keywords these references take, with its defaults, in `_one_sequence`'s order
FLASH_KEYWORDS = {
    "causal": False,
    "window_size": (-1, -1),
    "softcap": 0.0,
    "alibi_slopes": None,
    "softmax_scale": None,
}


def _keywords(fn, keywords, defaults=FLASH_KEYWORDS):
    """The call's values of ``defaults``' keywords, in its order (FlashAttention's: causal,
    window_size, softcap, alibi_slopes, softmax_scale); another keyword is refused as Python
    refuses it."""
    for name in keywords:
        if name not in defaults:
            raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}")
    return tuple(keywords.get(name, default) for name, default in defaults.items())


def flash_ok(q, k, v, return_attn_probs=False, **keywords):
    """flash_attn_func: q, k, v (B, L, H, d)."""
    keys = _keywords("flash_ok", keywords)
    result = _each_sequence(q, lambda b: (k[b], v[b], k.shape[1]), v.shape[-1], *keys, return_attn_probs)
    return (*result, None) if return_attn_probs else result


def flash_kvcache_ok(q, k_cache, v_cache, cache_seqlens=None, return_softmax_lse=False, **keywords):
    """flash_attn_with_kvcache, contiguous: caches (B, m, Hkv, d), ``cache_seqlens`` keys of each used."""

    def sequence(b):
        length = k_cache.shape[1] if cache_seqlens is None else int(cache_seqlens[b])
        return k_cache[b, :length], v_cache[b, :length], length

    keys = _keywords("flash_kvcache_ok", keywords)
    return _each_sequence(q, sequence, v_cache.shape[-1], *keys, return_softmax_lse)


def _each_sequence(q, sequence, dv, causal, window_size, softcap, alibi_slopes, softmax_scale, return_lse):
    """A (B, n, H, d) query against each batch entry's keys: ``sequence(b)`` -> (k, v, length)."""
    n = q.shape[1]
    outs, lses = [], []
    for b in range(q.shape[0]):
        k, v, length = sequence(b)
        slopes = _slopes_row(alibi_slopes, b)
        o, lse = _one_sequence(q[b], k, v, length - n, causal, window_size, softcap, slopes, softmax_scale)
        outs.append(o)
        lses.append(lse)
    out = np.stack(outs) if outs else np.zeros((0, n, q.shape[2], dv), q.dtype)
    if not return_lse:
        return out
    return out, (np.stack(lses) if lses else np.zeros((0, q.shape[2], n), np.float32))


def flash_varlen_ok(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, return_attn_probs=False, **keywords
):
    """flash_attn_varlen_func: sequences packed along the first axis, bounded by cu_seqlens."""
    causal, window_size, softcap, alibi_slopes, softmax_scale = _keywords("flash_varlen_ok", keywords)
    cu_q, cu_k = np.asarray(cu_seqlens_q), np.asarray(cu_seqlens_k)
    # FlashAttention sizes its grid by the maxima and picks its decode path when max_seqlen_q is 1:
    # they must be the batch's longest sequences
    for name, cu, given in (("max_seqlen_q", cu_q, max_seqlen_q), ("max_seqlen_k", cu_k, max_seqlen_k)):
        longest = int(np.diff(cu).max(initial=0))
        if given != longest:
            raise ValueError(f"{name}={given}, but the longest sequence in its cu_seqlens has {longest}")
    out = np.zeros((q.shape[0], q.shape[1], v.shape[-1]), q.dtype)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf, np.float64 if q.dtype == np.float64 else np.float32)
    for s in range(len(cu_q) - 1):
        qs, ks = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        o, l_ = _one_sequence(
            q[qs],
            k[ks],
            v[ks],
            (cu_k[s + 1] - cu_k[s]) - (cu_q[s + 1] - cu_q[s]),
            causal,
            window_size,
            softcap,
            _slopes_row(alibi_slopes, s),
            softmax_scale,
        )
        out[qs] = o
        lse[:, qs] = l_
    return (out, lse, None) if return_attn_probs else out


def _gather(cache, table_row, length):
    """The first ``length`` keys of a sequence from its block table: (length, H, d)."""
    size = cache.shape[1]
    blocks = [int(x) for x in table_row[: -(-length // size)]]
    rows = cache[blocks].reshape(-1, *cache.shape[2:]) if blocks else cache[:0, 0]
    return rows[:length]


def flash_kvcache_paged_ok(
    q, k_cache, v_cache, cache_seqlens=None, block_table=None, return_softmax_lse=False, **keywords
):
    """flash_attn_with_kvcache, paged: pools (num_blocks, block_size, Hkv, d) read through block_table."""

    def sequence(b):
        length = int(cache_seqlens[b])
        return _gather(k_cache, block_table[b], length), _gather(v_cache, block_table[b], length), length

    keys = _keywords("flash_kvcache_paged_ok", keywords)
    return _each_sequence(q, sequence, v_cache.shape[-1], *keys, return_softmax_lse)


def vllm_paged_ok(query, key_cache, value_cache, query_lens, kv_lens, block_tables, scale, **keywords):
    """ref_paged_attn: queries packed by query_lens, pools read through block_tables, always causal."""
    sliding_window, soft_cap = _keywords(
        "vllm_paged_ok", keywords, {"sliding_window": None, "soft_cap": None}
    )
    out = np.zeros((query.shape[0], query.shape[1], value_cache.shape[-1]), query.dtype)
    start = 0
    for b, (nq, nk) in enumerate(zip(query_lens, kv_lens)):
        window = None if sliding_window is None else (sliding_window - 1, -1)
        o, _ = _one_sequence(
            query[start : start + nq],
            _gather(key_cache, block_tables[b], nk),
            _gather(value_cache, block_tables[b], nk),
            nk - nq,
            True,
            window,
            soft_cap,
            None,
            scale,
        )
        out[start : start + nq] = o
        start += nq
    return out


# -- functions that take a mask ------------------------------------------------------------------


def torch_sdpa_ok(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    return _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, **spec_keywords):
    """PyTorch's rules for torch_sdpa's arguments; ``spec_keywords`` go to the reference as they are."""
    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p}: this function draws no dropout")
    if attn_mask is not None and is_causal:
        raise ValueError("attn_mask and is_causal cannot both be set (PyTorch raises)")
    # PyTorch compares head counts only when both have a head axis: a rank-2 key broadcasts
    if query.ndim >= 3 and key.ndim >= 3 and query.shape[-3] != key.shape[-3] and not enable_gqa:
        raise ValueError(f"query has {query.shape[-3]} heads, key {key.shape[-3]}: GQA needs enable_gqa=True")
    mask = bias = None
    if attn_mask is not None:
        if attn_mask.dtype == np.bool_:
            mask = attn_mask
        else:
            bias = attn_mask
    causal = "upper_left" if is_causal else None
    return sdpa(query, key, value, mask=mask, bias=bias, causal=causal, scale=scale, **spec_keywords)


def jax_ok(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale=None,
    is_causal=False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size=None,
):
    window = local_window_size
    if isinstance(window, int):
        window = (window, window)
    q, k, v = (x.swapaxes(1, 2) for x in (query, key, value))  # (B, T, N, H) -> (B, N, T, H)
    out = sdpa(
        q,
        k,
        v,
        mask=mask,
        bias=bias,
        scale=scale,
        causal="upper_left" if is_causal else None,
        window=None if window is None else tuple(window),
        q_lengths=None if query_seq_lengths is None else np.asarray(query_seq_lengths),
        kv_lengths=None if key_value_seq_lengths is None else np.asarray(key_value_seq_lengths),
    )
    return out.swapaxes(1, 2)


def tutorial_ok(Q, K, V, mask=None):
    # the tutorial's body is Q @ K^T: its leading axes broadcast as matmul's do, heads included, so
    # K and V with fewer heads than Q (GQA) work only when they have one; the convention expands
    # kv heads for it
    for name, x in (("K", K), ("V", V)):
        try:
            np.broadcast_shapes(Q.shape[:-2], x.shape[:-2])
        except ValueError:
            raise ValueError(
                f"Q @ {name}^T: leading axes {Q.shape[:-2]} and {x.shape[:-2]} do not broadcast"
            ) from None
    lead = np.broadcast_shapes(Q.shape[:-2], K.shape[:-2], V.shape[:-2])
    if 0 in lead:  # no batch element or no head: matmul and softmax give empty results, which the
        # reference's head grouping (Hq // Hkv with no kv head) cannot compute
        n, m = Q.shape[-2], K.shape[-2]
        return np.zeros((*lead, n, V.shape[-1]), Q.dtype), np.zeros((*lead, n, m), Q.dtype)
    return sdpa(Q, K, V, mask=None if mask is None else np.asarray(mask).astype(bool), return_weights=True)


# -- the known-wrong twins -------------------------------------------------------------------------


def _tile_heads(x, hq, axis):
    """kv heads repeated whole (h -> h % Hkv), the tiled-GQA bug, along ``axis``."""
    return np.concatenate([x] * (hq // x.shape[axis]), axis=axis) if x.shape[axis] != hq else x


def torch_sdpa_tiled_gqa(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    hq = query.shape[-3] if query.ndim >= 3 else 1
    key, value = (_tile_heads(x, hq, -3) if x.ndim >= 3 else x for x in (key, value))
    return torch_sdpa_ok(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def flash_tiled_gqa(q, k, v, *args, **kwargs):
    return flash_ok(q, _tile_heads(k, q.shape[2], 2), _tile_heads(v, q.shape[2], 2), *args, **kwargs)


def flash_kvcache_tiled_gqa(q, k_cache, v_cache, *args, **kwargs):
    return flash_kvcache_ok(
        q, _tile_heads(k_cache, q.shape[2], 2), _tile_heads(v_cache, q.shape[2], 2), *args, **kwargs
    )


def flash_varlen_tiled_gqa(q, k, v, *args, **kwargs):
    return flash_varlen_ok(q, _tile_heads(k, q.shape[1], 1), _tile_heads(v, q.shape[1], 1), *args, **kwargs)


def flash_kvcache_paged_tiled_gqa(q, k_cache, v_cache, *args, **kwargs):
    return flash_kvcache_paged_ok(
        q, _tile_heads(k_cache, q.shape[2], 2), _tile_heads(v_cache, q.shape[2], 2), *args, **kwargs
    )


def vllm_paged_tiled_gqa(query, key_cache, value_cache, *args, **kwargs):
    return vllm_paged_ok(
        query,
        _tile_heads(key_cache, query.shape[1], 2),
        _tile_heads(value_cache, query.shape[1], 2),
        *args,
        **kwargs,
    )


def jax_tiled_gqa(query, key, value, **kwargs):
    return jax_ok(query, _tile_heads(key, query.shape[2], 2), _tile_heads(value, query.shape[2], 2), **kwargs)


def _filled(mask, bias):
    """A visibility (bool mask, and -inf in an additive one) as -1e9 logits."""
    fill = np.zeros((), np.float64) if bias is None else np.asarray(bias, np.float64)
    if mask is not None:
        fill = np.where(np.asarray(mask).astype(bool), fill, -1e9)
    return np.where(np.isneginf(fill), -1e9, fill)


def torch_sdpa_fill_1e9(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    if attn_mask is not None:
        is_bool = attn_mask.dtype == np.bool_
        attn_mask = _filled(attn_mask if is_bool else None, None if is_bool else attn_mask)
    return torch_sdpa_ok(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def tutorial_three_values(Q, K, V, mask=None):
    """Returns (output, weights, lse): not the tutorial's (output, weights)."""
    out, weights = tutorial_ok(Q, K, V, mask)
    return out, weights, np.log(np.ones(out.shape[:-1]))


def torch_sdpa_causal_lower_right(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """is_causal aligned lower-right (FlashAttention's diagonal), where PyTorch's is upper-left."""
    if not is_causal:
        return torch_sdpa_ok(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    return sdpa(query, key, value, causal="lower_right", scale=scale)


def jax_fill_1e9(query, key, value, bias=None, mask=None, **kwargs):
    if mask is not None or bias is not None:
        bias, mask = _filled(mask, bias), None
    return jax_ok(query, key, value, bias=bias, mask=None, **kwargs)


def jax_ignores_lengths(query, key, value, bias=None, mask=None, **kwargs):
    """Takes query_seq_lengths and key_value_seq_lengths and ignores them: only a convention that
    passes the lengths as those arguments (not folded into the mask) shows it."""
    for name in ("query_seq_lengths", "key_value_seq_lengths"):
        kwargs.pop(name, None)
    return jax_ok(query, key, value, bias=bias, mask=mask, **kwargs)


def jax_ignores_window(query, key, value, bias=None, mask=None, **kwargs):
    """Takes local_window_size and ignores it: only a convention that passes the window as that
    argument (not folded into the mask) shows it."""
    kwargs.pop("local_window_size", None)
    return jax_ok(query, key, value, bias=bias, mask=mask, **kwargs)


def keras_ok(query, key, value, bias=None, mask=None, scale=None, is_causal=False):
    """keras.ops.dot_product_attention's signature: jax's layout and flags, no lengths or window
    arguments (the convention folds them into the mask)."""
    return jax_ok(query, key, value, bias=bias, mask=mask, scale=scale, is_causal=is_causal)


def keras_tiled_gqa(query, key, value, *args, **kwargs):
    return keras_ok(
        query, _tile_heads(key, query.shape[2], 2), _tile_heads(value, query.shape[2], 2), *args, **kwargs
    )


def tutorial_4d_only(Q, K, V, mask=None):
    """Refuses arrays that are not 4-D, as a canonical-input function does: wrong for the plain
    tutorial convention, which passes every rank the spec admits (only ``+canonical`` makes them 4-D)."""
    if any(np.ndim(x) != 4 for x in (Q, K, V)):
        raise ValueError(f"expected 4-D Q, K, V, got shapes {Q.shape}, {K.shape}, {V.shape}")
    return tutorial_ok(Q, K, V, mask)


def tutorial_fill_1e9(Q, K, V, mask=None):
    if mask is None:
        return tutorial_ok(Q, K, V)
    return sdpa(Q, K, V, bias=_filled(mask, None), return_weights=True)


# -- canonical inputs (NAME+canonical): q, k, v always 4-D, every mask full-size -----------------


def _canonical(q, k, v, masks, layout):
    """Refuse what a canonical-input function (paddle's) refuses: an array not 4-D, batch sizes
    that differ, a mask with a size-1 axis. ``layout`` "bhld" or "blhd" (q's axes)."""
    if any(x.ndim != 4 for x in (q, k, v)):
        raise ValueError(f"canonical inputs are 4-D: got q {q.shape}, k {k.shape}, v {v.shape}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise ValueError(f"canonical inputs share their batch size: q {q.shape}, k {k.shape}, v {v.shape}")
    hq, n, m = (
        (q.shape[1], q.shape[2], k.shape[2]) if layout == "bhld" else (q.shape[2], q.shape[1], k.shape[1])
    )
    for name, mask in masks.items():
        if mask is not None and tuple(mask.shape) != (q.shape[0], hq, n, m):
            raise ValueError(
                f"canonical {name} is full-size {(q.shape[0], hq, n, m)}, got {tuple(mask.shape)}"
            )


def torch_sdpa_canonical_ok(query, key, value, attn_mask=None, *args, **kwargs):
    _canonical(query, key, value, {"attn_mask": attn_mask}, "bhld")
    return torch_sdpa_ok(query, key, value, attn_mask, *args, **kwargs)


def torch_sdpa_canonical_tiled_gqa(query, key, value, attn_mask=None, *args, **kwargs):
    _canonical(query, key, value, {"attn_mask": attn_mask}, "bhld")
    return torch_sdpa_tiled_gqa(query, key, value, attn_mask, *args, **kwargs)


def jax_canonical_ok(query, key, value, bias=None, mask=None, **kwargs):
    _canonical(query, key, value, {"mask": mask, "bias": bias}, "blhd")
    return jax_ok(query, key, value, bias=bias, mask=mask, **kwargs)


def jax_canonical_tiled_gqa(query, key, value, bias=None, mask=None, **kwargs):
    _canonical(query, key, value, {"mask": mask, "bias": bias}, "blhd")
    return jax_tiled_gqa(query, key, value, bias=bias, mask=mask, **kwargs)


def tutorial_canonical_ok(Q, K, V, mask=None):
    _canonical(Q, K, V, {"mask": mask}, "bhld")
    return tutorial_ok(Q, K, V, mask)


def tutorial_canonical_fill_1e9(Q, K, V, mask=None):
    _canonical(Q, K, V, {"mask": mask}, "bhld")
    return tutorial_fill_1e9(Q, K, V, mask)


# -- keywords added with Convention.extend ----------------------------------------------------------


def _keywords_convention():
    from attnspec.backends import get_convention

    return get_convention("torch_sdpa").extend(
        "torch_sdpa_keywords", keywords={"softcap": "softcap", "sinks": "sinks"}
    )


#: torch_sdpa plus the spec's softcap and sinks passed through keywords of the same names, as a
#: user's `extend` makes it (README, "Extending a convention")
TORCH_SDPA_KEYWORDS = _keywords_convention()


def _keras_convention():
    from attnspec.backends.conventions.atlas import ATLAS_CONVENTIONS

    return ATLAS_CONVENTIONS["keras"]


#: the atlas's Keras convention: jax's, with lengths and windows folded into the mask (no arguments)
KERAS = _keras_convention()


def torch_sdpa_keywords_ok(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    softcap=None,
    sinks=None,
):
    return _torch_sdpa(
        query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, softcap=softcap, sinks=sinks
    )


def torch_sdpa_keywords_no_sinks(query, key, value, *args, sinks=None, **kwargs):
    """Takes sinks and ignores them."""
    return torch_sdpa_keywords_ok(query, key, value, *args, **kwargs)


#: convention -> (the correct function, the known-wrong ones), by name in this file
SUBJECTS = {
    "tutorial": ("tutorial_ok", ("tutorial_fill_1e9", "tutorial_three_values", "tutorial_4d_only")),
    "torch_sdpa": (
        "torch_sdpa_ok",
        ("torch_sdpa_tiled_gqa", "torch_sdpa_fill_1e9", "torch_sdpa_causal_lower_right"),
    ),
    "flash": ("flash_ok", ("flash_tiled_gqa",)),
    "flash_kvcache": ("flash_kvcache_ok", ("flash_kvcache_tiled_gqa",)),
    "flash_varlen": ("flash_varlen_ok", ("flash_varlen_tiled_gqa",)),
    "flash_kvcache_paged": ("flash_kvcache_paged_ok", ("flash_kvcache_paged_tiled_gqa",)),
    "vllm_paged": ("vllm_paged_ok", ("vllm_paged_tiled_gqa",)),
    "jax": ("jax_ok", ("jax_tiled_gqa", "jax_fill_1e9", "jax_ignores_lengths", "jax_ignores_window")),
    "keras": ("keras_ok", ("keras_tiled_gqa",)),
    "tutorial+canonical": ("tutorial_canonical_ok", ("tutorial_canonical_fill_1e9",)),
    "torch_sdpa+canonical": ("torch_sdpa_canonical_ok", ("torch_sdpa_canonical_tiled_gqa",)),
    "jax+canonical": ("jax_canonical_ok", ("jax_canonical_tiled_gqa",)),
    "torch_sdpa_keywords": ("torch_sdpa_keywords_ok", ("torch_sdpa_keywords_no_sinks",)),
}

#: how a subject names its convention on the command line, where not by its name
CONVENTION_TARGETS = {"torch_sdpa_keywords": f"{__file__}:TORCH_SDPA_KEYWORDS", "keras": f"{__file__}:KERAS"}
