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
                is bool (True = attend) or an additive float mask. Lower-right causal, windows
                and lengths go into ``attn_mask``; a bias makes it a float mask with -inf where
                not visible. No weights.
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
                (`attnspec.backends.conventions_flash`).
``flash_kvcache_paged``, ``vllm_paged``  paged KV caches: FlashAttention's
                ``flash_attn_with_kvcache`` with ``block_table`` and vLLM's ``ref_paged_attn``, keys
                scattered into a shuffled pool whose every slot outside a sequence is NaN
                (`attnspec.backends.conventions_paged`).
``jax``         ``fn(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
                query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None)``
                on (B, T, N, H) arrays (``jax.nn.dot_product_attention``). ``is_causal`` and
                ``local_window_size`` are upper-left; lower-right causal goes into ``mask``.
                No weights.
``tutorial``    ``fn(Q, K, V, mask=None) -> (output, weights)`` on (..., H, L, D) arrays, mask
                1/True = keep, scale fixed at 1/sqrt(dk) (the tutorials in ``shared/seeds``).
                Every rule goes into ``mask``; GQA by repeating kv heads (h // G). No bias, no
                scale.

Add one with `register_convention` (a `Convention` subclass instance).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from attnspec._errors import SpecError
from attnspec.backends._base import DRAWN_VARIANTS, VARIANT_FEATURES, variant_features
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
from attnspec.spec._validate import SDPAPlan

__all__ = ["CANONICAL", "CONVENTIONS", "NEEDS", "Call", "Convention", "call_needs", "canonical_inputs",
           "get_convention", "register_convention"]

#: what a call can ask of an implementation, beyond its dtype: the names the probe and the
#: conventions' refusals use
NEEDS = (
    "gqa", "dk_ne_dv", "rank2", "rank3", "rank4", "rank5", "batch_broadcast", "empty", "scale", "mask",
    "mask_broadcast", "bias",
    "causal_upper_left", "causal_lower_right", "window", "window_lower_right",
    "q_lengths", "kv_lengths", "return_weights",
    *VARIANT_FEATURES,
)


@dataclass(frozen=True)
class Call:
    """What one sdpa call needs (a subset of `NEEDS`) and its sizes."""

    needs: frozenset[str]
    n: int
    m: int


def call_needs(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v_shape: tuple[int, ...],
               options: dict[str, Any]) -> Call:
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


def _variant_refusal(convention: str, variant: str) -> str:
    """Why ``convention`` refuses ``variant``: it maps no argument of the function to it."""
    if variant == "dropout_drawn":  # the function may well take dropout_p: the convention passes none
        return (f"the {convention} convention passes no dropout_p to the function, so dropout the "
                f"function draws itself is not checked through it")
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

    def extend(self, name: str, *, keywords: dict[str, str] | None = None,
               refuse: dict[str, str] | None = None, canonical: bool | None = None,
               signature: str | None = None) -> Convention:
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
        """
        import copy

        keywords = dict(keywords or {})
        bad = sorted(set(keywords) - set(_PASSED_OPTIONS))
        if bad:
            raise SpecError(f"{self.name}.extend: keywords={keywords!r}: {', '.join(bad)} cannot be passed as a "
                            f"keyword; expected spec options among {', '.join(_PASSED_OPTIONS)}")
        bad = sorted(set(refuse or {}) - set(NEEDS))
        if bad:
            raise SpecError(f"{self.name}.extend: refuse={refuse!r}: {', '.join(bad)} is not a need; expected "
                            f"names among {', '.join(NEEDS)}")
        new = copy.copy(self)
        new.name = name
        new.keywords = {**self.keywords, **keywords}
        passed = {_PASSED_OPTIONS[o] for o in keywords}
        new.variants = self.variants | passed
        # a class-level table in the built-ins: the new one is this instance's own
        new.__dict__["cannot"] = {**{k: v for k, v in self.cannot.items() if k not in passed}, **(refuse or {})}
        if canonical is not None:
            new.canonical = canonical
        extra = "".join(f", {kw}=<{o}>" for o, kw in keywords.items())
        new.signature = signature or (self.signature + (f"; plus {extra[2:]}" if extra else "")
                                      + ("; canonical 4-D inputs, full-size masks" if new.canonical
                                         and not self.canonical else ""))
        return new

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
        return why + [_variant_refusal(self.name, v) for v in (*VARIANT_FEATURES, *DRAWN_VARIANTS)
                      if v in call.needs and v not in self.variants and v not in self.cannot]

    def call(self, fn: Callable[..., Any], lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any,
             options: dict[str, Any]) -> tuple[Any, Any]:
        """Call ``fn`` for the validated call ``p``; return (out in ``p.out_shape``, weights or None)."""
        raise NotImplementedError

    def output_causes(self, p: SDPAPlan, lib: ArrayLibrary, q: Any, k: Any, v: Any, options: dict[str, Any],
                      out: Any) -> list[str]:
        """Causes this convention's layout shows in ``out`` (the spec-shaped output of the call just
        made), each beginning with one of `attnspec.conformance.causes.CAUSE_PREFIXES`; the judge
        adds them to a failure's message. None by default (the paged conventions name a NaN read
        from their trap slots)."""
        return []

    def __repr__(self) -> str:
        return f"<attnspec convention {self.name!r}: {self.signature}>"


#: the spec options `Convention.extend` can pass through a keyword -> the variant each carries
_PASSED_OPTIONS = {"softcap": "softcap", "sinks": "sinks", "alibi_slopes": "alibi"}


def canonical_inputs(p: SDPAPlan, lib: ArrayLibrary, q: Any, k: Any, v: Any,
                     mask: np.ndarray | None) -> tuple[Any, Any, Any, Any]:
    """q, k, v as (B, H, L, d) and a mask (NumPy, broadcasting to the call) as the full-size
    (B, Hq, n, m) array on q's device, for a convention with canonical inputs."""
    qf, kf, vf = flat_qkv(p, q, k, v)
    return qf, kf, vf, None if mask is None else full_mask(p, lib, flatten_mask(p, mask), _device(lib, q))


