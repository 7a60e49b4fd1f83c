"""Calling conventions: how a plain attention function is called, so the kit can check it.

A `Convention` knows one family of signatures. Given a validated spec call it builds the
arguments the function takes, calls it once, and brings the result back to the spec's layout.
Every spec option the convention can carry is expressed (rules the function has no argument
for are folded into its mask, when it has one); what it cannot carry is refused with a reason
naming the convention, before the function is called. Keyword arguments are passed only when
they differ from the signature's default, so a function that lacks an optional argument still
runs every case that does not need it (and the capability probe records the rest).

Built in (``CONVENTIONS``):

``torch_sdpa``  ``fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                scale=None, enable_gqa=False)`` on (..., H, L, D) arrays (torch's
                ``F.scaled_dot_product_attention``). ``is_causal`` is upper-left; ``attn_mask``
                is bool (True = attend) or an additive float mask. Lower-right causal (on the
                padded or on each sequence's lengths), windows, lengths and segment ids go into
                ``attn_mask``; a bias makes it a float mask with -inf where not visible. No weights.
``flash``       ``fn(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1),
                softcap=0.0, alibi_slopes=None, return_attn_probs=False)`` on (B, L, H, D)
                arrays (FlashAttention's ``flash_attn_func``). ``causal``, ``window_size`` and
                ALiBi are lower-right aligned (so the spec's "lower_right_lengths" is
                "lower_right" here: this function has no lengths); kv head h // G serves query
                head h; ``return_attn_probs=True`` returns (out, softmax_lse, S_dmask), whose
                lse is the spec's. No mask, bias, lengths, segment ids (varlen and kvcache are
                other functions), sinks or given dropout mask; upper-left alignment and an
                upper-left ALiBi anchor only when n == m. No weights.
``flash_varlen``, ``flash_kvcache``  FlashAttention's ``flash_attn_varlen_func`` on packed
                (total, H, D) arrays with ``cu_seqlens``, and ``flash_attn_with_kvcache`` with
                ``cache_seqlens``: causal, window and ALiBi aligned on each sequence's actual
                lengths, the spec's ``causal="lower_right_lengths"``
                (`attnspec.backends.conventions.flash`).
``flash_kvcache_paged``, ``vllm_paged``  paged KV caches: FlashAttention's
                ``flash_attn_with_kvcache`` with ``block_table`` and vLLM's ``ref_paged_attn``, keys
                scattered into a shuffled pool whose every slot outside a sequence is NaN
                (`attnspec.backends.conventions.paged`).
``jax``         ``fn(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None)``
                on (B, T, N, H) arrays (``jax.nn.dot_product_attention``). ``is_causal`` and
                ``local_window_size`` are upper-left; lower-right causal goes into ``mask``.
                No weights.
``flash3_fp8``, ``flash_kvcache_fp8``, ``flash_kvcache_paged_fp8``  the same FlashAttention calls
                with FP8 q, k, v and their descales (FlashAttention-3's ``q_descale``,
                ``k_descale``, ``v_descale``, float32 (B, Hkv)), so ``sdpa_fp8`` is checked
                through them; their non-FP8 calls are the parents' (`Convention.descales`).
``tutorial``    ``fn(Q, K, V, mask=None) -> (output, weights)`` on (..., H, L, D) arrays, mask
                1/True = keep, scale fixed at 1/sqrt(dk) (the tutorials in ``shared/seeds``).
                Every rule goes into ``mask``; GQA by repeating kv heads (h // G). No bias, no
                scale.

The atlas' outside implementations have theirs in the same registry (`attnspec.backends.conventions.atlas`):
``mlx``, ``tinygrad``, ``keras``, ``flax``, ``hf_eager``, ``hf_sdpa``, ``flex``, ``pallas``, ``onnx``,
``paddle``, each named for the function it calls. ``attnspec conventions`` lists them all.

The package: this module (the contract, `Call`, the built-in conventions, the registry), ``flash``
(FlashAttention's varlen and KV-cache calls), ``paged`` (paged KV caches), ``atlas`` (the outside
implementations'). Add one with `register_convention` (a `Convention` subclass instance).

FP8 (``sdpa_fp8``): a convention with `Convention.descales` set passes each FP8 call's descales
as keywords, broadcast to FA3's (B, Hkv) float32, with the function's arrays in their FP8 dtype;
its other arguments are built as for sdpa. Which FP8 calls it takes is data: `fp8_dtypes`,
`fp8_out_dtypes` (FA3 returns bfloat16 only), ``descales="qkv"`` (q, k, v all FP8, as FA3) or
``"kv"`` (a wide q over an FP8 KV cache). The P precision the function claims
(`fp8_p_precision`, judged by `attnspec.spec.tolerance_fp8`) is the user's statement: ``extend``
sets it, or the name suffix ``+p_e4m3`` (``attnspec check --fp8-p-precision float8_e4m3fn``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnspec.backends.arrays import ArrayLibrary
from attnspec.backends.authoring import (
    additive_mask,
    attend_mask,
    expand_kv_heads,
    flatten_batch,
    flatten_mask,
    to_blhd,
    unflatten_batch,
)
from attnspec.backends.base import DRAWN_VARIANTS, VARIANT_FEATURES, variant_features
from attnspec.errors import SpecError
from attnspec.spec.fp8 import FP8_DTYPES
from attnspec.spec.validate import SDPAPlan

#: the types of `Convention.call`, named once: the function it calls, the call's keywords, and what
#: it returns (out in the plan's ``out_shape``, then the weights or None)
Fn = Callable[..., Any]
Kw = dict[str, Any]
Called = tuple[Any, Any]

__all__ = [
    "CANONICAL",
    "CONVENTIONS",
    "FP8_NEEDS",
    "NEEDS",
    "P_E4M3",
    "Call",
    "Convention",
    "call_needs",
    "canonical_inputs",
    "fp8_call_needs",
    "get_convention",
    "register_convention",
]

#: what a call can ask of an implementation, beyond its dtype: the names the probe and the
#: conventions' refusals use
NEEDS = (
    "gqa",
    "dk_ne_dv",
    "rank2",
    "rank3",
    "rank4",
    "rank5",
    "batch_broadcast",
    "empty",
    "scale",
    "mask",
    "mask_broadcast",
    "bias",
    "causal_upper_left",
    "causal_lower_right",
    "window",
    "window_lower_right",
    "q_lengths",
    "kv_lengths",
    "return_weights",
    *VARIANT_FEATURES,
)


#: what an sdpa_fp8 call asks beyond sdpa's needs: q, k, v in FP8 with descales, or a wide q over
#: an FP8 KV cache. Kept apart from `NEEDS`: a convention without `Convention.descales` is
#: probed and reported on `NEEDS` alone, as before FP8 existed.
FP8_NEEDS = ("fp8", "fp8_kv_cache")


@dataclass(frozen=True)
class Call:
    """What one sdpa call needs (a subset of `NEEDS`) and its sizes."""

    needs: frozenset[str]
    n: int
    m: int


def call_needs(
    q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...], options: dict[str, Any]
) -> Call:
    """The needs of a call with these shapes and spec keywords (``mask``, ``causal``...)."""

    def heads(s: tuple[int, ...]) -> int:
        return s[-3] if len(s) >= 3 else 1

    needs = set()
    if heads(q_shape) != heads(k_shape):
        needs.add("gqa")
    if q_shape[-1] != v_shape[-1]:
        needs.add("dk_ne_dv")
    # rank 4 is (B, H, L, D); rank 3 has no batch axis, rank 2 no head axis either; rank 5 stands
    # for more than one batch axis
    needs.add(f"rank{min(len(q_shape), 5)}")
    if len({tuple(s[:-3]) for s in (q_shape, k_shape, v_shape)}) > 1:
        needs.add("batch_broadcast")
    n, m = int(q_shape[-2]), int(k_shape[-2])
    if n == 0 or m == 0 or heads(q_shape) == 0:
        needs.add("empty")
    if any(0 in s[:-3] for s in (q_shape, k_shape, v_shape)):  # no batch element (0 broadcasts)
        needs.add("empty")
    for name in ("scale", "mask", "bias", "q_lengths", "kv_lengths"):
        if options.get(name) is not None:
            needs.add(name)
    mask = options.get("mask")
    if mask is not None and len(q_shape) >= 3:
        full = (*np.broadcast_shapes(tuple(q_shape[:-3]), tuple(k_shape[:-3])), heads(q_shape), n, m)
        if tuple(np.shape(mask)) != full:
            needs.add("mask_broadcast")  # a mask with fewer or size-1 axes, broadcast by the spec
    if options.get("return_weights"):
        needs.add("return_weights")
    causal = options.get("causal")
    if causal is not None:
        needs.add(f"causal_{causal}")
    if options.get("window") is not None:
        needs.add("window_lower_right" if causal in ("lower_right", "lower_right_lengths") else "window")
    needs.update(variant_features(options))
    return Call(frozenset(needs), n, m)


def fp8_call_needs(
    q_shape: tuple[int, ...],
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    options: dict[str, Any],
    q_dtype: str,
) -> Call:
    """The needs of an sdpa_fp8 call: sdpa's (`call_needs`), ``fp8`` or ``fp8_kv_cache`` by q's
    dtype, and ``fp8_out_<dtype>`` for its output dtype (which `Convention.fp8_out_dtypes` limits)."""
    base = call_needs(q_shape, k_shape, v_shape, options)
    out = options.get("out_dtype") or ("bfloat16" if q_dtype in FP8_DTYPES else q_dtype)
    kind = "fp8" if q_dtype in FP8_DTYPES else "fp8_kv_cache"
    return Call(base.needs | {kind, f"fp8_out_{out}"}, base.n, base.m)


def _variant_refusal(convention: str, variant: str) -> str:
    """Why ``convention`` refuses ``variant``: it maps no argument of the function to it."""
    if variant == "dropout_drawn":  # the function may well take dropout_p: the convention passes none
        return (
            f"the {convention} convention passes no dropout_p to the function, so dropout the "
            f"function draws itself is not checked through it"
        )
    return f"the {convention} convention has no argument for the {variant} variant"


class Convention:
    """One family of attention signatures. Subclasses set the class attributes and `call`."""

    name: str = ""
    #: the exact signature the function must have, as documented
    signature: str = ""
    #: the array library its arguments come from by default (`attnspec.backends.arrays`)
    arrays: str = "numpy"
    #: needs it cannot carry -> why (a static refusal, before any call); a subclass maps a need its
    #: parent refuses to None when it carries it after all
    cannot: ClassVar[dict[str, str | None]] = {}
    #: the alignment of the function's own causal flag (None: it has none; causal goes into a mask)
    causal_flag: str | None = None
    #: whether the function has a window argument of its own
    window_argument: bool = False
    #: the attention variants (`VARIANT_FEATURES`) it can carry; the others are refused
    variants: frozenset[str] = frozenset()
    #: spec option -> the function's keyword for it, passed as it is whenever a call sets the
    #: option (``softcap``, ``sinks``, ``alibi_slopes``); added with `extend`
    keywords: dict[str, str] = {}  # noqa: RUF012 (replaced, never mutated)
    #: the function receives canonical inputs: q, k, v always (B, H, L, D) (rank 2 gets B = H = 1,
    #: several batch axes become one) and every mask full-size (B, Hq, n, m), no size-1 axes; its
    #: output comes back to the spec's shape. Set with ``extend(..., canonical=True)`` or
    #: ``attnspec check --canonical``.
    canonical: bool = False
    #: the FP8 calls it passes descales for: None (none: sdpa_fp8 is not expressible), "qkv" (q, k
    #: and v FP8, ``q_descale``, ``k_descale``, ``v_descale`` keywords, FlashAttention-3) or "kv"
    #: (a wide q over an FP8 KV cache: ``k_descale``, ``v_descale``). Each descale goes as a float32
    #: (B, Hkv) array of the function's library, always passed (ones where the call has none).
    descales: str | None = None
    #: the FP8 storage dtypes the function takes (FA3: float8_e4m3fn only)
    fp8_dtypes: tuple[str, ...] = FP8_DTYPES
    #: the output dtypes it returns for FP8 inputs (FA3: bfloat16); a call asking another is refused
    fp8_out_dtypes: tuple[str, ...] = ("bfloat16",)
    #: the precision of the P its function multiplies V by, as its user claims it: "float32" or
    #: "float8_e4m3fn" (FA3 rounds P to e4m3); the FP8 property judges by it
    fp8_p_precision: str = "float32"
    #: the keyword the function takes its FP8 output dtype by (None: it has none and returns the
    #: first of `fp8_out_dtypes`); passed as the dtype's name ("float32") when a call asks another
    fp8_out_keyword: str | None = None

    def extend(
        self,
        name: str,
        *,
        keywords: dict[str, str] | None = None,
        refuse: dict[str, str] | None = None,
        canonical: bool | None = None,
        signature: str | None = None,
        descales: str | None = None,
        fp8_dtypes: tuple[str, ...] | None = None,
        fp8_out_dtypes: tuple[str, ...] | None = None,
        fp8_p_precision: str | None = None,
        fp8_out_keyword: str | None = None,
    ) -> Convention:
        """A new convention: this one, plus keywords, minus features, or with canonical inputs.

        Args:
            name: the new convention's name (register it with `register_convention`, or name it
                as ``MODULE:ATTRIBUTE`` on the command line).
            keywords: spec option -> the function's keyword: ``{"softcap": "logit_cap"}`` passes
                the spec's softcap as ``logit_cap=`` whenever a case sets it, so the variant is
                checked. One of ``softcap``, ``sinks``, ``alibi_slopes``.
            refuse: need (`NEEDS`) -> why the function cannot take it: ``{"scale": "fixes the
                scale at 1/sqrt(d)"}``. Such cases are refused before the call, and the verdict
                counts the need as not expressible rather than refused.
            canonical: the function receives canonical inputs (`canonical`).
            signature: the signature as documented (default: the parent's, with the keywords).
            descales: "qkv" or "kv": pass FP8 calls' descales (`descales`), so sdpa_fp8 is checked.
            fp8_dtypes, fp8_out_dtypes: the FP8 storage and output dtypes the function takes.
            fp8_p_precision: the P precision the function claims, "float32" or "float8_e4m3fn".
            fp8_out_keyword: the keyword taking the FP8 output dtype's name (`fp8_out_keyword`).
        """
        import copy

        if descales not in (None, "qkv", "kv"):
            raise SpecError(f"{self.name}.extend: descales={descales!r} must be None, 'qkv' or 'kv'")
        if fp8_p_precision not in (None, "float32", "float8_e4m3fn"):
            raise SpecError(
                f"{self.name}.extend: fp8_p_precision={fp8_p_precision!r} must be 'float32' or "
                "'float8_e4m3fn'"
            )
        bad = sorted(set(fp8_dtypes or ()) - set(FP8_DTYPES))
        if bad or fp8_dtypes == ():
            raise SpecError(
                f"{self.name}.extend: fp8_dtypes={fp8_dtypes!r} must be a non-empty subset of "
                f"{', '.join(FP8_DTYPES)}"
            )

        keywords = dict(keywords or {})
        bad = sorted(set(keywords) - set(_PASSED_OPTIONS))
        if bad:
            raise SpecError(
                f"{self.name}.extend: keywords={keywords!r}: {', '.join(bad)} cannot be passed as a "
                f"keyword; expected spec options among {', '.join(_PASSED_OPTIONS)}"
            )
        bad = sorted(set(refuse or {}) - set(NEEDS))
        if bad:
            raise SpecError(
                f"{self.name}.extend: refuse={refuse!r}: {', '.join(bad)} is not a need; expected "
                f"names among {', '.join(NEEDS)}"
            )
        new = copy.copy(self)
        new.name = name
        new.keywords = {**self.keywords, **keywords}
        passed = {_PASSED_OPTIONS[o] for o in keywords}
        new.variants = self.variants | passed
        # a class-level table in the built-ins: the new one is this instance's own
        new.__dict__["cannot"] = {
            **{k: v for k, v in self.cannot.items() if k not in passed},
            **(refuse or {}),
        }
        if canonical is not None:
            new.canonical = canonical
        for attr, value in (
            ("descales", descales),
            ("fp8_dtypes", fp8_dtypes),
            ("fp8_out_dtypes", fp8_out_dtypes),
            ("fp8_p_precision", fp8_p_precision),
            ("fp8_out_keyword", fp8_out_keyword),
        ):
            if value is not None:
                setattr(new, attr, tuple(value) if isinstance(value, (list, tuple)) else value)
        extra = "".join(f", {kw}=<{o}>" for o, kw in keywords.items())
        new.signature = signature or (
            self.signature
            + (f"; plus {extra[2:]}" if extra else "")
            + ("; canonical 4-D inputs, full-size masks" if new.canonical and not self.canonical else "")
            + (f"; FP8 with descales ({new.descales})" if new.descales and not self.descales else "")
            + ("; P rounded to e4m3" if new.fp8_p_precision != self.fp8_p_precision else "")
        )
        return new

    def descale_keywords(
        self, fp: Any, lib: ArrayLibrary, options: dict[str, Any], device: str | None
    ) -> dict[str, Any]:
        """The descale keywords of an FP8 call (`attnspec.spec.fp8.FP8Plan` ``fp``): FA3's float32
        (B, Hkv), ones where the call gives none (the spec's default, 1); and the output dtype's
        name under `fp8_out_keyword` when the call asks for another than the function's default."""
        p = fp.sdpa
        names = (
            ("q_descale", "k_descale", "v_descale") if self.descales == "qkv" else ("k_descale", "v_descale")
        )
        kw = {}
        for name in names:
            value = options.get(name)
            d = (
                np.ones(())
                if value is None
                else lib.to_numpy(value)
                if lib.is_array(value)
                else np.asarray(value)
            )
            d = np.broadcast_to(np.asarray(d, np.float32), (*p.batch, p.hkv)).reshape(
                math.prod(p.batch), p.hkv
            )
            kw[name] = lib.asarray(np.ascontiguousarray(d), device=device)  # (B, Hkv) float32
        if self.fp8_out_keyword and fp.out_dtype != self.fp8_out_dtypes[0]:
            kw[self.fp8_out_keyword] = fp.out_dtype
        return kw

    def pass_keywords(self, p: SDPAPlan, options: dict[str, Any]) -> dict[str, Any]:
        """The keywords of `extend` a call sets, with their values (the spec's, unchanged)."""
        kw = {}
        for option, keyword in self.keywords.items():
            value = p.softcap if option == "softcap" else options.get(option)
            if value is not None:
                kw[keyword] = value
        return kw

    def refusals(self, call: Call) -> list[str]:
        """Why this convention cannot express ``call`` (empty when it can)."""
        why = [f"the {self.name} convention {why}" for need, why in self.cannot.items() if need in call.needs]
        why += [
            _variant_refusal(self.name, v)
            for v in (*VARIANT_FEATURES, *DRAWN_VARIANTS)
            if v in call.needs and v not in self.variants and v not in self.cannot
        ]
        return why + self._fp8_refusals(call)

    def _fp8_refusals(self, call: Call) -> list[str]:
        kind = next((n for n in FP8_NEEDS if n in call.needs), None)
        if kind is None:
            return []
        if self.descales is None:
            return [
                f"the {self.name} convention passes no descales, so FP8 inputs (sdpa_fp8) are not "
                "expressible through it (flash3_fp8, flash_kvcache_fp8 and flash_kvcache_paged_fp8 pass "
                "them; Convention.extend(descales=...) adds them to another)"
            ]
        why = []
        if kind == "fp8" and self.descales == "kv":
            why.append(
                f"the {self.name} convention takes a wide q over an FP8 KV cache (descales='kv'), "
                "not an FP8 q"
            )
        if kind == "fp8_kv_cache" and self.descales == "qkv":
            why.append(
                f"the {self.name} convention takes q in FP8 with its descale, as FlashAttention-3 "
                "does (descales='qkv'), not a wide q"
            )
        out = next((n.removeprefix("fp8_out_") for n in call.needs if n.startswith("fp8_out_")), None)
        if out is not None and out not in self.fp8_out_dtypes:
            why.append(
                f"the {self.name} convention's function returns {' or '.join(self.fp8_out_dtypes)} for "
                f"FP8 inputs, not out_dtype={out}"
            )
        return why

    def call(self, fn: Fn, lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any, options: Kw) -> Called:
        """Call ``fn`` for the validated call ``p``; return (out in ``p.out_shape``, weights or None)."""
        raise NotImplementedError

    def output_causes(
        self, p: SDPAPlan, lib: ArrayLibrary, q: Any, k: Any, v: Any, options: dict[str, Any], out: Any
    ) -> list[str]:
        """Causes this convention's layout shows in ``out`` (the spec-shaped output of the call just
        made), each beginning with one of `attnspec.conformance.causes.CAUSE_PREFIXES`; the judge
        adds them to a failure's message. None by default (the paged conventions name a NaN read
        from their trap slots)."""
        return []

    def __repr__(self) -> str:
        return f"<attnspec convention {self.name!r}: {self.signature}>"


#: the spec options `Convention.extend` can pass through a keyword -> the variant each carries
_PASSED_OPTIONS = {"softcap": "softcap", "sinks": "sinks", "alibi_slopes": "alibi"}


def canonical_inputs(
    p: SDPAPlan, lib: ArrayLibrary, q: Any, k: Any, v: Any, mask: np.ndarray | None
) -> tuple[Any, Any, Any, Any]:
    """q, k, v as (B, H, L, d) and a mask (NumPy, broadcasting to the call) as the full-size
    (B, Hq, n, m) array on q's device, for a convention with canonical inputs."""
    qf, kf, vf = flat_qkv(p, q, k, v)
    return qf, kf, vf, None if mask is None else full_mask(p, lib, flatten_mask(p, mask), _device(lib, q))


def full_mask(p: SDPAPlan, lib: ArrayLibrary, mask: Any, device: str | None) -> Any:
    """A (B, Hq or 1, n, m) mask (NumPy or ``lib``'s) as the full-size (B, Hq, n, m) array of
    ``lib`` on ``device``: no size-1 axis left for the function to broadcast."""
    full = np.broadcast_to(
        lib.to_numpy(mask) if lib.is_array(mask) else np.asarray(mask), (math.prod(p.batch), p.hq, p.n, p.m)
    )
    return lib.asarray(np.ascontiguousarray(full), device=device)


def _device(lib: ArrayLibrary, x: Any) -> str | None:
    try:
        return lib.device_of(x)
    except Exception:  # a library that cannot say: its default device
        return None


def flat_qkv(p: SDPAPlan, q: Any, k: Any, v: Any, layout: str = "bhld") -> tuple[Any, ...]:
    """q, k, v -> (B, H, L, d) each, batch dims broadcast and flattened (rank 2 gets its head
    axis); with ``layout="blhd"``, (B, L, H, d)."""
    out = (flatten_batch(p, q, p.hq, p.n), flatten_batch(p, k, p.hkv, p.m), flatten_batch(p, v, p.hkv, p.m))
    return tuple(to_blhd(x) for x in out) if layout == "blhd" else out


def _first(result: Any) -> Any:
    """The output of a function that may return (output, extras...)."""
    return result[0] if isinstance(result, (tuple, list)) else result


class TorchSDPA(Convention):
    name = "torch_sdpa"
    signature = (
        "fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, "
        "enable_gqa=False) on (..., H, L, D) arrays"
    )
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {"return_weights": "returns no attention weights"}
    causal_flag = "upper_left"
    #: rules of its own that only decide visibility: folded into attn_mask like lengths and windows
    variants = frozenset({"causal_lower_right_lengths", "segments"})

    def call(self, fn: Fn, lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any, options: Kw) -> Called:
        kw: dict[str, Any] = {}
        if options.get("scale") is not None:
            kw["scale"] = p.scale
        if p.hq != p.hkv:  # GQA, or no query heads at all (Hq = 0: PyTorch needs enable_gqa there too)
            kw["enable_gqa"] = True
        rules = (
            options.get(o) is not None
            for o in ("mask", "bias", "window", "q_lengths", "kv_lengths", "q_segment_ids", "kv_segment_ids")
        )
        segments = _segment_ids(options)
        mask = None
        if p.causal == "upper_left" and not any(rules):
            kw["is_causal"] = True  # is_causal is upper-left
        elif options.get("bias") is not None:
            mask = additive_mask(p, options.get("mask"), options["bias"], **segments)
            assert mask is not None  # never None with a bias
        else:
            mask = attend_mask(p, options.get("mask"), **segments)
        if self.canonical:
            q, k, v, mask = canonical_inputs(p, lib, q, k, v, mask)
        elif mask is not None:
            mask = lib.asarray(mask, device=_device(lib, q))
        if mask is not None:
            kw["attn_mask"] = mask
        out = _first(fn(q, k, v, **kw, **self.pass_keywords(p, options)))
        return (unflatten_batch(p, out) if self.canonical else out), None


class Flash(Convention):
    name = "flash"
    signature = (
        "fn(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1)) on (B, L, H, D) "
        "arrays, causal and window lower-right aligned"
    )
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {
        "mask": "has no mask argument",
        "bias": "has no bias argument",
        "q_lengths": "has no sequence lengths (varlen is another function)",
        "kv_lengths": "has no sequence lengths (varlen is another function)",
        "return_weights": "returns no attention weights",
        "segments": "has no segment ids (varlen, flash_attn_varlen_func with cu_seqlens, is another function)",
        "sinks": "has no attention sinks",
        "dropout": "draws its own dropout mask (dropout_p) and takes no given one",
    }
    causal_flag = "lower_right"
    window_argument = True
    variants = frozenset({"softcap", "alibi", "lse", "causal_lower_right_lengths"})

    def refusals(self, call: Call) -> list[str]:
        why = super().refusals(call)
        lower_right = {"causal_lower_right", "causal_lower_right_lengths"} & call.needs
        if call.n != call.m and "alibi" in call.needs and not lower_right:
            why.append(
                "the flash convention anchors ALiBi lower-right (i + m - n): the spec's "
                "upper-left anchor (no causal, or upper_left) differs when n != m"
            )
        if call.n != call.m and "causal_upper_left" in call.needs:
            why.append("the flash convention's causal is lower-right: upper-left differs when n != m")
        if call.n != call.m and "window" in call.needs:
            why.append(
                "the flash convention anchors windows lower-right: an upper-left window differs when n != m"
            )
        return why

    def call(self, fn: Fn, lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any, options: Kw) -> Called:
        qf, kf, vf = flat_qkv(p, q, k, v, "blhd")  # (B, n, Hq, dk), (B, m, Hkv, dk), (B, m, Hkv, dv)
        kw: dict[str, Any] = {}
        if p.causal is not None:
            kw["causal"] = True
        if p.window is not None:
            kw["window_size"] = p.window
        if options.get("scale") is not None:
            kw["softmax_scale"] = p.scale
        if p.softcap is not None:
            kw["softcap"] = p.softcap
        slopes = options.get("alibi_slopes")
        if slopes is not None:  # (Hq,) or (..., Hq) -> (B, Hq), float32 as FlashAttention wants
            B = math.prod(p.batch)
            slopes = lib.reshape(lib.broadcast_to(slopes, (*p.batch, p.hq)), (B, p.hq))
            kw["alibi_slopes"] = lib.asarray(
                np.ascontiguousarray(lib.to_numpy(slopes), np.float32), device=_device(lib, q)
            )
        if p.return_lse:
            kw["return_attn_probs"] = True
        result = fn(qf, kf, vf, **kw, **self.pass_keywords(p, options))
        out = unflatten_batch(p, _first(result), layout="blhd")  # (B, n, Hq, dv) -> spec's
        if not p.return_lse:
            return out, None
        lse = lib.reshape(result[1], p.lse_shape)  # (B, Hq, n)
        return (out, lse), None


class Jax(Convention):
    name = "jax"
    signature = (
        "fn(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False, "
        "query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None) on "
        "(B, T, N, H) arrays, is_causal and local_window_size upper-left"
    )
    arrays = "jax"
    cannot: ClassVar[dict[str, str | None]] = {"return_weights": "returns no attention weights"}
    causal_flag = "upper_left"

    #: whether the function takes query_seq_lengths / key_value_seq_lengths and local_window_size
    #: (jax.nn does; Keras and Flax, which share its layout and flags, do not)
    lengths_arguments = True
    window_argument = True

    def call(self, fn: Fn, lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any, options: Kw) -> Called:
        qf, kf, vf = flat_qkv(p, q, k, v, "blhd")  # (B, n, Hq, dk), (B, m, Hkv, dk), (B, m, Hkv, dv)
        dev = _device(lib, q)
        upper = p.causal != "lower_right"
        # lower-right causal (and its window), or a window with no argument for it, joins the mask
        fold = not upper or (p.window is not None and not self.window_argument)
        kw: dict[str, Any] = {}
        if p.causal == "upper_left" and not fold:
            kw["is_causal"] = True
        if p.window is not None and not fold:
            kw["local_window_size"] = p.window
        vis = attend_mask(p, options.get("mask"), structure=fold, lengths=not self.lengths_arguments)
        if vis is not None:
            kw["mask"] = lib.asarray(
                np.ascontiguousarray(flatten_mask(p, vis)), device=dev
            )  # (B, Hq or 1, n, m)
        if options.get("bias") is not None:
            kw["bias"] = flatten_mask(p, options["bias"])  # (B, Hq or 1, n, m)
        for spec_name, name in (("q_lengths", "query_seq_lengths"), ("kv_lengths", "key_value_seq_lengths")):
            lengths = getattr(p, spec_name)
            if lengths is not None and self.lengths_arguments:
                kw[name] = lib.asarray(
                    np.reshape(lengths, (math.prod(p.batch),)).astype(np.int32), device=dev
                )  # (B,)
        if options.get("scale") is not None:
            kw["scale"] = p.scale
        for name in ("mask", "bias") if self.canonical else ():  # (B, 1, n, m) -> (B, Hq, n, m)
            if kw.get(name) is not None:
                kw[name] = full_mask(p, lib, kw[name], dev)
        out = _first(fn(qf, kf, vf, **kw, **self.pass_keywords(p, options)))  # (B, n, Hq, dv)
        return unflatten_batch(p, out, layout="blhd"), None


class Tutorial(Convention):
    name = "tutorial"
    signature = (
        "fn(Q, K, V, mask=None) -> (output, weights) on (..., H, L, D) arrays, mask 1/True = "
        "keep, scale fixed at 1/sqrt(dk)"
    )
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {
        "bias": "has no bias argument",
        "scale": "fixes the scale at 1/sqrt(dk)",
    }
    #: rules that only decide visibility: folded into the mask like lengths and windows
    variants = frozenset({"causal_lower_right_lengths", "segments"})

    def call(self, fn: Fn, lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any, options: Kw) -> Called:
        vis = attend_mask(p, options.get("mask"), **_segment_ids(options))
        if self.canonical:
            q, k, v, vis = canonical_inputs(p, lib, q, k, v, vis)
        elif vis is not None:
            vis = lib.asarray(vis, device=_device(lib, q))
        if p.hq != p.hkv:  # query head h reads kv head h // G; no query heads (G = 0): no kv heads
            k, v = expand_kv_heads(k, p.group), expand_kv_heads(v, p.group)
        args = (q, k, v) if vis is None else (q, k, v, vis)
        result = fn(*args, **self.pass_keywords(p, options))
        pair = isinstance(result, (tuple, list)) and len(result) == 2
        out, weights = (result[0], result[1]) if pair else (result, None)
        if self.canonical:
            out = unflatten_batch(p, out)
            if weights is not None:  # (B, Hq, n, m) -> the spec's weights shape
                weights = lib.reshape(weights, p.weights_shape)
        return out, weights


def _segment_ids(options: dict[str, Any]) -> dict[str, Any]:
    """A call's segment ids as `attend_mask`'s keywords (None where not given)."""
    return {name: options.get(name) for name in ("q_segment_ids", "kv_segment_ids")}


CONVENTIONS: dict[str, Convention] = {c.name: c for c in (TorchSDPA(), Flash(), Jax(), Tutorial())}


def register_convention(convention: Convention, *, replace: bool = False) -> None:
    """Add a convention under ``convention.name``."""
    if not isinstance(convention, Convention) or not convention.name:
        raise SpecError(f"register_convention: expected a named Convention instance, got {convention!r}")
    if convention.name in CONVENTIONS and not replace:
        raise SpecError(f"register_convention: convention {convention.name!r} exists (pass replace=True)")
    CONVENTIONS[convention.name] = convention


def get_convention(name: str | Convention) -> Convention:
    """The convention called ``name``; a `Convention` is returned as it is."""
    if isinstance(name, Convention):
        return name
    suffixes = set()
    base = name
    while base.endswith((CANONICAL, P_E4M3)):  # in any order
        suffix = CANONICAL if base.endswith(CANONICAL) else P_E4M3
        suffixes.add(suffix)
        base = base.removesuffix(suffix)
    canonical = CANONICAL in suffixes
    if base in CONVENTIONS:
        conv = CONVENTIONS[base]
    elif ":" in base:  # a convention defined in the user's own module
        from attnspec.backends import load_object

        conv = load_object(base)
        if isinstance(conv, type) and issubclass(conv, Convention):
            conv = conv()
        if not isinstance(conv, Convention):
            raise SpecError(
                f"convention={base!r} names a {type(conv).__name__}, not an attnspec Convention "
                "(make one with get_convention('torch_sdpa').extend(...) or a Convention subclass)"
            )
    else:
        raise SpecError(
            f"convention={name!r} is not one of {', '.join(CONVENTIONS)}, nor MODULE:ATTRIBUTE "
            "naming a Convention"
        )
    if P_E4M3 in suffixes and conv.fp8_p_precision != "float8_e4m3fn":
        conv = conv.extend(name, fp8_p_precision="float8_e4m3fn")
    return conv.extend(name, canonical=True) if canonical and not conv.canonical else conv


#: the suffix of a convention name asking for canonical inputs: ``torch_sdpa+canonical``
CANONICAL = "+canonical"
#: the suffix of a convention name claiming FA3's P rounding: ``flash3_fp8+p_e4m3`` (the FP8
#: property then judges by ``fp8_p_precision="float8_e4m3fn"``)
P_E4M3 = "+p_e4m3"


def describe(fn: Callable[..., Any]) -> str:
    """``module.qualname(signature)`` of a function, for reports."""
    try:
        sig = str(inspect.signature(fn))
    except (TypeError, ValueError):
        sig = "(...)"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}{sig}"


# FlashAttention's varlen and KV-cache functions (their module imports this one's names)
from attnspec.backends.conventions.flash import FlashKVCache, FlashVarlen  # noqa: E402
from attnspec.backends.conventions.paged import FlashKVCachePaged, VllmPaged  # noqa: E402

CONVENTIONS.update({c.name: c for c in (FlashVarlen(), FlashKVCache(), FlashKVCachePaged(), VllmPaged())})

# FlashAttention-3's FP8 calls: the same functions, with descales (FA3 takes e4m3fn and returns bf16)
_FA3_SIG = "; FP8 q, k, v (float8_e4m3fn) with q_descale, k_descale, v_descale float32 (B, Hkv); out bfloat16"
CONVENTIONS.update(
    {
        c.name: c
        for c in (
            CONVENTIONS["flash"].extend(
                "flash3_fp8",
                descales="qkv",
                fp8_dtypes=("float8_e4m3fn",),
                refuse={"alibi": "has no ALiBi slopes (FlashAttention-3's flash_attn_func)"},
                signature="fn(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, "
                "q_descale=None, k_descale=None, v_descale=None, return_attn_probs=False) on (B, L, H, D) "
                "arrays (FlashAttention-3's flash_attn_func), causal and window lower-right" + _FA3_SIG,
            ),
            CONVENTIONS["flash_kvcache"].extend(
                "flash_kvcache_fp8",
                descales="qkv",
                fp8_dtypes=("float8_e4m3fn",),
                signature=CONVENTIONS["flash_kvcache"].signature + _FA3_SIG,
            ),
            CONVENTIONS["flash_kvcache_paged"].extend(
                "flash_kvcache_paged_fp8",
                descales="qkv",
                fp8_dtypes=("float8_e4m3fn",),
                signature=CONVENTIONS["flash_kvcache_paged"].signature + _FA3_SIG,
            ),
        )
    }
)

# The atlas' outside implementations (MLX, tinygrad, Keras, Flax, Hugging Face, FlexAttention,
# Pallas, ONNX, Paddle): one registry with the rest, so ``attnspec check FN --convention keras``
# works as a built-in name does (`attnspec.backends.atlas` runs the frameworks' own functions through them)
from attnspec.backends.conventions.atlas import ATLAS_CONVENTIONS  # noqa: E402

CONVENTIONS.update(ATLAS_CONVENTIONS)
