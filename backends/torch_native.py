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
batch broadcasting are passed as they are (torch accepts both). ``dropout_p`` without a
``dropout_mask`` (``dropout_drawn``) is passed to torch as it is: torch draws the mask, and the
suite judges the draws statistically (`attnspec.conformance.test_dropout`).

``mha`` is `torch.nn.MultiheadAttention` called as a user calls it (see `_mha_module`); what the
module has no argument for is refused by `supports` (`mha_refusals`), and its three deviations
(``torch.mha-mask-polarity``, ``torch.mha-empty-row-nan``, ``torch.mha-weights-head-averaged``)
are declared.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from attnspec.backends import _mha
from attnspec.backends._common import variant_keywords, with_mask_and_bias
from attnspec.backends.base import Unsupported
from attnspec.backends.torch import TorchArrays, _lengths_to_numpy, drawn_dropout_p, structural_visibility
from attnspec.spec.options import take, with_options

__all__ = ["TorchNativeBackend"]


class TorchNativeBackend(TorchArrays):
    """torch SDPA called directly; its deviations from the spec are measured, not repaired."""

    name = "torch-native"
    variants = frozenset({"dropout_drawn"})  # dropout_p, drawn by torch (sdpa only)

    def supports(self, feature: str, **case) -> list[str]:
        reasons = super().supports(feature, **case)
        if feature in ("mha", "mha_vjp"):  # mha_vjp differentiates the same module call
            return reasons + ([] if case.get("bad_input") else mha_refusals(case))
        if case.get("return_weights"):
            reasons.append("torch SDPA returns no attention weights")
        return reasons

    @with_options()
    def sdpa(self, q, k, v, **options):
        o = take("torch-native.sdpa", options)
        variants = variant_keywords(o)
        drawn_p = drawn_dropout_p("torch-native.sdpa", variants)  # validated; torch draws the mask
        p = self._plan_of("torch-native.sdpa", q, k, v, {**o, **variants})  # variants: p taken out when drawn
        mask, bias, causal, return_weights = o["mask"], o["bias"], o["causal"], o["return_weights"]
        # torch's F.scaled_dot_product_attention has no softcap, ALiBi, sinks, logsumexp, segment
        # ids or lengths-aligned causal argument, and takes no given dropout mask: a native
        # backend measures, so it refuses rather than emulates them
        self.refuse_variants("sdpa", {**variants, "causal": causal})
        if return_weights:
            raise Unsupported("torch-native.sdpa: torch SDPA returns no attention weights")
        kw = {"scale": p.scale, "enable_gqa": p.hq != p.hkv}  # Hq = 0 needs it too (torch checks heads)
        if drawn_p:
            kw["dropout_p"] = drawn_p
        structural_only = (
            mask is None
            and bias is None
            and p.window is None
            and p.q_lengths is None
            and p.kv_lengths is None
        )
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

    @with_options()
    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, **options):
        """`torch.nn.MultiheadAttention` (batch_first=True) as a user calls it; see `_mha_module`."""
        fn = "torch-native.mha"
        o = take(fn, options)
        mask, bias, return_weights = o["mask"], o["bias"], o["return_weights"]
        options = {name: o[name] for name in ("causal", "window", "scale", "q_lengths", "kv_lengths")}
        p = _mha.validate(
            fn, self._info, _lengths_to_numpy, (query, key, value, params, num_heads, num_kv_heads), o
        )
        # the module has none of the variants (its dropout draws its own mask): refused, not emulated
        self.refuse_variants("mha", o)
        prm = _mha.arrays_of(self, params, p.dtype, str(query.device))
        biases = [getattr(prm, name) is not None for name in ("b_q", "b_k", "b_v", "b_o")]
        reasons = mha_refusals(
            {
                **options,
                "num_heads": num_heads,
                "num_kv_heads": num_kv_heads,
                "mask": mask,
                "bias": bias,
                "param_biases": "all" if all(biases) else "some" if any(biases) else "none",
            }
        )
        if reasons:
            raise Unsupported(f"{fn}: " + "; ".join(reasons))
        return _mha_module(p, query, key, value, prm, mask, bias, return_weights)