def full_mask(p: SDPAPlan, lib: ArrayLibrary, mask: Any, device: str | None) -> Any:
    """A (B, Hq or 1, n, m) mask (NumPy or ``lib``'s) as the full-size (B, Hq, n, m) array of
    ``lib`` on ``device``: no size-1 axis left for the function to broadcast."""
    full = np.broadcast_to(lib.to_numpy(mask) if lib.is_array(mask) else np.asarray(mask),
                           (math.prod(p.batch), p.hq, p.n, p.m))
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
    signature = ("fn(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, "
                 "enable_gqa=False) on (..., H, L, D) arrays")
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {"return_weights": "returns no attention weights"}
    causal_flag = "upper_left"

    def call(self, fn: Callable[..., Any], lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any,
             options: dict[str, Any]) -> tuple[Any, Any]:
        kw: dict[str, Any] = {}
        if options.get("scale") is not None:
            kw["scale"] = p.scale
        if p.group > 1:
            kw["enable_gqa"] = True
        rules = (options.get(o) is not None for o in ("mask", "bias", "window", "q_lengths", "kv_lengths"))
        mask = None
        if p.causal == "upper_left" and not any(rules):
            kw["is_causal"] = True  # is_causal is upper-left
        elif options.get("bias") is not None:
            mask = additive_mask(p, options.get("mask"), options["bias"])
            assert mask is not None  # never None with a bias
        else:
            mask = attend_mask(p, options.get("mask"))
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
    signature = ("fn(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1)) on (B, L, H, D) "
                 "arrays, causal and window lower-right aligned")
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
            why.append("the flash convention anchors ALiBi lower-right (i + m - n): the spec's "
                       "upper-left anchor (no causal, or upper_left) differs when n != m")
        if call.n != call.m and "causal_upper_left" in call.needs:
            why.append("the flash convention's causal is lower-right: upper-left differs when n != m")
        if call.n != call.m and "window" in call.needs:
            why.append("the flash convention anchors windows lower-right: an upper-left window differs "
                       "when n != m")
        return why

    def call(self, fn: Callable[..., Any], lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any,
             options: dict[str, Any]) -> tuple[Any, Any]:
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
            kw["alibi_slopes"] = lib.asarray(np.ascontiguousarray(lib.to_numpy(slopes), np.float32),
                                             device=_device(lib, q))
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
    signature = ("fn(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False, "
                 "query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None) on "
                 "(B, T, N, H) arrays, is_causal and local_window_size upper-left")
    arrays = "jax"
    cannot: ClassVar[dict[str, str | None]] = {"return_weights": "returns no attention weights"}
    causal_flag = "upper_left"

    #: whether the function takes query_seq_lengths / key_value_seq_lengths and local_window_size
    #: (jax.nn does; Keras and Flax, which share its layout and flags, do not)
    lengths_arguments = True
    window_argument = True

    def call(self, fn: Callable[..., Any], lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any,
             options: dict[str, Any]) -> tuple[Any, Any]:
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
            kw["mask"] = lib.asarray(np.ascontiguousarray(flatten_mask(p, vis)), device=dev)  # (B, Hq or 1, n, m)
        if options.get("bias") is not None:
            kw["bias"] = flatten_mask(p, options["bias"])  # (B, Hq or 1, n, m)
        for spec_name, name in (("q_lengths", "query_seq_lengths"), ("kv_lengths", "key_value_seq_lengths")):
            lengths = getattr(p, spec_name)
            if lengths is not None and self.lengths_arguments:
                kw[name] = lib.asarray(np.reshape(lengths, (math.prod(p.batch),)).astype(np.int32), device=dev)  # (B,)
        if options.get("scale") is not None:
            kw["scale"] = p.scale
        if self.canonical and kw.get("mask") is not None:  # (B, 1, n, m) -> (B, Hq, n, m)
            kw["mask"] = full_mask(p, lib, kw["mask"], dev)
        out = _first(fn(qf, kf, vf, **kw, **self.pass_keywords(p, options)))  # (B, n, Hq, dv)
        return unflatten_batch(p, out, layout="blhd"), None


