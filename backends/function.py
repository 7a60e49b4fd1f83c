"""`from_function`: a plain attention function, called by a convention, as a Backend.

    from attnspec.backends import from_function
    import torch.nn.functional as F
    b = from_function(F.scaled_dot_product_attention, convention="torch_sdpa")

The backend validates every call by the spec's rules (bad input raises the spec's `SpecError`
before the function is called), refuses what the convention cannot carry, and otherwise calls
the function once, exactly as the convention says (`attnspec.backends.conventions`). What it
returns is what the function returned, moved back to the spec's layout: a measurement, never a
fix. `supports` is derived from the convention and from the capability probe
(`attnspec.backends.probe`), run on first use or read from ``ATTNSPEC_CAPABILITIES``.

A convention that passes descales (`Convention.descales`: ``flash3_fp8``...) makes the backend
implement ``sdpa_fp8`` too: the FP8 arrays go to the function in their FP8 dtype with the
descales as keywords, and its output is judged by the P precision the convention claims
(``fp8_p_precision``). Through any other convention sdpa_fp8 is refused as not expressible.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from attnspec.backends.arrays import ArrayLibrary, array_library
from attnspec.backends.authoring import plan_sdpa
from attnspec.backends.base import FLOAT_DTYPES, Backend, Unsupported
from attnspec.backends.conventions import Convention, call_needs, describe, fp8_call_needs, get_convention
from attnspec.backends.probe import Capabilities, probe
from attnspec.errors import SpecError
from attnspec.spec.fp8 import FP8_DTYPES, validate_fp8
from attnspec.spec.options import ARRAY_NAMES, FP8_OPTIONS, VALUE_NAMES, take, with_options
from attnspec.spec.validate import ArrayInfo

__all__ = ["FunctionBackend", "from_function"]

#: env var naming a JSON file {backend name: probe findings}, written by `attnspec check`
CAPABILITIES_ENV = "ATTNSPEC_CAPABILITIES"


class FunctionBackend(Backend):
    """A function called through a `Convention` on an `ArrayLibrary`'s arrays (sdpa only)."""

    implements = frozenset({"sdpa"})

    def __init__(
        self,
        fn: Callable[..., Any],
        convention: str | Convention,
        *,
        name: str | None = None,
        dtypes: tuple[str, ...] | None = None,
        device: str | None = None,
        arrays: str | ArrayLibrary | None = None,
        capabilities: Capabilities | None = None,
        deviations: str | None = None,
    ) -> None:
        if not callable(fn):
            raise SpecError(f"from_function: fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.convention = get_convention(convention)
        # sdpa_fp8 only through a convention that passes descales; its claims are the convention's
        self.implements = frozenset({"sdpa", "sdpa_fp8"} if self.convention.descales else {"sdpa"})  # type: ignore[misc]
        self.fp8_dtypes = self.convention.fp8_dtypes  # type: ignore[misc]
        self.fp8_p_precision = self.convention.fp8_p_precision  # type: ignore[misc]
        self.arrays = array_library(arrays or self.convention.arrays)
        self.name = name or f"{getattr(fn, '__qualname__', 'fn')}@{self.convention.name}"
        if dtypes is not None:
            bad = [d for d in dtypes if d not in FLOAT_DTYPES]
            if bad or not dtypes:
                raise SpecError(
                    f"from_function: dtypes={tuple(dtypes)!r} must be a non-empty subset of "
                    f"{', '.join(FLOAT_DTYPES)}"
                )
        self.dtypes = tuple(dtypes) if dtypes else FLOAT_DTYPES
        self.device = device
        self._capabilities = capabilities
        #: a backend name whose declared deviations this one shares (e.g. "torch-native")
        self.deviations_of = deviations
        #: record the arguments of each call of fn in ``last_call`` (the atlas' reproducers)
        self.record_calls = False
        self.last_call: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self.last_result: Any = None
        #: the convention's causes for the last sdpa call's output (`Convention.output_causes`)
        self.last_causes: list[str] = []
        #: Python lines a standalone reproducer runs first (environment a framework needs)
        self.preamble: list[str] = []
        #: Python source a standalone reproducer pastes whole instead of importing fn's module
        self.inline_source: str | None = None

    # -- arrays --------------------------------------------------------------------------------
    def devices(self) -> list[str]:
        return [self.device] if self.device else self.arrays.devices()

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> Any:
        return self.arrays.asarray(x, dtype, device or self.device)

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.arrays.to_numpy(x)

    def dtype_name(self, x: Any) -> str:
        return self.arrays.dtype_name(x)

    def device_of(self, x: Any) -> str:
        return self.arrays.device_of(x)

    def synchronize(self) -> None:
        self.arrays.synchronize()

    def numerics_policy(self) -> dict[str, Any]:
        return self.arrays.numerics_policy()

    # -- capability ----------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """The probe's findings: from ``ATTNSPEC_CAPABILITIES`` if it has this backend, else probed now."""
        if self._capabilities is None:
            path = os.environ.get(CAPABILITIES_ENV)
            found = None
            if path and os.path.exists(path):
                with open(path) as f:
                    found = json.load(f).get(self.name)
            self._capabilities = Capabilities.from_json(found) if found is not None else probe(self)
        return self._capabilities

    def supports(self, feature: str, **case: Any) -> list[str]:
        if feature == "sdpa_fp8" and not self.convention.descales:
            return self.convention.refusals(
                fp8_call_needs((1, 1, 1), (1, 1, 1), (1, 1, 1), {}, FP8_DTYPES[0])
            )
        reasons = super().supports(feature, **case)
        if reasons or feature not in ("sdpa", "sdpa_fp8") or case.get("bad_input") or case.get("no_call"):
            return reasons  # bad input is refused by the spec's validation, before the function
        if feature == "sdpa_fp8":  # q's dtype: the case's, else FP8 when it has a q_descale
            fp8_q = case.get("dtype") if case.get("q_descale") is not None else None
            q_dtype = str(case.get("q_dtype") or fp8_q or "wide")
            call = fp8_call_needs(case["q_shape"], case["k_shape"], case["v_shape"], case, q_dtype)
        else:
            call = call_needs(case["q_shape"], case["k_shape"], case["v_shape"], case)
        return self.convention.refusals(call) + self.capabilities.refusals(case.get("dtype"), call)

    def describe(self) -> dict[str, str]:
        """What the report shows about this backend."""
        return {
            "function": describe(self.fn),
            "convention": self.convention.name,
            "signature": self.convention.signature,
            "arrays": self.arrays.name,
        }

    # -- the spec's function -------------------------------------------------------------------
    def variant_refusals(self, feature: str, options: dict[str, Any]) -> list[str]:
        if feature == "sdpa":
            return []  # the convention decides (`supports` asks it), with reasons naming it
        return super().variant_refusals(feature, options)

    @with_options()
    def sdpa(self, q: Any, k: Any, v: Any, **options: Any) -> Any:
        fn = f"{self.name}.sdpa"
        options = take(fn, options)
        p = plan_sdpa(
            fn,
            q,
            k,
            v,
            library=self.arrays,
            **{name: value for name, value in options.items() if name != "return_weights"},
        )
        return_weights = options["return_weights"]
        refused = self.convention.refusals(call_needs(q.shape, k.shape, v.shape, options))
        if refused:
            raise Unsupported(f"{fn}: " + "; ".join(refused))
        return self._through_convention(fn, p, q, k, v, options, return_weights)

    def _through_convention(
        self,
        fn: str,
        p: Any,
        q: Any,
        k: Any,
        v: Any,
        options: dict[str, Any],
        return_weights: bool,
        extra: dict[str, Any] | None = None,
    ) -> Any:
        """Call the function once through the convention (``extra`` keywords added to its call:
        an FP8 call's descales) and return what the spec function returns."""
        self.last_causes = []
        call = self.fn
        if self.record_calls or extra:  # keep the exact arguments, for reproducers that call fn directly

            def call(*args: Any, **kwargs: Any) -> Any:
                kwargs.update(extra or {})
                if self.record_calls:
                    self.last_call = (args, kwargs)
                self.last_result = self.fn(*args, **kwargs)
                return self.last_result

        out, weights = self.convention.call(call, self.arrays, p, q, k, v, options)
        lse = None
        if p.return_lse:  # a convention that carries lse returns (out, lse) as its output
            out, lse = out
        self.last_causes = self.convention.output_causes(p, self.arrays, q, k, v, options, out)
        if return_weights and weights is None:
            raise Unsupported(f"{fn}: the function returned no attention weights")
        found = [out] + ([weights] if return_weights else []) + ([lse] if p.return_lse else [])
        return found[0] if len(found) == 1 else tuple(found)

    @with_options(table=FP8_OPTIONS)
    def sdpa_fp8(self, q: Any, k: Any, v: Any, **options: Any) -> Any:
        fn = f"{self.name}.sdpa_fp8"
        lib = self.arrays
        o = take(fn, options, table=FP8_OPTIONS)
        given = {name: o.pop(name) for name in ("q_descale", "k_descale", "v_descale")}
        out_dtype = o.pop("out_dtype")

        def info(x: Any) -> ArrayInfo:
            return ArrayInfo(tuple(x.shape), lib.dtype_name(x))

        def host(x: Any) -> Any:  # descales and lengths are read by value
            return lib.to_numpy(x) if lib.is_array(x) else x

        fp = validate_fp8(
            fn,
            info(q),
            info(k),
            info(v),
            **{name: host(x) for name, x in given.items()},
            out_dtype=out_dtype,
            return_lse=o["return_lse"],
            **{name: None if o[name] is None else info(o[name]) for name in ARRAY_NAMES},
            **{name: host(o[name]) if name.endswith("_lengths") else o[name] for name in VALUE_NAMES},
        )
        options = {**o, "out_dtype": fp.out_dtype}
        return_weights = o["return_weights"]
        refused = self.convention.refusals(fp8_call_needs(q.shape, k.shape, v.shape, options, fp.q_dtype))
        if refused:
            raise Unsupported(f"{fn}: " + "; ".join(refused))
        device = self.device_of(q) if lib.is_array(q) else self.device
        descales = self.convention.descale_keywords(fp, lib, given, device)
        return self._through_convention(fn, fp.sdpa, q, k, v, options, return_weights, descales)


def from_function(
    fn: Callable[..., Any],
    convention: str | Convention,
    *,
    name: str | None = None,
    dtypes: tuple[str, ...] | None = None,
    device: str | None = None,
    arrays: str | ArrayLibrary | None = None,
    deviations: str | None = None,
) -> FunctionBackend:
    """A Backend that checks ``fn`` called by ``convention``.

    Args:
        fn: the attention function.
        convention: a name from `attnspec.backends.conventions.CONVENTIONS` (``torch_sdpa``,
            ``flash``, ``jax``, ``tutorial``) or a `Convention`.
        name: the backend's name in reports (default ``qualname@convention``).
        dtypes: the dtypes to check (default all four floats; the probe drops those it refuses).
        device: the device to put arrays on (default the array library's first).
        arrays: the array library the function takes (default the convention's: torch for
            torch_sdpa, flash and tutorial, jax for jax); ``"numpy"`` for a NumPy function.
        deviations: a backend name whose declared deviations apply to this function too
            (``"torch-native"`` for a wrapper of torch's SDPA).

    Raises:
        SpecError: an unknown convention or array library, or a bad dtype.
    """
    return FunctionBackend(
        fn, convention, name=name, dtypes=dtypes, device=device, arrays=arrays, deviations=deviations
    )
