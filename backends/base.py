"""The backend contract.

A backend adapts one array framework to attnspec. It exposes the spec's public functions with
the spec's signatures, on the framework's own arrays, plus the few hooks the conformance suite
needs (conversion, devices and the device of an array, dtypes, synchronization, and a per-case
support query).

Feature names used by `supports` (the conformance suite asks with these, and reports them):
    sdpa                 any sdpa call (the case carries the options used)
    sdpa_vjp, mha, mha_vjp, lsh_attention, lsh_attention_vjp, sdpa_blocked
    sdpa_fp8             q, k, v stored in FP8 with descales (`attnspec.spec.sdpa_fp8`); its
                         ``dtype`` is the FP8 storage dtype, which `supports` checks against
                         ``fp8_dtypes`` (not ``dtypes``); ``out_dtype`` and a wide q's dtype go
                         in ``dtypes`` and are checked against ``dtypes``. A backend that rounds
                         P to e4m3 before P @ V (FlashAttention-3) says so in ``fp8_p_precision``
                         and the suite judges it by that claim (`attnspec.spec.tolerance_fp8`)
The attention variants of issue #15 are features of their own, named by `variant_features` from
a call's keywords (one name per variant: ``softcap``, ``alibi``, ``sinks``, ``lse``,
``segments``, ``causal_lower_right_lengths``, ``dropout``, and ``dropout_drawn`` for a
``dropout_p > 0`` given without a mask, which asks the backend to draw its own); a backend lists
the ones it implements in ``variants``, and `supports` refuses the rest for sdpa, sdpa_blocked,
sdpa_vjp, mha and mha_vjp (mha passes them to its per-head sdpa).
The ``case`` keywords are the call's own options plus ``dtype`` (a name from FLOAT_DTYPES),
``device`` and the shapes ``q_shape``, ``k_shape``, ``v_shape``; ``bad_input=True`` marks a case
that must be refused by validation, ``no_call=True`` one that inspects the backend without
calling it (the signature check).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from attnspec.spec.dtypes import DTYPE_NAMES
from attnspec.spec.fp8 import FP8_DTYPES
from attnspec.spec.mha_params import ParamSizes
from attnspec.spec.options import (
    FP8_OPTIONS,
    LSH_OPTIONS,
    VARIANT_FEATURES,
    FP8Options,
    LSHInputs,
    LSHOptions,
    SDPAInputs,
    SDPAOptions,
    with_options,
)
from attnspec.spec.validate import FLOAT_DTYPES

#: the dtype names `Backend.dtype_name` may read off a framework's dtype object
_DTYPE_NAMES = frozenset((*DTYPE_NAMES, *FP8_DTYPES))

if TYPE_CHECKING:  # typing.Unpack is 3.11's; mypy reads typing_extensions' from its own stubs
    from typing_extensions import Unpack

__all__ = [
    "DRAWN_VARIANTS",
    "FLOAT_DTYPES",
    "SPEC_FUNCTIONS",
    "VARIANT_FEATURES",
    "Backend",
    "MHAArrays",
    "Unsupported",
    "variant_features",
]

#: the spec functions a backend may implement (methods of the same name and signature)
SPEC_FUNCTIONS = (
    "sdpa",
    "sdpa_vjp",
    "mha",
    "mha_vjp",
    "lsh_attention",
    "lsh_attention_vjp",
    "sdpa_blocked",
    "sdpa_fp8",
)


#: variants the spec cannot compute, because the backend draws random numbers of its own:
#: ``dropout_drawn`` is ``dropout_p > 0`` without a ``dropout_mask`` (spec decision 18). Kept
#: apart from VARIANT_FEATURES so that ``variants = frozenset(VARIANT_FEATURES)`` never claims it;
#: the suite checks it statistically (`attnspec.conformance.test_dropout`)
DRAWN_VARIANTS = ("dropout_drawn",)
#: the spec functions that take the variant keywords
VARIANT_FUNCTIONS = ("sdpa", "sdpa_blocked", "sdpa_vjp", "mha", "mha_vjp")


def variant_features(options: dict[str, Any]) -> list[str]:
    """The variants a call's keywords use, as names from `VARIANT_FEATURES` then `DRAWN_VARIANTS`
    (in that order).

    A keyword at its default uses nothing: ``dropout_p=0`` without a mask, ``return_lse=False``.
    ``dropout_p`` with a mask is ``dropout``; without one, ``dropout_drawn``.
    """
    o = options
    used = {
        "softcap": o.get("softcap") is not None,
        "alibi": o.get("alibi_slopes") is not None,
        "sinks": o.get("sinks") is not None,
        "lse": bool(o.get("return_lse")),
        "segments": o.get("q_segment_ids") is not None or o.get("kv_segment_ids") is not None,
        "causal_lower_right_lengths": o.get("causal") == "lower_right_lengths",
        "dropout": o.get("dropout_mask") is not None,
        "dropout_drawn": o.get("dropout_mask") is None and bool(o.get("dropout_p")),
    }
    return [f for f in (*VARIANT_FEATURES, *DRAWN_VARIANTS) if used[f]]


class Unsupported(NotImplementedError):
    """Raised by a backend function the backend does not implement (with the reason)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class MHAArrays(ParamSizes):
    """`attnspec.spec.MHAParams` on a backend's own arrays (made by `Backend.asparams`).

    Same fields and layout as MHAParams (torch.nn.Linear's (out_features, in_features)); a missing
    bias is None. The arrays are whatever the backend computes with, so they can be trained
    through the framework's autodiff (torch tensors with ``requires_grad``; a JAX pytree).
    """

    w_q: Any
    b_q: Any = None
    w_k: Any
    b_k: Any = None
    w_v: Any
    b_v: Any = None
    w_o: Any
    b_o: Any = None


