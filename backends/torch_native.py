"""PyTorch as it is: `torch.nn.functional.scaled_dot_product_attention` with no numerical fix-up.

Each spec option maps to the closest native one, so what comes back is what a torch user gets;
where that differs from the spec it is a declared deviation (`attnspec.backends.deviations`).
Arguments are still validated by the spec's rules: refusing bad input is the contract, not a
fix-up.

Mapping: ``causal="upper_left"`` -> ``is_causal=True``; ``"lower_right"`` alone ->
``torch.nn.attention.bias.causal_lower_right(n, m)`` (works on CPU in torch 2.13); any other
combination of causal, window, lengths and ``mask`` -> one boolean ``attn_mask``; ``bias`` ->
a float ``attn_mask``, with a boolean mask folded in by ``where(mask, bias, -inf)`` (the
conversion torch itself applies to boolean masks); GQA -> ``enable_gqa=True``. Rank-2 inputs and
batch broadcasting are passed as they are (torch accepts both).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from attnspec.backends._base import Unsupported
from attnspec.backends._common import with_mask_and_bias
from attnspec.backends.torch import TorchArrays, structural_visibility

__all__ = ["TorchNativeBackend"]


class TorchNativeBackend(TorchArrays):
    """torch SDPA called directly; its deviations from the spec are measured, not repaired."""

    name = "torch-native"

    def supports(self, feature: str, **case) -> list[str]:
        reasons = super().supports(feature, **case)
        if case.get("return_weights"):
            reasons.append("torch SDPA returns no attention weights")
        return reasons

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, return_weights=False):
        p = self._plan("torch-native.sdpa", q, k, v, mask, bias, causal, window, scale,
                       q_lengths, kv_lengths)
        if return_weights:
            raise Unsupported("torch-native.sdpa: torch SDPA returns no attention weights")
        kw = {"scale": p.scale, "enable_gqa": p.group > 1}
        structural_only = (mask is None and bias is None and p.window is None
                           and p.q_lengths is None and p.kv_lengths is None)
        if structural_only and p.causal == "upper_left":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **kw)
        if structural_only and p.causal == "lower_right":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(p.n, p.m), **kw)
        vis = with_mask_and_bias(structural_visibility(p, q.device), mask, None, None)
        attn_mask = vis
        if bias is not None:
            attn_mask = bias if vis is None else torch.where(vis, bias, -math.inf)
        if attn_mask is not None and attn_mask.ndim < 2:  # torch wants (..., n, m)
            attn_mask = attn_mask.expand(p.n, p.m)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)
