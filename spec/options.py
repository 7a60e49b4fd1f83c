"""The keywords of sdpa and of lsh_attention, once: every signature, variant list and option tuple
derives from here.

`attnspec.spec.sdpa` writes its signature out in full, because that signature is the definition
a reader reads; a test checks that it equals `signature()` below, keyword for keyword (name,
order, default and annotation). Every other form of the spec (`sdpa_loops`, `sdpa_blocked`,
`sdpa_fp8`, `sdpa_vjp`, `mha`, `mha_vjp`) and the `Backend` contract take ``**options`` and carry
``__signature__`` built from this table (`with_options`), so ``inspect.signature`` and ``help``
show the same keywords, and a keyword added to the table reaches every layer at once. A call
with a keyword the table does not have is refused as Python refuses it (`take`).

    OPTIONS                    the table: name, annotation, default, kind, variant
    LSH_OPTIONS                lsh_attention's table (`lsh_attention_vjp` and every backend's)
    FP8_OPTIONS                sdpa_fp8's: its descales and out_dtype, then sdpa's
    NAMES, INPUT_NAMES         every keyword; those a vjp takes (no return_* keywords)
    ARRAY_NAMES, VALUE_NAMES   the array keywords; those read by value
    VARIANT_FEATURES           the attention variants (issue #15), as feature names
    VARIANT_KEYWORDS           the keywords that belong to a variant
    VARIANT_ARRAYS             those of them that are arrays (the fields of `SDPAExtras`)
    with_options(...)          decorator: ``**options`` shown as the table's keywords
    take(fn, options, ...)     the call's keywords with the table's defaults, unknown ones refused
    SDPAInputs, SDPAOptions    the tables as TypedDicts, for ``**options: Unpack[SDPAOptions]``:
    LSHInputs, LSHOptions      how the `Backend` contract types its keywords for mypy (a test
    FP8Options                 holds each to its table)

The functions take ``table=LSH_OPTIONS`` for lsh_attention's keywords and ``table=FP8_OPTIONS``
for sdpa_fp8's; `attnspec.spec.lsh_attention` and `attnspec.spec.sdpa_fp8` write their own
keywords out as sdpa does, and a test checks each against its table.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

__all__ = [
    "ARRAY_NAMES",
    "FP8_OPTIONS",
    "INPUT_NAMES",
    "LSH_OPTIONS",
    "NAMES",
    "OPTIONS",
    "REQUIRED",
    "VALUE_NAMES",
    "VARIANT_ARRAYS",
    "VARIANT_FEATURES",
    "VARIANT_KEYWORDS",
    "FP8Options",
    "LSHInputs",
    "LSHOptions",
    "Option",
    "SDPAInputs",
    "SDPAOptions",
    "parameters",
    "signature",
    "take",
    "with_options",
]

F = TypeVar("F", bound=Callable[..., Any])


#: the default of a keyword the call must give (lsh_attention's rotations and chunk_length)
REQUIRED = inspect.Parameter.empty


@dataclass(frozen=True)
class Option:
    """One keyword of sdpa (or of lsh_attention).

    kind: "array" (an array the call passes, checked by shape and dtype), "value" (a Python
    value: a string, a pair, a number or lengths) or "output" (asks for another result).
    default: `REQUIRED` where the call must give it.
    variant: the name in `VARIANT_FEATURES` of the variant the keyword belongs to, or None for
    the core of the definition.
    """

    name: str
    annotation: str
    default: Any
    kind: str
    variant: str | None = None


_ARRAY = "np.ndarray | None"

#: every keyword of `attnspec.spec.sdpa`, in the order of its signature
OPTIONS: tuple[Option, ...] = (
    Option("mask", _ARRAY, None, "array"),
    Option("bias", _ARRAY, None, "array"),
    Option("causal", "str | None", None, "value"),
    Option("window", "tuple[int, int] | None", None, "value"),
    Option("scale", "float | None", None, "value"),
    Option("q_lengths", "np.ndarray | int | None", None, "value"),
    Option("kv_lengths", "np.ndarray | int | None", None, "value"),
    Option("softcap", "float | None", None, "value", "softcap"),
    Option("alibi_slopes", _ARRAY, None, "array", "alibi"),
    Option("sinks", _ARRAY, None, "array", "sinks"),
    Option("q_segment_ids", _ARRAY, None, "array", "segments"),
    Option("kv_segment_ids", _ARRAY, None, "array", "segments"),
    Option("dropout_mask", _ARRAY, None, "array", "dropout"),
    Option("dropout_p", "float | None", None, "value", "dropout"),
    Option("return_weights", "bool", False, "output"),
    Option("return_lse", "bool", False, "output", "lse"),
)

#: every keyword of `attnspec.spec.lsh_attention`, in the order of its signature
LSH_OPTIONS: tuple[Option, ...] = (
    Option("rotations", "np.ndarray", REQUIRED, "array"),
    Option("chunk_length", "int", REQUIRED, "value"),
    Option("causal", "bool", False, "value"),
    Option("kv_lengths", "np.ndarray | int | None", None, "value"),
    Option("dedup", "bool", False, "value"),
    Option("scale", "float | None", None, "value"),
    Option("return_buckets", "bool", False, "output"),
)

#: every keyword of `attnspec.spec.sdpa_fp8`, in the order of its signature: its own (the descale
#: factors, read by value, and the output dtype), then sdpa's
FP8_OPTIONS: tuple[Option, ...] = (
    Option("q_descale", "np.ndarray | float | None", None, "value"),
    Option("k_descale", "np.ndarray | float | None", None, "value"),
    Option("v_descale", "np.ndarray | float | None", None, "value"),
    Option("out_dtype", "str | None", None, "value"),
    *OPTIONS,
)

#: the attention variants, as the feature names a backend's ``variants`` holds and
#: `attnspec.backends.base.variant_features` reports, in that order. All but
#: ``causal_lower_right_lengths`` are keywords of the table; that one is a value of ``causal``.
VARIANT_FEATURES = ("softcap", "alibi", "sinks", "lse", "segments", "causal_lower_right_lengths", "dropout")

NAMES = tuple(o.name for o in OPTIONS)
#: the keywords of the vjp forms, which return gradients only
INPUT_NAMES = tuple(o.name for o in OPTIONS if o.kind != "output")
#: the array keywords (checked by shape and dtype) and the value keywords (read by value)
ARRAY_NAMES = tuple(o.name for o in OPTIONS if o.kind == "array")
VALUE_NAMES = tuple(o.name for o in OPTIONS if o.kind == "value")
VARIANT_KEYWORDS = tuple(o.name for o in OPTIONS if o.variant is not None)
VARIANT_ARRAYS = tuple(o.name for o in OPTIONS if o.variant is not None and o.kind == "array")


class SDPAInputs(TypedDict, total=False):
    """`OPTIONS` without the return_* keywords (the vjp forms' keywords), in the table's order.
    Arrays are ``Any``: a backend's keywords are its framework's arrays."""

    mask: Any
    bias: Any
    causal: str | None
    window: tuple[int, int] | None
    scale: float | None
    q_lengths: Any
    kv_lengths: Any
    softcap: float | None
    alibi_slopes: Any
    sinks: Any
    q_segment_ids: Any
    kv_segment_ids: Any
    dropout_mask: Any
    dropout_p: float | None


class SDPAOptions(SDPAInputs, total=False):
    """Every keyword of `OPTIONS`, in its order."""

    return_weights: bool
    return_lse: bool


class _FP8Keywords(TypedDict, total=False):
    q_descale: Any
    k_descale: Any
    v_descale: Any
    out_dtype: str | None


class FP8Options(_FP8Keywords, SDPAOptions, total=False):
    """Every keyword of `FP8_OPTIONS`, in its order."""


class _LSHRequired(TypedDict):
    rotations: Any
    chunk_length: int


class LSHInputs(_LSHRequired, total=False):
    """`LSH_OPTIONS` without return_buckets (`lsh_attention_vjp`'s keywords), in its order."""

    causal: bool
    kv_lengths: Any
    dedup: bool
    scale: float | None


class LSHOptions(LSHInputs, total=False):
    """Every keyword of `LSH_OPTIONS`, in its order."""

    return_buckets: bool


def parameters(
    *, outputs: bool = True, annotated: bool = True, table: tuple[Option, ...] = OPTIONS
) -> list[inspect.Parameter]:
    """The table's keywords as keyword-only `inspect.Parameter`s (without the return_* ones when
    ``outputs`` is False; annotations as the golden writes them when ``annotated``)."""
    empty = inspect.Parameter.empty
    return [
        inspect.Parameter(
            o.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=o.default,
            annotation=o.annotation if annotated else empty,
        )
        for o in table
        if outputs or o.kind != "output"
    ]


def signature(
    fn: Callable[..., Any],
    *,
    outputs: bool = True,
    after: tuple[str, ...] = (),
    table: tuple[Option, ...] = OPTIONS,
) -> inspect.Signature:
    """``fn``'s signature with its ``**options`` replaced by the table's keywords.

    ``fn``'s own keyword-only parameters come before the table's, except those named in
    ``after`` (`sdpa_blocked`'s tile sizes), which follow it, as the spec's signatures have them.
    """
    own = inspect.signature(fn)
    params = [p for p in own.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
    annotated = any(p.annotation is not inspect.Parameter.empty for p in params)
    first = [p for p in params if p.name not in after]
    last = [p for p in params if p.name in after]
    return own.replace(
        parameters=[*first, *parameters(outputs=outputs, annotated=annotated, table=table), *last]
    )


def with_options(
    *, outputs: bool = True, after: tuple[str, ...] = (), table: tuple[Option, ...] = OPTIONS
) -> Callable[[F], F]:
    """Decorator: show a function's ``**options`` as the table's keywords (`signature`).

    The function itself reads its keywords with `take`, which refuses one the table lacks.
    """

    def decorate(fn: F) -> F:
        fn.__signature__ = signature(fn, outputs=outputs, after=after, table=table)  # type: ignore[attr-defined]
        return fn

    return decorate


def take(
    fn: str, options: Mapping[str, Any], *, outputs: bool = True, table: tuple[Option, ...] = OPTIONS
) -> dict[str, Any]:
    """The call's keywords with the table's defaults for those not given.

    Raises ``TypeError`` for a keyword outside the table (or a return_* keyword where ``outputs``
    is False) and for a `REQUIRED` one not given, worded as Python words it for a signature that
    lacks or requires it.
    """
    known = [o for o in table if outputs or o.kind != "output"]
    names = {o.name for o in known}
    for name in options:
        if name not in names:
            raise TypeError(f"{fn}() got an unexpected keyword argument {name!r}")
    missing = [repr(o.name) for o in known if o.default is REQUIRED and o.name not in options]
    if missing:
        s = "s" if len(missing) > 1 else ""
        raise TypeError(
            f"{fn}() missing {len(missing)} required keyword-only argument{s}: {' and '.join(missing)}"
        )
    return {o.name: options.get(o.name, o.default) for o in known}