def mha_refusals(case: dict) -> list[str]:
    """What `torch.nn.MultiheadAttention` has no argument for, in an mha case's options."""
    module = "torch.nn.MultiheadAttention"
    why = []
    heads, kv_heads = case.get("num_heads"), case.get("num_kv_heads")
    if kv_heads is not None and kv_heads != heads:
        why.append(f"{module} has no grouped key/value heads (num_kv_heads != num_heads)")
    if case.get("param_biases") == "some":
        why.append(f"{module} has biases on all four projections or none")
    if case.get("scale") is not None:
        why.append(f"{module} has no scale argument (it always uses 1 / sqrt(head_dim))")
    if case.get("window") is not None:
        why.append(f"{module} has no sliding-window option")
    if case.get("q_lengths") is not None:
        why.append(f"{module} has no query padding (key_padding_mask pads keys)")
    if case.get("causal") == "lower_right":
        why.append(f"{module}'s is_causal is upper-left only")
    if case.get("mask") is not None and case.get("bias") is not None:
        why.append(f"{module} takes one attn_mask: a boolean mask and a float bias cannot both be given")
    if case.get("causal") is not None and (case.get("mask") is not None or case.get("bias") is not None):
        why.append(f"{module} takes one attn_mask, and is_causal says it is the causal mask")
    return why


@functools.lru_cache(maxsize=32)
def _module(embed_dim: int, num_heads: int, kdim: int, vdim: int, bias: bool, dtype) -> torch.nn.Module:
    # On the meta device: functional_call supplies every parameter, so none is allocated here.
    return torch.nn.MultiheadAttention(
        embed_dim, num_heads, bias=bias, kdim=kdim, vdim=vdim, batch_first=True, device="meta", dtype=dtype
    )


def _mha_module(p, query, key, value, prm, mask, bias, return_weights):
    """Call torch.nn.MultiheadAttention the way a user would.

    The module gets the parameters through `torch.func.functional_call` (so autograd reaches
    them), in torch's state-dict names: packed ``in_proj_weight`` when kdim == vdim == E, else
    ``q/k/v_proj_weight``. Batch dims are broadcast and flattened into torch's one batch axis
    (rank-2 inputs stay unbatched). ``mask`` (bool) or ``bias`` (float) is passed as
    ``attn_mask`` as it is, reshaped to torch's (n, m) or (B * H, n, m); ``kv_lengths`` becomes
    ``key_padding_mask`` (True = padding, torch's convention); upper-left causal becomes
    ``is_causal=True`` with the causal mask torch requires beside it (True = blocked);
    ``need_weights=return_weights`` with torch's default head averaging.
    """
    from torch.func import functional_call

    e, h = prm.embed_dim, p.hq
    dt = query.dtype
    packed = prm.kdim == e and prm.vdim == e
    state = {"out_proj.weight": prm.w_o.to(dt)}
    if packed:
        state["in_proj_weight"] = torch.cat([prm.w_q, prm.w_k, prm.w_v]).to(dt)  # (3E, E)
    else:
        state.update(q_proj_weight=prm.w_q.to(dt), k_proj_weight=prm.w_k.to(dt), v_proj_weight=prm.w_v.to(dt))
    if prm.b_q is not None:
        state["in_proj_bias"] = torch.cat([prm.b_q, prm.b_k, prm.b_v]).to(dt)  # (3E,)
        state["out_proj.bias"] = prm.b_o.to(dt)
    module = _module(e, h, prm.kdim, prm.vdim, prm.b_q is not None, dt)

    batched = len(p.batch) > 0
    size = math.prod(p.batch)

    def flat(x, length):  # (..., L, F) -> (B, L, F); unbatched (L, F) stays
        return x.expand(*p.batch, length, x.shape[-1]).reshape(size, length, x.shape[-1]) if batched else x

    kw = {"need_weights": return_weights}
    attn = mask if mask is not None else bias
    if attn is not None:
        if attn.ndim <= 2:
            attn = attn.expand(p.n, p.m)  # (n, m), shared by every batch element and head
        else:
            attn = attn.expand(*p.batch, h, p.n, p.m).reshape(-1, p.n, p.m)  # (B * H, n, m)
        kw["attn_mask"] = attn
    elif p.causal == "upper_left":
        # True = blocked
        kw["attn_mask"] = torch.ones(p.n, p.m, dtype=torch.bool, device=query.device).triu(1)
        kw["is_causal"] = True
    if p.kv_lengths is not None:
        lengths = torch.from_numpy(np.ascontiguousarray(p.kv_lengths)).to(query.device).reshape(-1, 1)
        padding = torch.arange(p.m, device=query.device) >= lengths  # (B, m), True = padding
        kw["key_padding_mask"] = padding if batched else padding[0]
    out, weights = functional_call(module, state, (flat(query, p.n), flat(key, p.m), flat(value, p.m)), kw)
    out = out.reshape(*p.batch, p.n, e)
    if not return_weights:
        return out
    return out, weights.reshape(*p.batch, *weights.shape[-2:])  # averaged over heads: (..., n, m)
