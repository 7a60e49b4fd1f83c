"""PyTorch, made conformant: `torch.nn.functional.scaled_dot_product_attention` plus fix-ups.

Shape letters as in `attnspec.spec.sdpa`. The fused kernel does the work whenever it gives the
spec's answer; these cases go to the exact path, `attnspec.backends._xp_core` on
array-api-compat's torch namespace (the algorithm jax's exact path and the array API backends
run, written once):

* ``return_weights=True``: the fused kernel returns no weights.
* NaN/inf left in k or v after the cheap fix below: torch's kernels leak a masked key's NaN into
  rows that never see it (deviations ``torch.masked-nonfinite-k`` and
  ``torch.masked-nonfinite-v``). First, keys hidden from *every* query row (padding, the
  usual source of garbage) are zeroed: no row sees them, so their values cannot matter and the
  fused kernel stays exact. A non-finite key that some rows see and others do not cannot be
  zeroed (the rows that see it must get NaN or inf), so those calls take the exact path, which
  drops masked keys with ``where`` like the golden.
* NaN/inf in q: the CPU flash kernel returns 0 for a row whose logits are all NaN, where the
  spec propagates NaN (``torch.nonfinite-query-row-zeroed``).
* the variants of issue #15 that change the softmax itself (softcap, sinks, lse, dropout): torch's
  SDPA has no argument for them. ``dropout_p > 0`` without a ``dropout_mask`` (``dropout_drawn``)
  draws the keep mask here, ``torch.rand(...) >= p`` on q's device (one independent draw per
  weight, from torch's global generator), then takes the exact path with it. Segment ids and
  "lower_right_lengths" are visibility and ALiBi (without softcap) is an additive term, so those
  stay fused, in the mask.

Checking for non-finite values reads three flags back from the device (a sync), on every call.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from attnspec.backends import _mha, _vjp, _xp_core
from attnspec.backends._common import (
    alibi_distance,
    is_empty,
    lengths_column,
    per_sequence_rules,
    spec_visibility,
    to_reference,
    visibility,
    with_mask_and_bias,
)
from attnspec.backends.base import DRAWN_VARIANTS, VARIANT_FEATURES, Backend, variant_features
from attnspec.spec.fp8 import FP8_DTYPES, FP8_NUMPY, validate_fp8
from attnspec.spec.options import ARRAY_NAMES, LSH_OPTIONS, VALUE_NAMES, take, with_options
from attnspec.spec.validate import ArrayInfo, SDPAPlan, check_dropout

__all__ = ["TorchBackend"]


class TorchArrays(_vjp.Autodiff, Backend):
    """Array hooks shared by the ``torch`` and ``torch-native`` backends."""

    def devices(self) -> list[str]:
        found = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
        if torch.backends.mps.is_available():
            found.append("mps")
        return found

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> torch.Tensor:
        if dtype in FP8_DTYPES:  # ml_dtypes' cast: out of e4m3fn's range gives NaN (torch: 448)
            x = np.asarray(x).astype(FP8_NUMPY[dtype])
        else:
            x = to_reference(x, dtype)
        if x.dtype.name in FP8_DTYPES:
            # torch.from_numpy has no FP8; ml_dtypes and torch share the bit layouts, so move bytes
            raw = torch.from_numpy(np.ascontiguousarray(x).view(np.uint8).copy())
            return raw.view(getattr(torch, x.dtype.name)).to(device or "cpu")
        if x.dtype == ml_dtypes.bfloat16:
            # torch.from_numpy has no bfloat16; float32 holds every bfloat16 exactly.
            return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).to(device or "cpu")
        return torch.from_numpy(np.array(x)).to(device or "cpu")  # np.array copies

    def to_numpy(self, x: torch.Tensor) -> np.ndarray:
        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            return x.float().numpy().astype(ml_dtypes.bfloat16)
        name = self.dtype_name(x)
        if name in FP8_DTYPES:
            return x.contiguous().view(torch.uint8).numpy().view(FP8_NUMPY[name])
        return x.numpy()

    def device_of(self, x: torch.Tensor) -> str:
        d = x.device  # named as `devices` names it: "cpu", "cuda:0", "mps" ("meta" for meta tensors)
        return f"{d.type}:{d.index}" if d.type == "cuda" else d.type

    def synchronize(self) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def dtype_name(self, x: torch.Tensor) -> str:
        return str(x.dtype).removeprefix("torch.")  # torch.bfloat16 -> "bfloat16"

    def numerics_policy(self) -> dict[str, object]:
        return torch_numerics_policy()

    array_type = "torch.Tensor"

    def is_array(self, x: object) -> bool:
        return isinstance(x, torch.Tensor)

    _engine = "torch"  # sdpa_vjp, mha_vjp, lsh_attention_vjp: attnspec.backends._vjp.Autodiff

    def supports(self, feature: str, **case) -> list[str]:
        reasons = super().supports(feature, **case)  # _vjp.Autodiff's, then the base class'
        if (
            feature in ("lsh_attention", "lsh_attention_vjp")
            and feature in self.implements
            and importlib.util.find_spec("array_api_compat") is None
        ):
            reasons.append(
                f"{self.name}.{feature} runs on array-api-compat's torch namespace, which is "
                "not installed (pip install 'attnspec[torch]')"
            )
        return reasons

    def variant_refusals(self, feature: str, options: dict) -> list[str]:
        reasons = super().variant_refusals(feature, options)
        drawn = "dropout_drawn" in self.variants and "dropout_drawn" in variant_features(options)
        if drawn and feature != "sdpa":  # mha and the vjps validate p by the spec, which needs a mask
            reasons.append(f"{self.name}.{feature} draws no dropout mask of its own (sdpa does)")
        return reasons


def torch_numerics_policy() -> dict[str, object]:
    """TF32 off for matmuls and cuDNN convolutions; float32 matmuls at full precision."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return {
        "torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "torch.get_float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _lengths_to_numpy(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


def _descale_to_numpy(x):
    """A descale tensor as NumPy for the spec's checks (it is read by value); anything else as it
    is, for the check to judge."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


def with_head(x: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(0) if x.ndim == 2 else x  # (L, d) -> (1, L, d): one head


def structural_visibility(
    p: SDPAPlan, device, q_segment_ids=None, kv_segment_ids=None
) -> torch.Tensor | None:
    if per_sequence_rules(p, q_segment_ids, kv_segment_ids):  # data-dependent anchors: read the ids back
        vis = spec_visibility(p, _ids_to_numpy(q_segment_ids), _ids_to_numpy(kv_segment_ids))
        return None if vis is None else torch.from_numpy(np.ascontiguousarray(vis)).to(device)
    q_len, kv_len = (None if a is None else torch.from_numpy(a).to(device) for a in lengths_column(p))
    return visibility(
        p.n, p.m, p.causal, p.window, q_len, kv_len, lambda size: torch.arange(size, device=device)
    )


def _ids_to_numpy(ids) -> np.ndarray | None:
    return None if ids is None else ids.detach().cpu().numpy()


def alibi_term(p: SDPAPlan, slopes: torch.Tensor, q_segment_ids, kv_segment_ids, dtype) -> torch.Tensor:
    """-slope[h] * |i' - j| in ``dtype``, broadcastable to (*batch, Hq, n, m)."""
    dist = alibi_distance(p, _ids_to_numpy(q_segment_ids), _ids_to_numpy(kv_segment_ids))  # (..., 1, n, m)
    dist = torch.from_numpy(dist).to(device=slopes.device, dtype=dtype)
    return -slopes.to(dtype)[..., :, None, None] * dist  # (..., Hq, n, m)


def drawn_dropout_p(fn: str, variants: dict) -> float:
    """p of a call that asks the backend to draw its own dropout mask (``dropout_p > 0`` without a
    ``dropout_mask``), checked by the spec's rule for p; 0.0 for any other call. For a drawing
    call, ``variants["dropout_p"]`` is set to None: the spec refuses p without a mask (it draws
    no random numbers), so the rest of the call is validated without it."""
    p = variants.get("dropout_p")
    if variants.get("dropout_mask") is not None or not p:
        return 0.0
    variants["dropout_p"] = None
    return check_dropout(fn, p, ArrayInfo((), "bool"), ())  # a stand-in mask that fits any shape


class TorchHeadOps(_mha.HeadOps):
    """mha's array operations in torch's own ops."""

    def astype(self, x, dtype):
        return x.to(getattr(torch, dtype))

    def linear(self, x, w, b):
        return F.linear(x, w, b)  # (..., L, in) -> (..., L, out)

    def split_heads(self, x, heads):
        return x.unflatten(-1, (heads, -1)).transpose(-3, -2)  # (..., L, H, hd) -> (..., H, L, hd)

    def merge_heads(self, x):
        return x.transpose(-3, -2).flatten(-2)  # (..., L, H, hd) -> (..., L, H*hd)


class TorchBackend(TorchArrays):
    """torch SDPA (fused kernel) with the spec's semantics; exact math path where it leaks."""

    name = "torch"
    variants = frozenset(VARIANT_FEATURES + DRAWN_VARIANTS)

    @with_options()
    def sdpa(self, q, k, v, **options):
        o = take("torch.sdpa", options)
        mask, bias, alibi_slopes, sinks = o["mask"], o["bias"], o["alibi_slopes"], o["sinks"]
        q_segment_ids, kv_segment_ids, dropout_mask = (
            o["q_segment_ids"],
            o["kv_segment_ids"],
            o["dropout_mask"],
        )
        return_weights, return_lse = o["return_weights"], o["return_lse"]
        drawn_p = drawn_dropout_p("torch.sdpa", o)
        p = self._plan_of("torch.sdpa", q, k, v, o)
        if is_empty(p):
            return _xp_core.empty(_xp(), p, q.dtype, q.device, return_weights, sinks)
        if drawn_p:  # keep each weight with probability 1 - p, independently (rand is in [0, 1))
            dropout_mask = torch.rand(p.full_weights_shape, device=q.device) >= drawn_p  # (*batch, Hq, n, m)
            p = dataclasses.replace(p, dropout_p=drawn_p)
        # Kernels differ in which batch broadcasts they accept; expand (a view) makes them equal
        # (torch.mask-batch-beyond-qk: SDPA refuses a mask whose batch only v shares)
        q = with_head(q).expand(*p.batch, p.hq, p.n, p.dk)
        k = with_head(k).expand(*p.batch, p.hkv, p.m, p.dk)
        v = with_head(v).expand(*p.batch, p.hkv, p.m, p.dv)
        finite_q, finite_k, finite_v = _finite(q, k, v)
        # softcap, sinks, lse and dropout change the softmax: no fused kernel has them
        softmax_variant = p.softcap is not None or sinks is not None or return_lse or dropout_mask is not None
        plain_causal = (
            p.causal == "upper_left"
            and mask is None
            and bias is None
            and p.window is None
            and p.q_lengths is None
            and p.kv_lengths is None
            and q_segment_ids is None
            and alibi_slopes is None
            and not softmax_variant
        )
        if plain_causal and finite_q and finite_k and finite_v and not return_weights:
            # the common case needs no mask at all
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=p.scale, enable_gqa=p.group > 1
            )
            return out.reshape(p.out_shape)

        vis = with_mask_and_bias(
            structural_visibility(p, q.device, q_segment_ids, kv_segment_ids), mask, bias, -math.inf
        )
        if not (finite_k and finite_v) and vis is not None:
            # fixes torch.masked-nonfinite-k and torch.masked-nonfinite-v where it can stay fused
            k, v = _drop_hidden_keys(p, vis, k, v)
            finite_q, finite_k, finite_v = _finite(q, k, v)
        # the exact path covers torch.masked-nonfinite-k/-v where zeroing cannot, and fixes
        # torch.nonfinite-query-row-zeroed
        if (
            return_weights
            or softmax_variant
            or not (finite_q and finite_k and finite_v)
            or _below_kernel_floor(p, q, k, bias)
        ):
            ct = torch.float64 if q.dtype == torch.float64 else torch.float32
            alibi = (
                None
                if alibi_slopes is None
                else alibi_term(p, alibi_slopes, q_segment_ids, kv_segment_ids, ct)
            )
            out, weights, lse = _xp_core.attention(
                _xp(),
                p,
                q,
                k,
                v,
                vis,
                bias,
                nonfinite_v=not bool(torch.isfinite(v).all()),
                want_weights=return_weights,
                alibi=alibi,
                sinks=sinks,
                keep=dropout_mask,
            )
            return _xp_core.results(p, out, weights, lse)

        additive = bias
        if alibi_slopes is not None:  # ALiBi is one more additive term, after bias (no softcap here)
            alibi = alibi_term(p, alibi_slopes, q_segment_ids, kv_segment_ids, q.dtype)
            additive = alibi if bias is None else bias + alibi
        attn_mask = (
            vis if additive is None else (additive if vis is None else torch.where(vis, additive, -math.inf))
        )  # one additive term
        if attn_mask is not None and attn_mask.ndim < 2:  # torch wants (..., n, m)
            attn_mask = attn_mask.expand(p.n, p.m)
        if (
            attn_mask is not None
            and q.device.type != "cpu"
            and (attn_mask.shape[-1] != p.m or attn_mask.stride(-1) != 1)
        ):
            # CUDA's memory-efficient backward refuses a mask broadcast along the keys ("(*bias):
            # last dimension must be contiguous"; H200, torch 2.11: q_lengths' (..., n, 1) mask,
            # in sdpa_vjp and in mha_vjp)
            attn_mask = attn_mask.expand(*attn_mask.shape[:-1], p.m).contiguous()
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, scale=p.scale, enable_gqa=p.group > 1
        )
        if vis is not None and q.device.type != "cpu":
            # Rows with no visible key: every CPU kernel of torch 2.13 returns 0 (measured, so no
            # deviation is declared); GPU kernels could not be measured here, so make it sure.
            out = torch.where(vis.any(dim=-1, keepdim=True), out, 0.0)
        return out.reshape(p.out_shape)

    @with_options()
    def sdpa_fp8(self, q, k, v, *, q_descale=None, k_descale=None, v_descale=None, out_dtype=None, **options):
        # torch has FP8 storage but no FP8 matmul on CPU: upcast to float32, scale by the descale
        # there (one float32 rounding, within the FP8 tolerance's logit term), run this backend's
        # float32 sdpa, and round its results to out_dtype.
        fn = "torch.sdpa_fp8"
        o = take(fn, options)

        def info(name, x):
            return None if x is None else self._info(fn, name, x)

        fp = validate_fp8(
            fn,
            self._info(fn, "q", q),
            self._info(fn, "k", k),
            self._info(fn, "v", v),
            q_descale=_descale_to_numpy(q_descale),
            k_descale=_descale_to_numpy(k_descale),
            v_descale=_descale_to_numpy(v_descale),
            out_dtype=out_dtype,
            **{name: info(name, o[name]) for name in ARRAY_NAMES},
            **{
                name: _lengths_to_numpy(o[name]) if name.endswith("_lengths") else o[name]
                for name in VALUE_NAMES
            },
            return_lse=o["return_lse"],
        )

        def dequantize(x, descale):  # (..., H, L, d) float32; descale (*batch, H)
            d = torch.from_numpy(descale.astype(np.float32)).to(x.device)
            return with_head(x).to(torch.float32) * d[..., :, None, None]

        results = self.sdpa(
            dequantize(q, fp.q_descale), dequantize(k, fp.k_descale), dequantize(v, fp.v_descale), **o
        )
        results = list(results) if isinstance(results, tuple) else [results]
        p, out_dt = fp.sdpa, getattr(torch, fp.out_dtype)
        shaped = [results[0].reshape(p.out_shape).to(out_dt)]  # a rank-2 q gained a head axis above
        if o["return_weights"]:
            shaped.append(results[1].reshape(p.weights_shape).to(out_dt))
        if o["return_lse"]:
            shaped.append(results[-1].reshape(p.lse_shape).to(getattr(torch, fp.lse_dtype)))
        return shaped[0] if len(shaped) == 1 else tuple(shaped)

    @with_options()
    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, **options):
        # `attnspec.backends._mha`: F.linear projections, then self.sdpa per head. That avoids the
        # deviations of torch.nn.MultiheadAttention: the mask keeps the spec's polarity, True =
        # may attend (torch.mha-mask-polarity); a row with no visible key gets sdpa's 0, so b_o
        # (torch.mha-empty-row-nan); weights come back per head (torch.mha-weights-head-averaged).
        inputs, o = (query, key, value, params, num_heads, num_kv_heads), take("torch.mha", options)
        return _mha.run(
            self, "torch.mha", TorchHeadOps(), _lengths_to_numpy, lambda: str(query.device), inputs, o
        )

    @with_options(table=LSH_OPTIONS)
    def lsh_attention(self, x, v, **options):
        # `attnspec.backends._lsh_xp` on torch ops, through array-api-compat's torch namespace
        import array_api_compat.torch as xp

        from attnspec.backends import _lsh_xp

        p, o = _lsh_xp.plan("torch.lsh_attention", self._info, _lengths_to_numpy, x, v, options)
        rotations = o["rotations"]
        if p.L == 0 or 0 in p.batch:
            out, buckets = _lsh_xp.empty(xp, p, x.dtype, x.device)
        else:
            kv = _lsh_xp.kv_flat(p)
            out, buckets = _lsh_xp.lsh_attention(
                xp,
                p,
                x,
                v,
                rotations.to(x.device),
                None if kv is None else torch.tensor(kv, device=x.device),
                nonfinite_v=not bool(torch.isfinite(v).all()),
                device=x.device,
            )
        return (out, buckets) if o["return_buckets"] else out


