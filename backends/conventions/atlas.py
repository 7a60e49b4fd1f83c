"""Calling conventions of the atlas' outside implementations (see `attnspec.backends.conventions`
for the contract and the built-in ones). Each passes a spec option through the implementation's
own argument where it has one, folds the rest into its mask where it has one, and refuses what
it cannot express. Nothing here corrects a result.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Any, ClassVar

import numpy as np

from attnspec.backends.authoring import additive_mask, attend_mask, flatten_mask, unflatten_batch
from attnspec.backends.base import Unsupported
from attnspec.backends.conventions import Call, Convention, Jax, TorchSDPA, _device, _first, flat_qkv

__all__ = ["MLX", "Flax", "Flex", "HFEager", "HFSdpa", "Keras", "Onnx", "Paddle", "Pallas", "Tinygrad"]


def _only(options: dict[str, Any], *names: str) -> bool:
    """Whether the call sets none of the spec options but ``names``."""
    rules = ("mask", "bias", "window", "q_lengths", "kv_lengths")
    return all(options.get(o) is None for o in rules if o not in names)


def _full(p, x: np.ndarray) -> np.ndarray:
    """A mask broadcasting to (*batch, Hq, n, m) -> (B, Hq or 1, n, m), as contiguous NumPy."""
    return np.ascontiguousarray(flatten_mask(p, x))


class MLX(Convention):
    name = "mlx"
    signature = (
        "fn(q, k, v, *, scale, mask=None, sinks=None) on (B, H, L, D) arrays; mask 'causal' "
        "(lower-right), bool (True = attend) or additive; sinks (Hq,)"
    )
    arrays = "mlx"
    cannot: ClassVar[dict[str, str | None]] = {"return_weights": "returns no attention weights"}
    causal_flag = "lower_right"
    variants = frozenset({"sinks"})  # sinks=(Hq,): a logit in every row's denominator, no value

    def call(self, fn, lib, p, q, k, v, options):
        qf, kf, vf = flat_qkv(p, q, k, v)  # (B, Hq, n, dk), (B, Hkv, m, dk), (B, Hkv, m, dv)
        kw: dict[str, Any] = {"scale": p.scale}
        if options.get("sinks") is not None:
            kw["sinks"] = options["sinks"]  # (Hq,), q's dtype: MLX's own argument
        square = p.n == p.m
        if _only(options) and (p.causal == "lower_right" or (p.causal == "upper_left" and square)):
            kw["mask"] = "causal"  # MLX's causal string is lower-right aligned
        elif options.get("bias") is not None:
            full = additive_mask(p, options.get("mask"), options["bias"])
            assert full is not None  # additive_mask is None only when there is neither a mask nor a bias
            kw["mask"] = lib.asarray(_full(p, full))
        else:
            vis = attend_mask(p, options.get("mask"))
            if vis is not None:
                kw["mask"] = lib.asarray(_full(p, vis))
        return unflatten_batch(p, _first(fn(qf, kf, vf, **kw))), None


class Tinygrad(TorchSDPA):
    name = "tinygrad"
    signature = (
        "Tensor.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, "
        "is_causal=False, enable_gqa=False) on (..., H, L, D); no scale argument"
    )
    arrays = "tinygrad"
    cannot: ClassVar[dict[str, str | None]] = {
        **TorchSDPA.cannot,
        "scale": "has no scale argument (always 1/sqrt(dk))",
    }
    # measured before torch_sdpa folded lower_right_lengths and segment ids into its mask; kept
    # as measured until the atlas is run again (its committed results hold no such cases)
    variants = frozenset()


class Keras(Jax):
    name = "keras"
    signature = (
        "keras.ops.dot_product_attention(query, key, value, bias=None, mask=None, scale=None, "
        "is_causal=False) on (B, T, N, H); is_causal upper-left"
    )
    lengths_arguments = False
    window_argument = False


class Flax(Jax):
    name = "flax"
    signature = (
        "flax.nnx.dot_product_attention(query, key, value, bias=None, mask=None, ..., "
        "is_causal=False) on (..., L, H, D); no scale argument"
    )
    lengths_arguments = False
    window_argument = False
    cannot: ClassVar[dict[str, str | None]] = {
        **Jax.cannot,
        "scale": "has no scale argument (always 1/sqrt(dk))",
    }


class _HF(Convention):
    """transformers' attention functions: ``fn(module, query, key, value, attention_mask, ...)``.

    The mask is built the way transformers builds it, by `transformers.masking_utils` from a
    mask function (here: the call's visibility), which has no head axis.
    """

    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {
        "bias": "takes a mask, not a bias (transformers' attention functions add only the mask)",
        "scale": None,
    }

    def refusals(self, call: Call) -> list[str]:
        # the base class' refusals, less the needs whose reason is None (carried after all)
        carried = frozenset(n for n in call.needs if self.cannot.get(n, "") is not None)
        return super().refusals(Call(carried, call.n, call.m))

    def _vis(self, p, options):
        vis = attend_mask(p, options.get("mask"))
        if vis is None:
            return None
        full = _full(p, vis)
        if full.shape[1] != 1:
            raise Unsupported(
                f"the {self.name} convention's masks have no head axis (transformers builds (B, 1, n, m))"
            )
        return full

    def _mask(self, p, vis, kind: str, dtype, lib):
        import torch
        from transformers import masking_utils

        table = torch.from_numpy(vis)  # (B, 1, n, m)

        def visible(b, h, q, kv):
            return table[b, 0, q, kv]

        common = dict(batch_size=table.shape[0], q_length=p.n, kv_length=p.m, mask_function=visible)
        if kind == "eager":
            return masking_utils.eager_mask(**common, dtype=dtype)
        return masking_utils.sdpa_mask(**common, allow_is_causal_skip=False)


class HFEager(_HF):
    name = "hf_eager"
    signature = (
        "eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0) "
        "-> (out (B, L, H, D), weights) on (B, H, L, D); additive mask 0 / finfo.min"
    )

    def call(self, fn, lib, p, q, k, v, options):
        qf, kf, vf = flat_qkv(p, q, k, v)  # (B, Hq, n, dk), (B, Hkv, m, dk), (B, Hkv, m, dv)
        vis = self._vis(p, options)
        mask = None if vis is None else self._mask(p, vis, "eager", qf.dtype, lib)
        module = types.SimpleNamespace(num_key_value_groups=p.group, training=False, is_causal=False)
        out, weights = fn(module, qf, kf, vf, mask, scaling=p.scale)
        out = unflatten_batch(p, out, layout="blhd")
        return out, None if weights is None else weights.reshape(p.weights_shape)


class HFSdpa(_HF):
    name = "hf_sdpa"
    signature = (
        "sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, "
        "is_causal=None) -> (out (B, L, H, D), None) on (B, H, L, D); bool mask"
    )
    cannot: ClassVar[dict[str, str | None]] = {**_HF.cannot, "return_weights": "returns no attention weights"}
    causal_flag = "upper_left"  # module.is_causal with no mask: torch's is_causal

    def call(self, fn, lib, p, q, k, v, options):
        qf, kf, vf = flat_qkv(p, q, k, v)  # (B, Hq, n, dk), (B, Hkv, m, dk), (B, Hkv, m, dv)
        causal_flag = p.causal == "upper_left" and _only(options)
        vis = None if causal_flag else self._vis(p, options)
        mask = None if vis is None else self._mask(p, vis, "sdpa", qf.dtype, lib)
        # transformers decides is_causal from the module when no mask is given
        module = types.SimpleNamespace(num_key_value_groups=p.group, training=False, is_causal=causal_flag)
        out = _first(fn(module, qf, kf, vf, mask, scaling=p.scale))
        return unflatten_batch(p, out, layout="blhd"), None


class Flex(Convention):
    name = "flex"
    signature = (
        "flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, "
        "enable_gqa=False, *, return_aux=None) on (B, H, L, D); visibility as mask_mod, bias, "
        "softcap and ALiBi as score_mod, lse through return_aux=AuxRequest(lse=True)"
    )
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {
        "return_weights": "returns no attention weights",
        "sinks": "has no sink argument (a sink is emulated with an extra key or through the lse)",
        "dropout": "has no dropout",
    }
    variants = frozenset({"softcap", "alibi", "lse", "segments", "causal_lower_right_lengths"})

    def call(self, fn, lib, p, q, k, v, options):
        import torch
        from torch.nn.attention.flex_attention import AuxRequest, create_block_mask

        qf, kf, vf = flat_qkv(p, q, k, v)  # (B, Hq, n, dk), (B, Hkv, m, dk), (B, Hkv, m, dv)
        kw: dict[str, Any] = {"scale": p.scale}
        if p.hq != p.hkv:  # GQA, or no query heads at all (Hq = 0: flex checks the head counts)
            kw["enable_gqa"] = True
        dev = _device(lib, q)
        q_ids, kv_ids = options.get("q_segment_ids"), options.get("kv_segment_ids")
        vis = attend_mask(
            p, options.get("mask"), options.get("bias"), q_segment_ids=q_ids, kv_segment_ids=kv_ids
        )
        if vis is not None:
            table = torch.from_numpy(_full(p, vis)).to(dev)  # (B, Hq or 1, n, m)
            per_head = table.shape[1] != 1

            def mask_mod(b, h, qi, kv):
                return table[b, h if per_head else 0, qi, kv]

            kw["block_mask"] = create_block_mask(
                mask_mod, table.shape[0], p.hq if per_head else None, p.n, p.m, device=dev
            )
        mods = []  # score_mod terms in the spec's order: softcap, then bias, then ALiBi
        if p.softcap is not None:
            cap = p.softcap
            mods.append(lambda score, b, h, qi, kv: cap * torch.tanh(score / cap))
        if options.get("bias") is not None:
            bias = flatten_mask(p, options["bias"])  # (B, Hq or 1, n, m)
            bias_heads = bias.shape[1] != 1
            mods.append(lambda score, b, h, qi, kv: score + bias[b, h if bias_heads else 0, qi, kv])
        if options.get("alibi_slopes") is not None:
            slopes, anchor = _alibi_tables(p, lib, options, dev)  # (B, Hq), (B, n): i'
            mods.append(lambda score, b, h, qi, kv: score - slopes[b, h] * (anchor[b, qi] - kv).abs())
        if mods:

            def score_mod(score, b, h, qi, kv):
                for mod in mods:
                    score = mod(score, b, h, qi, kv)
                return score

            kw["score_mod"] = score_mod
        if p.return_lse:
            kw["return_aux"] = AuxRequest(lse=True)
        result = fn(qf, kf, vf, **kw)
        out = unflatten_batch(p, _first(result))
        if not p.return_lse:
            return out, None
        return (out, lib.reshape(result[1].lse, p.lse_shape)), None  # (B, Hq, n) -> spec's


def _alibi_tables(p, lib, options, dev):
    """ALiBi's slopes (B, Hq) in the score's dtype and each query's anchor i' (B, n), the spec's
    (`attnspec.spec.masks.query_anchor`: it follows the causal alignment), as torch tensors."""
    import torch

    from attnspec.spec.masks import query_anchor

    B = math.prod(p.batch)
    slopes = np.broadcast_to(lib.to_numpy(options["alibi_slopes"]), (*p.batch, p.hq)).reshape(B, p.hq)
    ids = [
        None if options.get(o) is None else lib.to_numpy(options[o])
        for o in ("q_segment_ids", "kv_segment_ids")
    ]
    anchor = query_anchor(
        p.n,
        p.m,
        p.causal,
        q_lengths=p.q_lengths,
        kv_lengths=p.kv_lengths,
        q_segment_ids=ids[0],
        kv_segment_ids=ids[1],
    )
    anchor = np.broadcast_to(anchor, (*p.batch, p.n)).reshape(B, p.n)
    dtype = getattr(torch, p.dtype)
    return (
        torch.from_numpy(np.ascontiguousarray(slopes)).to(dev, dtype),
        torch.from_numpy(np.ascontiguousarray(anchor)).to(dev),
    )


class Pallas(Convention):
    name = "pallas"
    signature = (
        "mha(q, k, v, segment_ids, sm_scale=1.0, causal=False, interpret=True) on (B, L, H, D) "
        "(jax.experimental.pallas.ops.gpu.attention)"
    )
    arrays = "jax"
    cannot: ClassVar[dict[str, str | None]] = {
        "mask": "has no mask argument",
        "bias": "has no bias argument",
        "q_lengths": "has no sequence lengths",
        "kv_lengths": "has no sequence lengths",
        "window": "has no window",
        "window_lower_right": "has no window",
        "return_weights": "returns no attention weights",
    }
    causal_flag = "upper_left"

    def refusals(self, call: Call) -> list[str]:
        why = super().refusals(call)
        if call.n != call.m and "causal_lower_right" in call.needs:
            why.append("the pallas convention's causal is upper-left: lower-right differs when n != m")
        return why

    def call(self, fn, lib, p, q, k, v, options):
        qf, kf, vf = flat_qkv(p, q, k, v, "blhd")  # (B, n, Hq, dk), (B, m, Hkv, dk), (B, m, Hkv, dv)
        out = _first(fn(qf, kf, vf, None, sm_scale=p.scale, causal=p.causal is not None, interpret=True))
        return unflatten_batch(p, out, layout="blhd"), None


class Onnx(Convention):
    """ONNX's Attention operator as a one-node model (`attnspec.backends.atlas.onnx_attention`).

    Its causal flag and window sit at query i + offset, where offset = nonpad_kv_seqlen - n (0
    without it). So key lengths go in as ``nonpad_kv_seqlen`` (and causal and window, anchored
    elsewhere then, join the mask), lower-right alignment is ``nonpad_kv_seqlen = m``, and query
    lengths, which the operator has no input for, join the mask.
    """

    name = "onnx"
    signature = (
        "Attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None) "
        "(ONNX opset 28, Attention-25) as a one-node model on (B, H, L, D) NumPy arrays; "
        "attributes is_causal (at i + nonpad_kv_seqlen - n), scale, softcap, left_window_size, "
        "right_window_size, qk_matmul_output_mode=3 (the weights); attn_mask bool (True = attend) "
        "or additive float"
    )
    arrays = "numpy"
    cannot: ClassVar[dict[str, str | None]] = {}
    causal_flag = "upper_left"  # no cache and no nonpad_kv_seqlen: offset 0
    window_argument = True
    variants = frozenset({"softcap"})  # the softcap attribute, applied before the mask as the spec does

    def call(self, fn, lib, p, q, k, v, options):
        qf, kf, vf = flat_qkv(p, q, k, v)  # (B, Hq, n, dk), (B, Hkv, m, dk), (B, Hkv, m, dv)
        B = math.prod(p.batch)
        attrs: dict[str, Any] = {}
        inputs: dict[str, Any] = {}
        if p.kv_lengths is not None:
            inputs["nonpad_kv_seqlen"] = (
                np.broadcast_to(p.kv_lengths, p.batch).reshape(B).astype(np.int64)
            )  # (B,)
            native = False  # the operator would anchor causal and window at i + kv_length - n
        else:
            native = True
            if p.causal == "lower_right" and p.n != p.m:
                inputs["nonpad_kv_seqlen"] = np.full((B,), p.m, np.int64)  # offset m - n: lower-right
        if native and p.causal is not None:
            attrs["is_causal"] = 1
        if native and p.window is not None:
            attrs["left_window_size"], attrs["right_window_size"] = p.window
        if options.get("scale") is not None:
            attrs["scale"] = p.scale
        if p.softcap is not None:
            attrs["softcap"] = p.softcap
        if options.get("return_weights"):
            attrs["qk_matmul_output_mode"] = 3  # post-softmax probabilities
        rest = dataclasses.replace(p, kv_lengths=None)  # what joins the mask: kv lengths are an input
        if options.get("bias") is not None:
            mask = additive_mask(rest, options.get("mask"), options["bias"], structure=not native)
        else:
            mask = attend_mask(rest, options.get("mask"), structure=not native)
        if mask is not None:
            inputs["attn_mask"] = _full(p, mask)  # (B, Hq or 1, n, m)
        result = fn(qf, kf, vf, **inputs, **attrs)
        out = unflatten_batch(p, _first(result))  # (B, Hq, n, dv) -> spec's
        if not options.get("return_weights"):
            return out, None
        return out, lib.reshape(result[1], p.weights_shape)  # (B, Hq, n, m) -> spec's


class Paddle(Convention):
    name = "paddle"
    signature = (
        "paddle.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None, "
        "dropout_p=0.0, is_causal=False, training=True, backend=None, scale=None, enable_gqa=True) "
        "on (B, L, H, D); is_causal upper-left and only alone (a mask given with it is ignored); "
        "attn_mask bool (True = attend) or additive float"
    )
    arrays = "paddle"
    cannot: ClassVar[dict[str, str | None]] = {"return_weights": "returns no attention weights"}
    causal_flag = "upper_left"

    def call(self, fn, lib, p, q, k, v, options):
        qf, kf, vf = flat_qkv(p, q, k, v, "blhd")  # (B, n, Hq, dk), (B, m, Hkv, dk), (B, m, Hkv, dv)
        kw: dict[str, Any] = {}
        if options.get("scale") is not None:
            kw["scale"] = p.scale
        square = p.n == p.m
        if _only(options) and (p.causal == "upper_left" or (p.causal == "lower_right" and square)):
            kw["is_causal"] = True  # alone: paddle ignores attn_mask when is_causal is set
        elif options.get("bias") is not None:
            full = additive_mask(p, options.get("mask"), options["bias"])
            assert full is not None  # additive_mask is None only when there is neither a mask nor a bias
            kw["attn_mask"] = lib.asarray(_full(p, full))
        else:
            vis = attend_mask(p, options.get("mask"))
            if vis is not None:
                kw["attn_mask"] = lib.asarray(_full(p, vis))  # (B, Hq or 1, n, m)
        out = fn(qf, kf, vf, **kw)  # (B, n, Hq, dv); GQA by its default enable_gqa=True (h // G)
        return unflatten_batch(p, out, layout="blhd"), None


ATLAS_CONVENTIONS = {
    c.name: c
    for c in (MLX(), Tinygrad(), Keras(), Flax(), HFEager(), HFSdpa(), Flex(), Pallas(), Onnx(), Paddle())
}