class Backend:
    """Base class: subclasses set ``name``, ``dtypes`` and implement the array hooks and sdpa.

    Functions a backend does not implement raise `Unsupported`, and `supports` reports them, so
    the suite can tell "unsupported: reason" apart from "failed".
    """

    #: class attributes for the built-ins; a backend made at run time (`from_function`) sets its own
    name: str = "abstract"
    dtypes: tuple[str, ...] = FLOAT_DTYPES
    #: the spec functions this backend implements; `supports` refuses the others. Derived from
    #: the methods a subclass overrides (see `__init_subclass__`), unless the class sets it.
    implements: ClassVar[frozenset[str]] = frozenset()
    #: the variants (names from `VARIANT_FEATURES`) its sdpa functions implement; `supports`
    #: refuses the others, and `refuse_variants` raises for them when called anyway
    variants: ClassVar[frozenset[str]] = frozenset()
    #: the deviations this backend is known to show, as `attnspec.backends.deviations.Deviation`
    #: records (a plugin declares its own here; the conformance suite counts their cases as declared)
    deviations: ClassVar[tuple[Any, ...]] = ()
    #: the FP8 storage dtypes its sdpa_fp8 takes (FA3 takes only float8_e4m3fn)
    fp8_dtypes: ClassVar[tuple[str, ...]] = FP8_DTYPES
    #: the precision of the weights its sdpa_fp8 multiplies V by: "float32", or "float8_e4m3fn"
    #: for a kernel that rounds P as FlashAttention-3 does (`attnspec.spec.tolerance_fp8`)
    fp8_p_precision: ClassVar[str] = "float32"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "implements" not in cls.__dict__:
            cls.implements = frozenset(
                fn for fn in SPEC_FUNCTIONS if getattr(cls, fn) is not getattr(Backend, fn)
            )

    # -- arrays -----------------------------------------------------------------------------
    #: the arrays `is_array` accepts, as a refusal names them ("torch.Tensor")
    array_type: str = "array"

    def is_array(self, x: Any) -> bool:
        """Whether ``x`` is one of this backend's arrays. The built-ins say, so that `library`
        checks their calls; a backend that never uses `library` need not."""
        raise NotImplementedError(f"{self.name} does not say which arrays are its own (is_array)")

    @property
    def library(self) -> Any:
        """This backend's arrays as an `attnspec.backends.arrays.ArrayLibrary`, for the public
        authoring API (``plan_sdpa(..., library=backend.library)``): the built-ins check their
        calls with it, as any author's function is checked."""
        from attnspec.backends.arrays import BackendArrays

        return BackendArrays(self)

    def _plan_of(self, fn: str, q: Any, k: Any, v: Any, options: dict[str, Any]) -> Any:
        """The spec's checks of one sdpa call on this backend's arrays (an `SDPAPlan`), by the
        public `attnspec.backends.authoring.plan_sdpa`. ``options`` are the call's keywords as
        one dict (as `attnspec.spec.options.take` gives them); ``return_weights``, the caller's
        to act on, is left out."""
        from attnspec.backends.authoring import plan_sdpa

        return plan_sdpa(
            fn,
            q,
            k,
            v,
            library=self.library,
            **{name: x for name, x in options.items() if name != "return_weights"},
        )

    def _info(self, fn: str, name: str, x: Any) -> Any:
        """The `ArrayInfo` of argument ``name`` of ``fn``, or SpecError when it is not one of
        this backend's arrays."""
        return self.library.info(fn, name, x)

    def devices(self) -> list[str]:
        return ["cpu"]

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> Any:
        raise NotImplementedError

    def to_numpy(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def device_of(self, x: Any) -> str:
        """The device one of this backend's arrays lives on, named as `devices` and
        ``asarray(device=...)`` name it. The suite checks it for every result.

        The default, ``"cpu"``, fits a backend whose arrays live in host memory (the default
        `devices` is ``["cpu"]``); a backend with other devices overrides both.
        """
        return "cpu"

    def synchronize(self) -> None:
        """Block until queued device work is done (timing reads the clock only after this)."""

    def dtype_name(self, x: Any) -> str:
        """The canonical dtype name of one of this backend's arrays (``float32``, ``bool``...).

        The default reads NumPy's name of ``x.dtype`` or, for a framework's own dtype object
        (``torch.float32``, ``mlx.core.float32``), the last dotted part of its name when that is a
        dtype the kit knows; any other raises TypeError saying to override this method.
        """
        try:
            return str(np.dtype(x.dtype).name)
        except TypeError:
            name = str(x.dtype).rsplit(".", 1)[-1]
        if name not in _DTYPE_NAMES:
            raise TypeError(
                f"{self.name}.dtype_name: cannot name the dtype {x.dtype!r} of a {type(x).__name__}: "
                "override Backend.dtype_name to name your arrays' dtypes (float32, bool, ...)"
            )
        return name

    def numerics_policy(self) -> dict[str, Any]:
        """Turn off reduced-precision shortcuts (TF32, bf16 matmul passes) and report the settings.

        The conformance suite calls this before it runs, so float32 is judged as float32. The
        settings are process-wide, which is why constructing a backend does not change them
        (JAX's x64 switch excepted: without it JAX has no float64 at all).
        Returns ``{setting: value}`` as set; empty when the framework has no such switch.
        """
        return {}

    def asparams(self, params: Any, dtype: str | None = None, device: str | None = None) -> MHAArrays:
        """`MHAParams` (NumPy) -> `MHAArrays` of this backend's arrays, each through `asarray`."""
        return MHAArrays(
            **{
                f.name: None
                if getattr(params, f.name) is None
                else self.asarray(getattr(params, f.name), dtype, device)
                for f in fields(MHAArrays)
            }
        )

    # -- capability -------------------------------------------------------------------------
    def supports(self, feature: str, **case: Any) -> list[str]:
        """Reasons this backend cannot run ``feature`` for ``case``; empty means supported."""
        reasons = []
        if feature not in self.implements:
            reasons.append(f"{self.name} does not implement {feature}")
        dtype = case.get("dtype")
        known = self.fp8_dtypes if feature == "sdpa_fp8" else self.dtypes  # sdpa_fp8's dtype: storage
        if dtype is not None and dtype not in known:
            reasons.append(f"{self.name} has no {dtype} (supports {', '.join(known)})")
        missing = sorted({d for d in case.get("dtypes", ()) if d not in self.dtypes and d != dtype})
        if missing:  # a case that mixes dtypes (bad input) needs each of them
            reasons.append(f"{self.name} has no {', '.join(missing)} (supports {', '.join(self.dtypes)})")
        device = case.get("device")
        if device is not None and device not in self.devices():
            reasons.append(f"{self.name} cannot run on device {device!r} here")
        if feature in VARIANT_FUNCTIONS and not case.get("bad_input"):
            reasons += self.variant_refusals(feature, case)
        elif feature == "sdpa" and case.get("bad_input"):
            # dropout_p without a mask is bad input to the spec, but valid to a backend that draws one
            reasons += [
                f"{self.name}.sdpa implements the {v} variant: this call is valid input to it"
                for v in variant_features(case)
                if v in DRAWN_VARIANTS and v in self.variants
            ]
        return reasons

    def variant_refusals(self, feature: str, options: dict[str, Any]) -> list[str]:
        """Why ``feature`` cannot run the variants of ``options`` (empty when it can)."""
        return [
            f"{self.name}.{feature} does not implement the {v} variant"
            for v in variant_features(options)
            if v not in self.variants
        ]

    def refuse_variants(self, feature: str, options: dict[str, Any]) -> None:
        """Raise `Unsupported` when ``options`` use a variant this backend does not implement:
        a keyword it cannot honour is refused, never ignored."""
        reasons = self.variant_refusals(feature, options)
        if reasons:
            raise Unsupported("; ".join(reasons))

    # -- the spec's functions ---------------------------------------------------------------
    # The contract a backend author reads and overrides. The keywords are those of
    # attnspec.spec.options, the one table: ``**options`` is typed by its TypedDicts, so mypy
    # checks an override that spells them out (as the example plugin does) against the table,
    # and ``with_options`` shows them to ``inspect.signature`` and ``help``.
    @with_options()
    def sdpa(self, q: Any, k: Any, v: Any, **options: Unpack[SDPAOptions]) -> Any:
        raise Unsupported(f"{self.name} does not implement sdpa")

    @with_options(after=("block_q", "block_k"))
    def sdpa_blocked(
        self,
        q: Any,
        k: Any,
        v: Any,
        *,
        block_q: int = 256,
        block_k: int = 512,
        **options: Unpack[SDPAOptions],
    ) -> Any:
        raise Unsupported(f"{self.name} does not implement sdpa_blocked")

    @with_options(table=FP8_OPTIONS)
    def sdpa_fp8(self, q: Any, k: Any, v: Any, **options: Unpack[FP8Options]) -> Any:
        raise Unsupported(f"{self.name} does not implement sdpa_fp8")

    @with_options(outputs=False)
    def sdpa_vjp(self, q: Any, k: Any, v: Any, d_out: Any, **options: Unpack[SDPAInputs]) -> Any:
        raise Unsupported(f"{self.name} does not implement sdpa_vjp")

    @with_options()
    def mha(
        self,
        query: Any,
        key: Any,
        value: Any,
        params: Any,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        **options: Unpack[SDPAOptions],
    ) -> Any:
        raise Unsupported(f"{self.name} does not implement mha")

    @with_options(table=LSH_OPTIONS)
    def lsh_attention(self, x: Any, v: Any, **options: Unpack[LSHOptions]) -> Any:
        raise Unsupported(f"{self.name} does not implement lsh_attention")

    @with_options(outputs=False)
    def mha_vjp(
        self,
        query: Any,
        key: Any,
        value: Any,
        params: Any,
        d_out: Any,
        *,
        num_heads: int,
        num_kv_heads: int | None = None,
        **options: Unpack[SDPAInputs],
    ) -> Any:
        raise Unsupported(f"{self.name} does not implement mha_vjp")

    @with_options(outputs=False, table=LSH_OPTIONS)
    def lsh_attention_vjp(self, x: Any, v: Any, d_out: Any, **options: Unpack[LSHInputs]) -> Any:
        raise Unsupported(f"{self.name} does not implement lsh_attention_vjp")

    def __repr__(self) -> str:
        return f"<attnspec backend {self.name!r}>"


def spec_signature_mismatches(backend: Backend) -> list[str]:
    """Public spec functions whose backend signature differs from the spec's (for the tests)."""
    import attnspec.spec as spec

    problems = []
    for fn in sorted(backend.implements):
        ours = inspect.signature(getattr(spec, fn))
        theirs = inspect.signature(getattr(backend, fn))
        if list(ours.parameters) != list(theirs.parameters) or any(
            ours.parameters[p].kind != theirs.parameters[p].kind
            or ours.parameters[p].default != theirs.parameters[p].default
            for p in ours.parameters
        ):
            problems.append(f"{backend.name}.{fn}{theirs} != spec.{fn}{ours}")
    return problems
