"""The conformance vectors of sdpa_vjp, mha and lsh_attention (VECTORS.md; `attnspec.conformance.vectors`).

Each family draws its cases the way the suite's properties draw theirs, through a feature tour
(`attnspec.conformance.corners.Tour`) of the same strategies, and takes its expected outputs and
allowed errors from the same golden and tolerance functions the properties call, so that a result
judged through a bundle gets the verdict the suite would give it:

- `VJPVectors` (sdpa_vjp): the cases of conformance/test_grads.py's four golden-judging properties
  (matches_golden, variants_match_golden, masked_keys_get_zero, empty_rows_zero_and_finite), with
  their upstream gradient ``d_out`` drawn from the case's seed (`grads_cases.vjp_case`) and each
  gradient's allowed error from `test_grads.golden_vjp`. The exact zeros two of them demand
  (dk and dv of the hidden keys, dq of the rows with no visible key) are ``zero_rows``.
- `MHAVectors` (mha): the cases of conformance/test_mha.py's matches_golden and
  variants_match_golden, golden and allowed errors from `mha_cases.golden_for_mha`; the layer's
  parameters travel as tensors ``params.w_q``, ``params.b_q``, ...
- `LSHVectors` (lsh_attention): the cases of conformance/test_lsh.py's matches_golden, golden and
  allowed error from `lsh_cases.golden` and `lsh_cases.allowed`. The suite leaves low-margin
  positions out (a backend's bucket may legitimately differ there, and one moved bucket shifts its
  batch element's whole round); a bundle holds only cases without any, redrawing with the next
  seed, so every element of every output is compared as the suite compares it.

The properties these cannot carry (determinism, the metamorphic ones, bad input) need two calls or
a call that must raise; they stay with the suite.
"""

from __future__ import annotations

import zlib
from dataclasses import fields
from typing import Any

import numpy as np

from attnspec.conformance.vectors import Expected, Family, VectorCase, drawn_vector, json_options, register

__all__ = ["LSHVectors", "MHAVectors", "VJPVectors"]

#: how many redraws an lsh case may take to find one without a low-margin position
LSH_REDRAWS = 64


def _case_seed(*parts: object) -> int:
    """A case's seed, fixed by what names it (as `Family.cases` fixes the plain ones)."""
    return zlib.crc32("|".join(str(p) for p in parts).encode())


def _numbered(name: str, dtype: str, found: list[VectorCase]) -> list[VectorCase]:
    for i, c in enumerate(found):
        c.id = f"{name}-{dtype}-{i:04d}-{c.feature}"
    return found


# -- sdpa_vjp ----------------------------------------------------------------------------------