#: logits below this sit where torch's CUDA kernels keep their masking constants (`_below_kernel_floor`)
KERNEL_FLOOR = -1e30


def _below_kernel_floor(p, q, k, bias) -> bool:
    """On a GPU, whether a logit of the call may fall below `KERNEL_FLOOR`. On an H200 (torch
    2.11) the CUDA kernels returned 0 for rows whose visible logits sat at -2.38e38 (a row with
    visible keys, treated as one with none) and their backward got dq wrong by 2.0 there; such a
    call takes the exact path. The bound is `_xp_core.logit_floor`'s (a sync). CPU kernels do
    not need it (measured: the corner passes on CPU)."""
    if q.device.type == "cpu" or not (p.n and p.m):
        return False
    f32 = torch.float32
    q, k = q.detach().to(f32), k.detach().to(f32)
    bias = None if bias is None else bias.detach().to(f32)
    return bool(_xp_core.logit_floor(_xp(), q, k, bias, p.scale) < KERNEL_FLOOR)


def _xp():
    """array-api-compat's torch namespace, on which the exact path (`attnspec.backends._xp_core`)
    runs: the same algorithm as jax's exact path and the array API backends'. Imported on first
    use, so torch-native, which shares this module's array hooks, does not need array-api-compat."""
    import array_api_compat.torch as xp

    return xp


def _finite(*xs: torch.Tensor) -> list[bool]:
    """Whether each tensor is all finite, read back in one device sync.

    Tested on the sum (float32 or wider accumulation): a NaN or inf always makes it non-finite,
    and it is one pass with no bool temporary (isfinite(x).all() cost ~6 ms of a 17 ms call at
    (1, 8, 1024, 64)). Finite values whose sum overflows read as non-finite: that only sends the
    call to the exact path, which is right for any input.
    """
    sums = [x.sum(dtype=torch.float64 if x.dtype == torch.float64 else torch.float32) for x in xs]
    return torch.stack([s.double() for s in sums]).isfinite().tolist()


def _drop_hidden_keys(p: SDPAPlan, vis: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """Zero the keys (k and v) that no query row of any head in their group can see."""
    seen = vis.expand(*p.batch, p.hq, p.n, p.m).any(dim=-2)  # (*batch, Hq, m)
    seen = seen.reshape(*p.batch, p.hkv, p.group, p.m).any(dim=-2)  # (*batch, Hkv, m)
    seen = seen.unsqueeze(-1)  # (*batch, Hkv, m, 1)
    return torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)