class Tutorial(Convention):
    name = "tutorial"
    signature = ("fn(Q, K, V, mask=None) -> (output, weights) on (..., H, L, D) arrays, mask 1/True = "
                 "keep, scale fixed at 1/sqrt(dk)")
    arrays = "torch"
    cannot: ClassVar[dict[str, str | None]] = {
        "bias": "has no bias argument",
        "scale": "fixes the scale at 1/sqrt(dk)",
    }

    def call(self, fn: Callable[..., Any], lib: ArrayLibrary, p: SDPAPlan, q: Any, k: Any, v: Any,
             options: dict[str, Any]) -> tuple[Any, Any]:
        vis = attend_mask(p, options.get("mask"))
        if self.canonical:
            q, k, v, vis = canonical_inputs(p, lib, q, k, v, vis)
        elif vis is not None:
            vis = lib.asarray(vis, device=_device(lib, q))
        if p.group > 1:  # query head h reads kv head h // G
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
    canonical = name.endswith(CANONICAL)
    base = name.removesuffix(CANONICAL)
    if base in CONVENTIONS:
        conv = CONVENTIONS[base]
    elif ":" in base:  # a convention defined in the user's own module
        from attnspec.backends import load_object

        conv = load_object(base)
        if isinstance(conv, type) and issubclass(conv, Convention):
            conv = conv()
        if not isinstance(conv, Convention):
            raise SpecError(f"convention={base!r} names a {type(conv).__name__}, not an attnspec Convention "
                            "(make one with get_convention('torch_sdpa').extend(...) or a Convention subclass)")
    else:
        raise SpecError(f"convention={name!r} is not one of {', '.join(CONVENTIONS)}, nor MODULE:ATTRIBUTE "
                        "naming a Convention")
    return conv.extend(name, canonical=True) if canonical and not conv.canonical else conv


#: the suffix of a convention name asking for canonical inputs: ``torch_sdpa+canonical``
CANONICAL = "+canonical"


def describe(fn: Callable[..., Any]) -> str:
    """``module.qualname(signature)`` of a function, for reports."""
    try:
        sig = str(inspect.signature(fn))
    except (TypeError, ValueError):
        sig = "(...)"
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}{sig}"


# FlashAttention's varlen and KV-cache functions (their module imports this one's names)
from attnspec.backends.conventions_flash import FlashKVCache, FlashVarlen  # noqa: E402
from attnspec.backends.conventions_paged import FlashKVCachePaged, VllmPaged  # noqa: E402

CONVENTIONS.update({c.name: c for c in (FlashVarlen(), FlashKVCache(), FlashKVCachePaged(), VllmPaged())})