class VJPVectors(Family):
    """sdpa_vjp: q, k, v and d_out by position; the gradients dq, dk, dv, then dbias when the case
    has a bias and dsinks when it has sinks (`attnspec.spec.sdpa_vjp`'s order).

    Four of the suite's properties judge against the golden, and each is a group of cases here:
    matches_golden (every sdpa feature), variants_match_golden (every variant with a backward),
    masked_keys_get_zero (a drawn case whose hidden keys hold NaN, inf or 1e4: their dk and dv must
    be exactly 0, the golden is that of the unpoisoned keys) and empty_rows_zero_and_finite (the
    features with empty rows, and variants on them: those rows' dq must be exactly 0). The corner
    cases run under empty_rows_zero_and_finite, as `with_corners` runs them under every property,
    where they check the most.

    The first two draw half a profile's cases per feature (`PROFILE_CASES`; at least one), the last
    two, which repeat their features, a quarter: a case holds four arrays in and three or more out,
    and the bundle should stay about the size of sdpa's.
    """

    name = "sdpa_vjp"
    positional = ("q", "k", "v", "d_out")

    def groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """(property, the features it draws), in the order cases are written."""
        from attnspec.conformance.hypothesis_helpers import SDPA_FEATURES
        from attnspec.conformance.test_grads import EMPTY_ROW_FEATURES, VJP_VARIANTS

        return [
            ("matches_golden", SDPA_FEATURES),
            ("variants_match_golden", VJP_VARIANTS),
            ("masked_keys_get_zero", (*SDPA_FEATURES, *VJP_VARIANTS)),
            ("empty_rows_zero_and_finite", (*EMPTY_ROW_FEATURES, *VJP_VARIANTS)),
        ]

    @property
    def features(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for _, feats in self.groups() for f in feats))

    def cases(self, dtype: str, count: int) -> list[VectorCase]:
        found = []
        for prop, feats in self.groups():
            per = (
                max(1, count // 2)
                if prop in ("matches_golden", "variants_match_golden")
                else max(1, count // 4)
            )
            for feature in feats:
                for i in range(per):
                    seed = _case_seed(self.name, prop, feature, dtype, i)
                    found.append(self.draw_property(prop, feature, dtype, seed))
        found += self.corners(dtype)
        return _numbered(self.name, dtype, found)

    def draw(self, feature: str, dtype: str, seed: int, index: int) -> VectorCase:
        from attnspec.conformance.test_grads import VJP_VARIANTS

        prop = "variants_match_golden" if feature in VJP_VARIANTS else "matches_golden"
        return self.draw_property(prop, feature, dtype, seed)

    def draw_property(self, prop: str, feature: str, dtype: str, seed: int) -> VectorCase:
        """One case of property ``prop`` whose drawn feature is ``feature``, as the property's body
        builds it from the drawn case (test_grads.py)."""
        from attnspec.conformance import hypothesis_helpers as hh
        from attnspec.conformance.corners import Tour
        from attnspec.conformance.grads_cases import vjp_case
        from attnspec.conformance.test_grads import EMPTY_ROW_FEATURES, VJP_VARIANTS

        tour = Tour(feature, seed)
        bases = EMPTY_ROW_FEATURES if prop == "empty_rows_zero_and_finite" else hh._VARIANT_BASES
        if feature in VJP_VARIANTS:
            base = hh._variant_case(tour.choosing(VJP_VARIANTS), dtype, VJP_VARIANTS, bases)
        else:
            plain = EMPTY_ROW_FEATURES if prop == "empty_rows_zero_and_finite" else hh.SDPA_FEATURES
            base = hh._sdpa_case(tour.choosing(plain), dtype, plain)
        if prop == "masked_keys_get_zero":
            return self._masked_keys(base, tour)
        case, d_out = vjp_case(base)
        return self._vector(case, d_out, prop, empty_rows=prop == "empty_rows_zero_and_finite")

    def _masked_keys(self, base: Any, tour: Any) -> VectorCase:
        """test_vjp_masked_keys_get_zero's case: drawn hidden keys, poisoned; the golden is the
        clean case's, and the hidden keys' dk and dv rows must be exactly 0."""
        from hypothesis import strategies as st

        from attnspec.conformance.grads_cases import poison_hidden_keys
        from attnspec.conformance.judge import explicit_mask_case

        base = explicit_mask_case(base) if "variants" not in base.tags else base
        m = base.k.shape[-2]
        hidden = np.array(
            [bool(tour.rng.integers(0, 2)) for _ in range(m)], bool
        )  # the drawn list of m booleans
        poison = tour.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4]))
        clean, d_out, poisoned = poison_hidden_keys(base, hidden, poison)
        keys = np.broadcast_to(
            hidden, poisoned.k.shape[:-1]
        )  # dk and dv rows: (..., Hkv, m), or (m,) at rank 2
        return self._vector(clean, d_out, "masked_keys_get_zero", hidden_keys=keys, inputs_of=poisoned)

    def corners(self, dtype: str) -> list[VectorCase]:
        from attnspec.conformance.corners import CORNERS, MASK_ONLY, corner_case
        from attnspec.conformance.grads_cases import vjp_case

        return [
            self._vector(*vjp_case(corner_case(kind, dtype)), "empty_rows_zero_and_finite", empty_rows=True)
            for kind in (*CORNERS, *MASK_ONLY)
        ]

    def _vector(
        self,
        case: Any,
        d_out: np.ndarray,
        prop: str,
        empty_rows: bool = False,
        hidden_keys: np.ndarray | None = None,
        inputs_of: Any = None,
    ) -> VectorCase:
        """The vector of an SDPACase tagged ``vjp`` and its d_out: golden and allowed errors of
        ``case`` (`test_grads.golden_vjp`), inputs of ``inputs_of`` (the poisoned twin) or of
        ``case``; dq's empty rows and the ``hidden_keys`` rows of dk, dv must be exactly 0."""
        from attnspec.conformance.hypothesis_helpers import case_plan, full_visibility
        from attnspec.conformance.test_grads import golden_vjp
        from attnspec.spec.tolerance_grads import grad_names

        src = inputs_of or case
        inputs = {"q": src.q, "k": src.k, "v": src.v, "d_out": d_out}
        inputs.update({k: v for k, v in src.options.items() if isinstance(v, np.ndarray)})
        with np.errstate(all="ignore"):
            golden, allowed = golden_vjp(case, d_out)
        names = grad_names(case.options.get("bias"), case.options.get("sinks"))
        expected = {name: Expected(g, case.dtype, float(allowed[name])) for name, g in zip(names, golden)}
        if empty_rows:
            plan, _ = case_plan(case.q, case.k, case.v, case.options)
            empty = ~full_visibility(plan, case.options).any(axis=-1)  # (*batch, Hq, n)
            expected["dq"].zero_rows = _rows_of(np.asarray(empty), case.q.shape[:-1])
        if hidden_keys is not None:
            expected["dk"].zero_rows = hidden_keys.copy()
            expected["dv"].zero_rows = np.broadcast_to(hidden_keys, src.v.shape[:-1]).copy()
        return drawn_vector(
            self.name, case, inputs, expected, prop, options=json_options(src.options), tags=src.tags
        )

    def outputs(self, options: dict[str, Any]) -> tuple[str, ...]:
        """dq, dk, dv, then dbias and dsinks when ``options`` (the case's inputs too) hold a bias
        and sinks (`attnspec.spec.tolerance_grads.grad_names`)."""
        from attnspec.spec.tolerance_grads import grad_names

        return grad_names(options.get("bias"), options.get("sinks"))

    def call(self, backend: Any, arrays: dict[str, Any], options: dict[str, Any]) -> tuple:
        result = backend.sdpa_vjp(
            *(arrays[n] for n in self.positional),
            **{k: v for k, v in arrays.items() if k not in self.positional},
            **options,
        )
        return result if isinstance(result, tuple) else (result,)


