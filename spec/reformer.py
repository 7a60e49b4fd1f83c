"""Reformer interop: what Hugging Face's and reformer-pytorch's LSH attention layers compute,
in float64, through the golden LSH of `attnspec.spec.lsh`.

Shape letters as in `attnspec.spec.lsh`, plus: B batch, H heads, hd head dim, D = H * hd.

Both libraries run the spec's algorithm (hash by argmax over [xR, -xR], sort by (round, bucket,
position), attend within chunks, combine rounds by logsumexp) with the differences listed on the
spec page (spec/README.md, "Reformer interop"). Each difference is a switch of the golden's core
(`attnspec.spec._lsh_core._Semantics`), not an option of `lsh_attention`: the golden's public
definition and every backend are unchanged. The rotations are the ones the library draws from
torch's random number generator for the given seed, so torch is needed (the layers are torch
modules anyway). Where a library does something the spec cannot express and this module does
not reproduce (dropout in training, reformer-pytorch's allow_duplicate_attention=False ...), the
function raises `SpecError` naming the setting.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec._lsh_core import SELF_LOGIT, _lsh_core, _Semantics
from attnspec.spec.lsh import LSHPlan

__all__ = ["hf_lsh_self_attention", "lucidrains_lsh_attention"]

#: Hugging Face LSHSelfAttention's float32 constants (its float16 ones are -1e3 and -1e4)
HF_SELF_LOGIT, HF_MASK_LOGIT, HF_KEY_EPS = -1e5, -1e9, 1e-6


def _numpy64(a: Any) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor
        a = a.detach().cpu().double().numpy()
    return np.asarray(a, dtype=np.float64)


def _rotations(shape: tuple[int, ...], seed: int, dtype, device) -> np.ndarray:
    """torch.randn(shape) right after torch.manual_seed(seed), on ``device``, as float64.

    A private generator with the same seed gives the same stream as the global one that the
    libraries use, without touching the caller's random state.
    """
    import torch

    gen = torch.Generator(device=device).manual_seed(int(seed))
    return torch.randn(shape, generator=gen, dtype=dtype, device=device).double().cpu().numpy()


def _buckets(x: np.ndarray, rotations: np.ndarray, factors: list[int]) -> np.ndarray:
    """Buckets (..., nh, L) of x (..., L, d): the spec's hash, factor by factor.

    One factor f is the spec's argmax over [x R_f, -x R_f]; with several (Hugging Face's
    factorized num_buckets), bucket = sum_f argmax_f * prod(earlier factors), each factor using
    the next f / 2 columns of the rotations (d, nh, sum f / 2).
    """
    nh = rotations.shape[1]
    buckets = np.zeros((*x.shape[:-2], nh, x.shape[-2]), np.int64)
    col, product = 0, 1
    for f in factors:
        r = rotations[:, :, col : col + f // 2]  # (d, nh, f / 2)
        p = np.einsum("...ld,dhk->...hlk", x, r)  # (..., nh, L, f / 2)
        buckets += product * np.argmax(np.concatenate([p, -p], axis=-1), axis=-1)
        col, product = col + f // 2, product * f
    return buckets


def _plan(B: int, L: int, d: int, nh: int, nb: int, C: int, scale: float, causal: bool) -> LSHPlan:
    return LSHPlan(
        batch=(B,),
        L=L,
        d=d,
        dv=d,
        n_hashes=nh,
        n_buckets=nb,
        chunk_length=C,
        dtype="float64",
        scale=scale,
        causal=causal,
        dedup=False,
        kv_lengths=None,
    )


def _hf_num_buckets(layer, L: int) -> int | list[int]:
    """The layer's num_buckets, or what its forward would set it to for length L (without setting it)."""
    if layer.num_buckets is not None:
        return layer.num_buckets
    C = layer.chunk_length
    power = (2 * (L // C)).bit_length() - 1
    limit = 2 * max(int((layer.max_position_embeddings // C) ** 0.5), C)
    return [2 ** (power // 2), 2 ** (power - power // 2)] if 2**power > limit else 2**power


def hf_lsh_self_attention(layer: Any, hidden_states: Any, attention_mask: Any = None) -> np.ndarray:
    """What ``layer(hidden_states, attention_mask).hidden_states`` computes, in float64.

    Args:
        layer: a ``transformers.models.reformer.modeling_reformer.LSHSelfAttention`` with
            ``config.hash_seed`` set (otherwise its rotations come from torch's global state).
            Its weights are read in float64; in training mode its dropout must be 0.
        hidden_states: (B, L, D), a torch tensor or array.
        attention_mask: None or (B, L), nonzero = a real token, 0 = padding.

    Returns:
        (B, L, H * hd) float64: the attention output with heads merged, before any output dense
        (LSHSelfAttention has none). The differences from `attnspec.spec.lsh_attention` that this
        reproduces are listed on the spec page: per-head rotations (H, hd, nh, nb / 2) from
        ``torch.manual_seed(hash_seed)`` in the layer's dtype; keys x * rsqrt(mean(x^2) + 1e-6) /
        sqrt(hd) and logit scale 1; ``lsh_num_chunks_before`` / ``_after`` chunks each side; padded
        tokens sort last (bucket nb, as in the spec) but, as queries, still attend to the real keys
        of their windows; self logit -1e5 and mask logit -1e9 (finite); factorized num_buckets;
        and, when L <= chunk_length, plain full attention with the same masks and no hashing.
    """
    fn = "hf_lsh_self_attention"
    if getattr(layer, "hash_seed", None) is None:
        raise SpecError(
            f"{fn}: layer.hash_seed=None: the layer draws its rotations from torch's global "
            "random state; set config.hash_seed to an int to make them reproducible"
        )
    if layer.training and layer.dropout > 0:
        raise SpecError(f"{fn}: layer.dropout={layer.dropout} in training mode is random; call layer.eval()")
    H, hd, nh, C = layer.num_attention_heads, layer.attention_head_size, layer.num_hashes, layer.chunk_length
    weight = layer.query_key.weight
    h = _numpy64(hidden_states)  # (B, L, D)
    if h.ndim != 3 or h.shape[-1] != layer.hidden_size:
        raise SpecError(f"{fn}: hidden_states.shape={h.shape} must be (B, L, {layer.hidden_size})")
    B, L, _ = h.shape
    w_qk, w_v = _numpy64(weight), _numpy64(layer.value.weight)  # (H * hd, D) each
    qk = (h @ w_qk.T).reshape(B, L, H, hd).transpose(0, 2, 1, 3).reshape(B * H, L, hd)  # (B * H, L, hd)
    v = (h @ w_v.T).reshape(B, L, H, hd).transpose(0, 2, 1, 3).reshape(B * H, L, hd)  # (B * H, L, hd)
    valid = np.ones((B * H, L), bool)
    if attention_mask is not None:
        mask = _numpy64(attention_mask) != 0
        if mask.shape != (B, L):
            raise SpecError(f"{fn}: attention_mask.shape={mask.shape} must be (B, L) = {(B, L)}")
        valid = np.repeat(mask, H, axis=0)  # (B * H, L)
    sem = _Semantics(
        before=layer.num_chunks_before,
        after=layer.num_chunks_after,
        key_eps=HF_KEY_EPS,
        mask_queries=False,
        mask_value=HF_MASK_LOGIT,
        self_logit=HF_SELF_LOGIT,
        self_over_mask=True,
        zero_invalid_rows=False,
    )
    if L <= C:  # HF skips hashing: full attention, which is one chunk of one round holding everything
        plan = _plan(B * H, L, hd, 1, 2, L, 1.0, bool(layer.is_decoder))
        sem = _Semantics(**{**sem.__dict__, "before": 0, "after": 0})
        buckets = np.zeros((B * H, 1, L), np.int64)
    else:
        if L % C:
            raise SpecError(
                f"{fn}: L={L} must be a multiple of layer.chunk_length={C} (as the layer requires)"
            )
        n_buckets = _hf_num_buckets(layer, L)
        factors = [n_buckets] if isinstance(n_buckets, int) else list(n_buckets)
        rot = _rotations((H, hd, nh, sum(factors) // 2), layer.hash_seed, weight.dtype, weight.device)
        buckets = np.stack(
            [_buckets(qk.reshape(B, H, L, hd)[:, i], rot[i], factors) for i in range(H)], axis=1
        ).reshape(B * H, nh, L)  # (B * H, nh, L)
        plan = _plan(B * H, L, hd, nh, math.prod(factors), C, 1.0, bool(layer.is_decoder))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        out, _ = _lsh_core(plan, qk, v, None, buckets, sem, valid)  # (B * H, L, hd)
    return out.reshape(B, H, L, hd).transpose(0, 2, 1, 3).reshape(B, L, H * hd)  # (B, L, H * hd)


def lucidrains_lsh_attention(module: Any, qk: Any, v: Any, seed: int, input_mask: Any = None) -> np.ndarray:
    """What ``torch.manual_seed(seed); module(qk, v, input_mask=input_mask)[0]`` computes, in float64.

    Args:
        module: a ``reformer_pytorch.LSHAttention`` with its defaults for rehash_each_round,
            attend_across_buckets and allow_duplicate_attention; dropout 0 (or eval mode).
        qk: (B, L, d) torch tensor, the shared queries/keys; L divisible by 2 * bucket_size.
            Its dtype and device decide the rotations torch draws.
        v: (B, L, d).
        seed: the seed set right before the forward (its first random draw is the rotations).
        input_mask: None or (B, L') bool, L' <= L (padded with True as the module does).

    Returns:
        (B, L, d) float64. With no input_mask this is exactly `attnspec.spec.lsh_attention` with
        chunk_length = bucket_size, n_buckets = L / bucket_size, scale = d ** -0.5 and the drawn
        rotations (d, nh, nb / 2). With one (differences on the spec page): masked positions keep
        their hash and their place in the sort; masked keys get logit -finfo(dtype).max; a masked
        query's row holds only itself (self logit -5e4 replaces the mask), so it outputs v there.
    """
    fn = "lucidrains_lsh_attention"
    for attr, want in (
        ("_rehash_each_round", True),
        ("_attend_across_buckets", True),
        ("_allow_duplicate_attention", True),
        ("_random_rotations_per_head", False),
    ):
        if getattr(module, attr) is not want:
            raise SpecError(f"{fn}: module.{attr[1:]}={getattr(module, attr)} is not supported (only {want})")
    if module.training and (module.dropout.p > 0 or module.dropout_for_hash.p > 0):
        raise SpecError(f"{fn}: dropout in training mode is random; set it to 0 or call module.eval()")
    import torch

    t = qk if isinstance(qk, torch.Tensor) else torch.as_tensor(np.asarray(qk))
    x, vv = _numpy64(qk), _numpy64(v)  # (B, L, d) each
    if x.ndim != 3 or vv.shape != x.shape:
        raise SpecError(f"{fn}: qk.shape={x.shape} and v.shape={vv.shape} must be one (B, L, d) shape")
    B, L, d = x.shape
    C, nh = module.bucket_size, module.n_hashes
    if L % (2 * C):
        raise SpecError(
            f"{fn}: L={L} must be divisible by 2 * bucket_size = {2 * C} (as the module requires)"
        )
    nb = L // C
    rot = _rotations((1, d, nh, nb // 2), seed, t.dtype, t.device)[0]  # (d, nh, nb / 2)
    valid = np.ones((B, L), bool)
    if input_mask is not None:
        m = np.asarray(input_mask.cpu() if hasattr(input_mask, "cpu") else input_mask).astype(bool)
        if m.ndim != 2 or m.shape[0] != B or m.shape[1] > L:
            raise SpecError(f"{fn}: input_mask.shape={m.shape} must be (B, L') with L' <= L = {L}")
        valid = np.concatenate([m, np.ones((B, L - m.shape[1]), bool)], axis=1)  # (B, L)
    sem = _Semantics(
        pad_bucket=False,
        mask_value=-float(torch.finfo(t.dtype).max),
        self_logit=SELF_LOGIT,
        self_over_mask=True,
        zero_invalid_rows=False,
    )
    plan = _plan(B, L, d, nh, nb, C, d**-0.5, bool(module.causal))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        out, _ = _lsh_core(plan, x, vv, None, _buckets(x, rot, [nb]), sem, valid)
    return out  # (B, L, d)