def _rows_of(rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Rows of a full (*batch, H, n) grid reduced to an input's rows ``shape`` (its shape without
    the last axis; rank 2 has no head axis): a row of the input is exactly 0 only where every row
    of the grid summed into it is."""
    lead = rows.ndim - len(shape)
    rows = np.asarray(rows.all(axis=tuple(range(lead)))) if lead > 0 else rows
    axes = tuple(a for a, (s, t) in enumerate(zip(shape, rows.shape)) if s == 1 and t != 1)
    return rows.all(axis=axes, keepdims=True).reshape(shape) if axes else rows.reshape(shape)


# -- mha ---------------------------------------------------------------------------------------


class MHAVectors(Family):
    """mha: query, key, value by position; the layer's parameters as ``params.w_q``, ``params.b_q``,
    ... (those that are not None), the array options by name. ``call`` rebuilds the layer as an
    `MHAArrays` of the backend's arrays, what ``backend.asparams`` makes (test_mha.py passes either
    that or the NumPy MHAParams; the numbers are the same). The outputs: out, then weights when
    ``return_weights``, lse when ``return_lse``. No row must be exactly 0 (an empty row gives b_o).

    Every case of a variant feature is one of variants_match_golden, every other of matches_golden;
    every other case asks for the weights, as the suite's drawn boolean does about half the time.
    """

    name = "mha"
    positional = ("query", "key", "value")

    @property
    def features(self) -> tuple[str, ...]:
        from attnspec.conformance.mha_cases import MHA_FEATURES

        return MHA_FEATURES

    def draw(self, feature: str, dtype: str, seed: int, index: int) -> VectorCase:
        from attnspec.conformance.corners import Tour
        from attnspec.conformance.mha_cases import (
            MHA_FEATURES,
            MHA_VARIANT_FEATURES,
            golden_for_mha,
            mha_cases,
        )

        tour = Tour(feature, seed)
        case = _definition(mha_cases(dtype))(tour.choosing(MHA_FEATURES), dtype)
        if index % 2 == 1:
            case = case.asking_weights()
        with np.errstate(all="ignore"):
            g = golden_for_mha(case)
        inputs = {"query": case.q, "key": case.k, "value": case.v}
        for f in fields(case.params):
            a = getattr(case.params, f.name)
            if a is not None:
                inputs[f"params.{f.name}"] = a
        inputs.update({k: v for k, v in case.options.items() if isinstance(v, np.ndarray)})
        expected = {"out": Expected(g.out, dtype, g.allowed_out)}
        if case.options.get("return_weights"):
            assert g.weights is not None and g.allowed_w is not None
            expected["weights"] = Expected(g.weights, dtype, g.allowed_w)
        if case.options.get("return_lse"):
            assert g.lse is not None and g.allowed_lse is not None
            expected["lse"] = Expected(g.lse, "float64" if dtype == "float64" else "float32", g.allowed_lse)
        prop = "variants_match_golden" if feature in MHA_VARIANT_FEATURES else "matches_golden"
        return drawn_vector(self.name, case, inputs, expected, prop, dtype=dtype)

    def outputs(self, options: dict[str, Any]) -> tuple[str, ...]:
        return (
            "out",
            *(("weights",) if options.get("return_weights") else ()),
            *(("lse",) if options.get("return_lse") else ()),
        )

    def call(self, backend: Any, arrays: dict[str, Any], options: dict[str, Any]) -> tuple:
        from attnspec.backends.base import MHAArrays

        params = MHAArrays(**{f.name: arrays.get(f"params.{f.name}") for f in fields(MHAArrays)})
        result = backend.mha(
            *(arrays[n] for n in self.positional),
            params,
            **{k: v for k, v in arrays.items() if k not in self.positional and not k.startswith("params.")},
            **options,
        )
        return result if isinstance(result, tuple) else (result,)


# -- lsh_attention -----------------------------------------------------------------------------


class LSHVectors(Family):
    """lsh_attention: x and v by position, ``rotations`` (float32) and ``kv_lengths`` by name; the
    output out. Only cases without a low-margin position (`lsh_cases.margins`) are written: where
    the suite's draw has one, the next seed is drawn instead, so the suite's exclusions never
    apply and every element is compared. The buckets, which the suite's matches_golden also
    compares, are not an output (lsh_attention returns them only when asked): with every margin
    above the threshold, a backend's buckets differ from the golden's only by a bug, which moves
    chunk boundaries and so the outputs."""

    name = "lsh_attention"
    positional = ("x", "v")

    @property
    def features(self) -> tuple[str, ...]:
        from attnspec.conformance.lsh_cases import LSH_FEATURES

        return LSH_FEATURES

    def draw(self, feature: str, dtype: str, seed: int, index: int) -> VectorCase:
        from attnspec.conformance import lsh_cases as lc
        from attnspec.conformance.corners import Tour

        for attempt in range(LSH_REDRAWS):
            tour = Tour(feature, (seed + attempt) % 2**32)
            case = _definition(lc.lsh_cases(dtype))(tour.choosing(lc.LSH_FEATURES), dtype)
            if not lc.margins(case).low.any():
                break
        else:
            raise RuntimeError(
                f"lsh_attention vectors: {LSH_REDRAWS} draws of {feature}, each with a low margin"
            )
        g_out, g_buckets = lc.golden(case)
        inputs = {"x": case.x, "v": case.v, "rotations": case.rotations}
        inputs.update({k: v for k, v in case.options.items() if isinstance(v, np.ndarray)})
        expected = {"out": Expected(g_out, dtype, float(lc.allowed(case, g_out, g_buckets)))}
        return drawn_vector(self.name, case, inputs, expected, dtype=dtype)

    def call(self, backend: Any, arrays: dict[str, Any], options: dict[str, Any]) -> tuple:
        result = backend.lsh_attention(
            *(arrays[n] for n in self.positional),
            **{k: v for k, v in arrays.items() if k not in self.positional},
            **options,
        )
        return result if isinstance(result, tuple) else (result,)


for _family in (VJPVectors(), MHAVectors(), LSHVectors()):
    register(_family)


def _definition(strategy: Any) -> Any:
    """The function behind a ``st.composite`` strategy, which a `Tour` calls as Hypothesis would."""
    return strategy.wrapped_strategy.definition
