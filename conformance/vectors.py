"""Conformance vectors: the suite's cases as data any language can check against (VECTORS.md).

    export(out, profile, functions, dtypes) -> paths     bundles of cases, one per function and dtype
    load(path) -> [Bundle]                                a bundle or an export folder, hashes and schema checked
    run(backend, bundles, outputs)                        a backend's outputs for every case
    verify(bundles, outputs, name) -> results             judge outputs: the results JSON of a conformance run

A case is drawn the way the suite's feature tour draws one (`attnspec.conformance.corners.Tour`),
from a seed fixed by its function, feature, dtype and index, so the same spec version, profile and
selection give the same bytes. Its expected outputs and allowed errors come from the same golden
and tolerance rule as the suite's (`attnspec.backends.compare.sdpa_golden`), its causes from
`attnspec.conformance.causes`, its clauses from `attnspec.spec.clauses`.

Each function is a `Family`: how its cases are drawn, how a backend is called on one, and what
its outputs are named. The bundle format and every check a reader makes are stated once, in
VECTORS.md and ``vectors.schema.json``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attnspec.conformance import tensorfile
from attnspec.spec.clauses import (
    CLAUSES,
    SPEC_VERSION,
    case_clauses,
    clause_label,
    failure_clauses,
    property_clauses,
)

__all__ = [
    "FORMAT",
    "PROFILE_CASES",
    "Bundle",
    "BundleError",
    "VectorCase",
    "export",
    "families",
    "load",
    "run",
    "verify",
    "write_error",
    "write_output",
    "write_unsupported",
]

FORMAT = "attnspec.vectors/1"
#: cases per feature and dtype in each profile (the suite's profiles, `attnspec.conformance.profiles`)
PROFILE_CASES = {"dev": 4, "default": 8, "ci": 25, "thorough": 100}
SCHEMA_FILE = Path(__file__).with_name("vectors.schema.json")
#: the largest output file verify reads, as a multiple of what the case's outputs need
OUTPUT_SLACK = 4


class BundleError(Exception):
    """A bundle that cannot be used (missing, altered, not matching the schema): one line, exit 2."""


# -- what a case is --------------------------------------------------------------------------


@dataclass
class Expected:
    """One output of a case: its float64 golden (before rounding), the dtype a result must have,
    the allowed absolute error, and the rows that must be exactly 0."""

    golden: np.ndarray
    dtype: str
    allowed: float
    zero_rows: np.ndarray | None = None


@dataclass
class VectorCase:
    id: str
    function: str
    feature: str
    dtype: str
    inputs: dict[str, np.ndarray]  # every array argument, by its spec name
    options: dict[str, Any]  # the other arguments, as plain JSON
    tags: tuple[str, ...]
    expected: dict[str, Expected] = field(default_factory=dict)
    prop: str = "matches_golden"  # the conformance property the case is an example of
    family: str = ""  # the bundle family when it is not the function's own (sdpa_serving, sdpa_paged)

    @property
    def clauses(self) -> tuple[str, ...]:
        ids = dict.fromkeys(
            (
                *property_clauses(self.function, self.prop),
                # an array option counts by its presence (case_clauses' lsh branch compares values)
                *case_clauses(
                    {**self.options, **{_SPEC_NAMES.get(n, n): True for n in self.inputs}},
                    self.tags,
                    self.function,
                ),
            )
        )
        return tuple(c for c in CLAUSES if c in ids)


#: a layout's input -> the spec argument it carries, for the clauses it exercises
_SPEC_NAMES = {"cache_seqlens": "kv_lengths"}


class Family:
    """A spec function's vectors: override `draw`, `expect`, `call`; `positional` are the array
    arguments passed by position, in order; `outputs(options)` names what a call returns.

    ``name`` names the bundles (``NAME-DTYPE``) and ``function`` the spec function the cases call
    (the manifest's ``function``; a family of its own, such as the paged layout of sdpa, adds its
    ``family``); ``dtypes`` are the dtypes it has bundles of (None: `FLOAT_DTYPES`)."""

    name = ""
    positional: tuple[str, ...] = ()
    dtypes: tuple[str, ...] | None = None

    @property
    def function(self) -> str:
        return self.name

    @property
    def features(self) -> tuple[str, ...]:
        """The features a profile draws cases of, each its count of cases."""
        return ()

    def draw(self, feature: str, dtype: str, seed: int, index: int) -> VectorCase:
        raise NotImplementedError

    def corners(self, dtype: str) -> list[VectorCase]:
        return []

    def call(self, backend: Any, arrays: dict[str, Any], options: dict[str, Any]) -> tuple:
        raise NotImplementedError

    def outputs(self, options: dict[str, Any]) -> tuple[str, ...]:
        return ("out",)

    def causes(self, case: VectorCase, got: dict[str, np.ndarray]) -> list[str]:
        return []

    def needs(self, case: VectorCase) -> list[str]:
        return []

    def spec_call(self, case: VectorCase) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, options) of the spec call `run` makes for ``case``: every array argument by
        name (the positional ones included), and the other keyword arguments."""
        return dict(case.inputs), {k: tuple(v) if isinstance(v, list) else v for k, v in case.options.items()}

    def refusals(self, backend: Any, case: VectorCase, device: str | None) -> list[str]:
        """Why ``backend`` cannot run ``case`` (its `supports`), before anything is converted."""
        arrays, options = self.spec_call(case)
        shapes = {f"{n}_shape": a.shape for n, a in arrays.items() if n in ("q", "k", "v")}
        extra = {n: a for n, a in arrays.items() if n not in self.positional}
        return backend.supports(self.function, dtype=case.dtype, device=device, **shapes, **extra, **options)

    def finish(self, case: VectorCase, got: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of the spec call as the bundle lays them out (unchanged but for a layout
        of its own, the paged one)."""
        return got

    def cases(self, dtype: str, count: int) -> list[VectorCase]:
        found = []
        for feature in self.features:
            for i in range(count):
                seed = zlib.crc32(f"{self.name}|{feature}|{dtype}|{i}".encode())
                found.append(self.draw(feature, dtype, seed, i))
        found += self.corners(dtype)
        for i, c in enumerate(found):
            c.id = f"{self.name}-{dtype}-{i:04d}-{c.feature}"
        return found


def drawn_vector(
    function: str,
    case: Any,
    inputs: dict[str, np.ndarray],
    expected: dict[str, Expected],
    prop: str = "matches_golden",
    *,
    dtype: str | None = None,
    options: dict[str, Any] | None = None,
    tags: Any = None,
    family: str = "",
) -> VectorCase:
    """A case drawn from the suite's strategies as a bundle's `VectorCase` (its id comes when the
    bundle is written): the case's feature and dtype, its keywords as JSON and its tags, sorted;
    ``dtype``, ``options`` and ``tags`` replace them where a family writes others."""
    return VectorCase(
        "",
        function,
        case.feature,
        dtype or case.dtype,
        inputs,
        json_options(case.options) if options is None else options,
        tuple(sorted(case.tags if tags is None else tags)),
        expected,
        prop,
        family,
    )


def json_options(options: dict[str, Any]) -> dict[str, Any]:
    """The non-array options as plain JSON (a window as [left, right])."""
    out: dict[str, Any] = {}
    for k, v in sorted(options.items()):
        if isinstance(v, np.ndarray) or v is None:
            continue
        if isinstance(v, tuple):
            v = [int(x) for x in v]
        elif isinstance(v, (bool, np.bool_)):
            v = bool(v)
        elif isinstance(v, (int, np.integer)):
            v = int(v)
        elif isinstance(v, (float, np.floating)):
            v = float(v)
        out[k] = v
    return out


def _call_options(case: VectorCase, family: Family) -> dict[str, Any]:
    """The keyword arguments of a spec call: the case's array options and its JSON options."""
    opts: dict[str, Any] = {k: v for k, v in case.inputs.items() if k not in family.positional}
    for k, v in case.options.items():
        opts[k] = tuple(v) if isinstance(v, list) else v
    return opts


def _lead_rows(golden: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return np.asarray(rows, bool).reshape(golden.shape[:-1])


# -- sdpa ------------------------------------------------------------------------------------


class SDPAVectors(Family):
    name = "sdpa"
    positional = ("q", "k", "v")

    @property
    def features(self) -> tuple[str, ...]:
        from attnspec.conformance.hypothesis_helpers import SDPA_FEATURES, VARIANT_CASE_FEATURES

        return (*SDPA_FEATURES, *VARIANT_CASE_FEATURES)

    def draw(self, feature: str, dtype: str, seed: int, index: int) -> VectorCase:
        from attnspec.conformance import hypothesis_helpers as hh
        from attnspec.conformance.corners import Tour

        tour = Tour(feature, seed)
        if feature in hh.VARIANT_CASE_FEATURES:
            case = hh._variant_case(
                tour.choosing(hh.VARIANT_CASE_FEATURES), dtype, hh.VARIANT_CASE_FEATURES, hh._VARIANT_BASES
            )
        else:
            case = hh._sdpa_case(tour.choosing(hh.SDPA_FEATURES), dtype, hh.SDPA_FEATURES)
        if index % 2 == 1 and feature != "empty":  # every other case returns its weights too
            case = case.with_options(return_weights=True)
        return self._vector(case)

    def corners(self, dtype: str) -> list[VectorCase]:
        from attnspec.conformance.corners import CORNERS, EDGE_CORNERS, MASK_ONLY, corner_case

        found = [
            self._vector(corner_case(kind, dtype).with_options(return_weights=True))
            for kind in (*CORNERS, *MASK_ONLY, *EDGE_CORNERS)
        ]
        return found + [self._vector(c) for c in atlas_cases(dtype)]

    def _vector(self, case: Any) -> VectorCase:
        from attnspec.backends.compare import sdpa_golden
        from attnspec.conformance.hypothesis_helpers import case_plan, full_visibility

        inputs = {"q": case.q, "k": case.k, "v": case.v}
        inputs.update({k: v for k, v in case.options.items() if isinstance(v, np.ndarray)})
        options = json_options(case.options)
        with np.errstate(all="ignore"):
            g = sdpa_golden(case.q, case.k, case.v, **case.options)
            plan, _ = case_plan(case.q, case.k, case.v, case.options)
            empty = ~full_visibility(plan, case.options).any(axis=-1)
        empty = np.asarray(empty)
        expected = {"out": Expected(g.out, case.dtype, g.allowed_out, _lead_rows(g.out, empty))}
        if case.options.get("return_weights"):
            assert g.weights is not None and g.allowed_w is not None  # asked for: the golden has them
            expected["weights"] = Expected(g.weights, case.dtype, g.allowed_w, _lead_rows(g.weights, empty))
        if case.options.get("return_lse"):
            assert g.lse is not None and g.allowed_lse is not None
            expected["lse"] = Expected(g.lse, plan.lse_dtype, g.allowed_lse)
        prop = "variants_match_golden" if "variants" in case.tags else "matches_golden"
        return drawn_vector("sdpa", case, inputs, expected, prop, options=options)

    def outputs(self, options: dict[str, Any]) -> tuple[str, ...]:
        return (
            "out",
            *(("weights",) if options.get("return_weights") else ()),
            *(("lse",) if options.get("return_lse") else ()),
        )

    def call(self, backend: Any, arrays: dict[str, Any], options: dict[str, Any]) -> tuple:
        result = backend.sdpa(
            *(arrays[n] for n in self.positional),
            **{k: v for k, v in arrays.items() if k not in self.positional},
            **options,
        )
        return result if isinstance(result, tuple) else (result,)

    def _spec_case(self, case: VectorCase) -> Any:
        from attnspec.conformance.hypothesis_helpers import SDPACase

        return SDPACase(
            case.feature,
            case.dtype,
            case.inputs["q"],
            case.inputs["k"],
            case.inputs["v"],
            _call_options(case, self),
            frozenset(case.tags),
        )

    def causes(self, case: VectorCase, got: dict[str, np.ndarray]) -> list[str]:
        if "out" not in got:
            return []
        e = case.expected["out"]
        w = got.get("weights")
        return self.spec_causes(
            self._spec_case(case),
            got["out"].astype(np.float64),
            e.golden,
            e.allowed,
            None if w is None else w.astype(np.float64),
        )

    def spec_causes(
        self, c: Any, out: np.ndarray, golden: np.ndarray, allowed: float, weights: np.ndarray | None
    ) -> list[str]:
        """`attnspec.conformance.causes.sdpa_causes` of the SDPACase ``c``'s float64 outputs, in
        the spec's layout."""
        from attnspec.conformance.causes import sdpa_causes
        from attnspec.conformance.hypothesis_helpers import case_plan, full_visibility

        plan, _ = case_plan(c.q, c.k, c.v, c.options)
        vis = full_visibility(plan, c.options)
        return sdpa_causes(
            plan, vis, c.q, c.k, c.v, out, golden, allowed, weights, bias=c.options.get("bias")
        )

    def needs(self, case: VectorCase) -> list[str]:
        from attnspec.conformance.conftest import case_needs

        return case_needs(self._spec_case(case))


def atlas_cases(dtype: str) -> list[Any]:
    """The atlas' questions (`attnspec.backends.atlas.questions`) as sdpa cases of ``dtype``:
    float32 holds the questions asked in float32, float64 those about float64; the questions
    about a framework's own causal flag have no place in data that names its alignment."""
    from attnspec.backends.atlas.questions import FLOAT64_QUESTIONS, QUESTIONS
    from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility

    found = []
    for question in QUESTIONS:
        if dtype != ("float64" if question.id in FLOAT64_QUESTIONS else "float32"):
            continue
        q, k, v, opts = question.case()
        if opts.get("causal") == "flag":
            continue
        npdt = NP_DTYPES[dtype]
        q, k, v = (x.astype(npdt) for x in (q, k, v))
        opts = {
            n: x.astype(npdt) if isinstance(x, np.ndarray) and x.dtype.kind == "f" else x
            for n, x in opts.items()
        }
        tags = {f"atlas_{question.id}", dtype}
        tag_visibility(tags, q, k, v, opts)
        found.append(SDPACase(f"atlas_{question.id}", dtype, q, k, v, opts, frozenset(tags), 0))
    return found


def atlas_answers(bundles: list[Bundle], outputs: Path, name: str) -> dict[str, Any]:
    """The atlas document (schema ``attnspec.atlas/1``, as `attnspec.backends.atlas.questions`
    writes one) of the outputs of the bundles' atlas cases: each question answered from the
    output its case got, "n/a: ..." where the case was declared unsupported or not run."""
    from attnspec.backends.atlas.questions import QUESTIONS

    cases = {}
    for b in bundles:
        for entry in b.cases:
            if entry["feature"].startswith("atlas_"):
                cases[entry["feature"].removeprefix("atlas_")] = (b, entry)
    answers = []
    for question in QUESTIONS:
        if question.id in cases:
            b, entry = cases[question.id]
            answer = _atlas_answer(question, b.case(entry), outputs)
            answers.append(
                {
                    "id": question.id,
                    "title": question.title,
                    "answer": answer,
                    "spec": question.spec,
                    "reproducer": f"attnspec vectors verify {b.path} {outputs} --name {name} "
                    f"--case {entry['id']}",
                }
            )
    return {
        "schema": "attnspec.atlas/1",
        "backend": name,
        "answers": answers,
        "implementation": {
            "function": f"{name}: an outside implementation, judged from its outputs",
            "convention": "conformance vectors (attnspec vectors verify)",
        },
    }


def _atlas_answer(question: Any, case: VectorCase, outputs: Path) -> str:
    from attnspec.backends.atlas.questions import FLOAT64_QUESTIONS

    stem = outputs / case.id
    if stem.with_name(case.id + ".unsupported").exists():
        return f"n/a: {_small_text(stem.with_name(case.id + '.unsupported'))[:160]}"
    if stem.with_name(case.id + ".error").exists():
        return "raises"
    path = stem.with_name(case.id + ".safetensors")
    if not path.exists():
        return "n/a: not run"
    got, _ = _read_output(path, case)
    if got is None or "out" not in got:
        return "malformed output"
    with np.errstate(all="ignore"):
        out = got["out"].astype(np.float64)
        if question.id in FLOAT64_QUESTIONS:
            if got["out"].dtype != np.float64:
                return f"returns {got['out'].dtype.name}"
            err = float(np.nanmax(np.abs(out - case.expected["out"].golden), initial=0.0))
            if err < 1e-12:
                return "float64, as the spec"
            return (
                "float64 dtype, float32 precision inside" if err < 1e-5 else f"float64 dtype, error {err:.1e}"
            )
        opts: dict[str, Any] = {
            n: a.astype(np.float64) if a.dtype.kind == "f" else a
            for n, a in case.inputs.items()
            if n not in ("q", "k", "v")
        }
        opts.update({k: tuple(v) if isinstance(v, list) else v for k, v in case.options.items()})
        qkv = tuple(case.inputs[n].astype(np.float64) for n in ("q", "k", "v"))
        result = (
            (out, got["weights"].astype(np.float64)) if "weights" in got and question.id == "weights" else out
        )
        return str(question.classify(result, (*qkv, opts)))


_FAMILIES: dict[str, Family] = {"sdpa": SDPAVectors()}


def families() -> dict[str, Family]:
    """function name -> its `Family` (the functions `export` can write)."""
    return dict(_FAMILIES)


def register(family: Family) -> None:
    """Add a function's vectors (used by the modules that define the other families)."""
    _FAMILIES[family.name] = family


def family_dtypes(family: Family) -> tuple[str, ...]:
    """The dtypes ``family`` has bundles of: its own, or the four float dtypes."""
    from attnspec.spec.dtypes import FLOAT_DTYPES

    return tuple(family.dtypes or FLOAT_DTYPES)


# -- export ----------------------------------------------------------------------------------


def _metadata(case: VectorCase) -> dict[str, str]:
    meta = {
        "format": FORMAT,
        "spec_version": SPEC_VERSION,
        "case": case.id,
        "function": case.function,
        "dtype": case.dtype,
        "feature": case.feature,
        "clauses": ",".join(case.clauses),
    }
    if case.family:
        meta["family"] = case.family
    for k, v in case.options.items():
        if isinstance(v, bool):
            meta[f"option.{k}"] = "true" if v else "false"
        elif isinstance(v, list):
            meta[f"option.{k}"] = ",".join(str(x) for x in v)
        elif isinstance(v, float):
            meta[f"option.{k}"] = repr(v)
        else:
            meta[f"option.{k}"] = str(v)
    for name, e in case.expected.items():
        meta[f"allowed.{name}"] = repr(float(e.allowed))
        meta[f"dtype.{name}"] = e.dtype
    return meta


def _tensors(case: VectorCase) -> dict[str, np.ndarray]:
    from attnspec.spec.dtypes import round_to

    tensors = dict(case.inputs)
    for name, e in case.expected.items():
        tensors[f"expected.{name}"] = e.golden.astype(np.float64)
        with np.errstate(all="ignore"):
            tensors[f"expected.{name}.rounded"] = round_to(e.golden, e.dtype)  # once, to nearest even
        if e.zero_rows is not None and e.zero_rows.any():
            tensors[f"zero_rows.{name}"] = e.zero_rows
        nan = np.isnan(e.golden)
        if nan.any():
            tensors[f"nan.{name}"] = nan
    return tensors


def _dtype_name(a: np.ndarray) -> str:
    return "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.name


def _entry(case: VectorCase, file: str, data: bytes) -> dict[str, Any]:
    return {
        "id": case.id,
        "file": file,
        "sha256": hashlib.sha256(data).hexdigest(),
        "bytes": len(data),
        "feature": case.feature,
        "property": case.prop,
        "tags": list(case.tags),
        "clauses": list(case.clauses),
        "options": case.options,
        "inputs": {
            n: {"dtype": _dtype_name(a), "shape": list(a.shape)} for n, a in sorted(case.inputs.items())
        },
        "outputs": {
            n: {
                "dtype": e.dtype,
                "shape": list(e.golden.shape),
                "allowed": float(e.allowed),
                "zero_rows": int(e.zero_rows.sum()) if e.zero_rows is not None else 0,
                "nan": int(np.isnan(e.golden).sum()),
            }
            for n, e in case.expected.items()
        },
    }


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def content_hash(manifest: dict[str, Any]) -> str:
    """SHA-256 of the manifest's canonical JSON without ``content_sha256`` (it lists every file's)."""
    return hashlib.sha256(
        _canonical({k: v for k, v in manifest.items() if k != "content_sha256"})
    ).hexdigest()


def export(
    out: str | os.PathLike,
    profile: str = "dev",
    functions: Iterable[str] | None = None,
    dtypes: Iterable[str] | None = None,
) -> list[Path]:
    """Write one bundle per function and dtype under ``out`` (and ``out/index.json``); return the
    bundle folders. Raises ValueError naming a bad profile, function or dtype."""
    from attnspec.conformance.hypothesis_helpers import MAX_SIDE

    if profile not in PROFILE_CASES:
        raise ValueError(f"profile={profile!r}, expected one of {', '.join(PROFILE_CASES)}")
    fams = families()
    names = list(functions or fams)
    for f in names:
        if f not in fams:
            raise ValueError(f"function={f!r}, expected one of {', '.join(fams)}")
    kinds = list(dtypes or ())
    known = dict.fromkeys(d for f in names for d in family_dtypes(fams[f]))
    for d in kinds:
        if d not in known:
            raise ValueError(f"dtype={d!r}, expected one of {', '.join(known)}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    schema = SCHEMA_FILE.read_bytes()
    index: dict[str, Any] = {
        "format": FORMAT,
        "spec_version": SPEC_VERSION,
        "profile": profile,
        "bundles": [],
    }
    paths = []
    for f in names:
        fam = fams[f]
        for d in [d for d in kinds if d in family_dtypes(fam)] if kinds else family_dtypes(fam):
            folder = root / f"{f}-{d}"
            folder.mkdir(exist_ok=True)
            for old in folder.glob("*.safetensors"):
                old.unlink()
            entries = []
            used: set[str] = set()
            for case in fams[f].cases(d, PROFILE_CASES[profile]):
                name = f"{case.id}.safetensors"
                data = tensorfile.write(folder / name, _tensors(case), _metadata(case))
                entries.append(_entry(case, name, data))
                used.update(case.clauses)
            manifest: dict[str, Any] = {
                "format": FORMAT,
                "spec_version": SPEC_VERSION,
                "function": fam.function,
                **({"family": f} if f != fam.function else {}),
                "dtype": d,
                "profile": profile,
                "max_side": MAX_SIDE,
                "clauses": {c: CLAUSES[c].title for c in CLAUSES if c in used},
                "cases": entries,
            }
            manifest["content_sha256"] = content_hash(manifest)
            (folder / "manifest.json").write_bytes(
                json.dumps(manifest, sort_keys=True, indent=1).encode() + b"\n"
            )
            (folder / "manifest.schema.json").write_bytes(schema)
            index["bundles"].append(
                {
                    "path": folder.name,
                    "function": fam.function,
                    **({"family": f} if f != fam.function else {}),
                    "dtype": d,
                    "cases": len(entries),
                    "content_sha256": manifest["content_sha256"],
                }
            )
            paths.append(folder)
    (root / "index.json").write_bytes(json.dumps(index, sort_keys=True, indent=1).encode() + b"\n")
    return paths


# -- reading bundles -------------------------------------------------------------------------


@dataclass
class Bundle:
    path: Path
    manifest: dict[str, Any]
    #: file name -> the bytes `load` read and hash-checked (a case is then parsed from them, not read again)
    data: dict[str, bytes] = field(default_factory=dict, repr=False)

    @property
    def function(self) -> str:
        return str(self.manifest["function"])

    @property
    def family(self) -> str:
        """The family that wrote the bundle: ``family`` when the manifest has one, else ``function``."""
        return str(self.manifest.get("family", self.manifest["function"]))

    @property
    def cases(self) -> list[dict[str, Any]]:
        return list(self.manifest["cases"])

    def read_cases(self) -> Iterator[VectorCase]:
        """Every case of the bundle, read from its file: ``case.id``, ``case.inputs`` (NumPy arrays
        by spec name), ``case.options`` (plain JSON), ``case.expected``."""
        for entry in self.cases:
            yield self.case(entry)

    def case(self, entry: dict[str, Any]) -> VectorCase:
        """The case of a manifest entry, read from its file (already hash-checked by `load`)."""
        raw = self.data.get(entry["file"])
        where = str(self.path / entry["file"])
        try:
            tensors, _ = tensorfile.parse(raw, where) if raw is not None else tensorfile.read(where)
        except (tensorfile.TensorFileError, OSError) as e:
            raise BundleError(str(e)) from None
        inputs = {n: _declared(tensors, n, where, d["shape"], d["dtype"]) for n, d in entry["inputs"].items()}
        expected = {}
        for name, o in entry["outputs"].items():
            golden = _declared(tensors, f"expected.{name}", where, o["shape"], "float64")
            zero = tensors.get(f"zero_rows.{name}")
            if zero is not None and (zero.dtype != bool or zero.shape != golden.shape[:-1]):
                raise BundleError(
                    f"{where}: zero_rows.{name} is {zero.dtype}{list(zero.shape)}, the manifest "
                    f"implies bool{list(golden.shape[:-1])}"
                )
            expected[name] = Expected(golden, o["dtype"], float(o["allowed"]), zero)
        return VectorCase(
            entry["id"],
            self.function,
            entry["feature"],
            self.manifest["dtype"],
            inputs,
            dict(entry["options"]),
            tuple(entry["tags"]),
            expected,
            entry.get("property", "matches_golden"),
            self.manifest.get("family", ""),
        )


def _declared(
    tensors: dict[str, np.ndarray], name: str, where: str, shape: list[int], dtype: str
) -> np.ndarray:
    """Tensor ``name`` of a case file, as its manifest declares it (present, that shape and dtype);
    `BundleError` otherwise: a bundle whose files and manifest disagree is not judged."""
    a = tensors.get(name)
    if a is None:
        raise BundleError(f"{where}: tensor {name!r}, listed in the manifest, is not in the file")
    if list(a.shape) != list(shape) or _dtype_name(a) != dtype:
        raise BundleError(
            f"{where}: tensor {name!r} is {_dtype_name(a)}{list(a.shape)}, the manifest says "
            f"{dtype}{list(shape)}"
        )
    return a


def write_output(outputs: str | os.PathLike, case_id: str, arrays: dict[str, Any]) -> Path:
    """Write one case's outputs (name -> array: NumPy, or anything with ``__array__``; torch
    tensors are moved to the CPU) as ``OUTPUTS/ID.safetensors``, the file `verify` reads."""
    converted = {}
    for name, a in arrays.items():
        if hasattr(a, "detach"):  # a torch tensor: bfloat16 has no NumPy view, go through float32
            a = a.detach().cpu()
            dtype = str(a.dtype).removeprefix("torch.")
            a = a.float().numpy().astype(_np_dtype(dtype)) if dtype == "bfloat16" else a.numpy()
        converted[name] = np.asarray(a)
    path = Path(outputs) / f"{case_id}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    tensorfile.write(path, converted)
    return path


def write_error(outputs: str | os.PathLike, case_id: str, message: str) -> Path:
    """Record that the implementation failed on case ``case_id`` (an exception, a kernel error):
    ``OUTPUTS/ID.error``, judged a failure with the message as its cause."""
    path = Path(outputs) / f"{case_id}.error"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(" ".join(message.split()) + "\n", encoding="utf-8")
    return path


def write_unsupported(outputs: str | os.PathLike, case_id: str, reason: str) -> Path:
    """Declare that the implementation does not support case ``case_id``: ``OUTPUTS/ID.unsupported``."""
    path = Path(outputs) / f"{case_id}.unsupported"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(reason.replace("\n", " ") + "\n", encoding="utf-8")
    return path


def _np_dtype(name: str) -> np.dtype:
    from attnspec.spec.dtypes import numpy_dtype

    return numpy_dtype(name)


def load(path: str | os.PathLike, check_files: bool = True) -> list[Bundle]:
    """The bundles at ``path``: a bundle folder (``manifest.json``) or an export folder
    (``index.json``). Each manifest is checked against the schema and its content hash, each
    case file against its SHA-256 and size; `BundleError` (one line) otherwise."""
    p = Path(path)
    if (p / "manifest.json").is_file():
        return [_load_one(p, check_files)]
    if (p / "index.json").is_file():
        index = _read_json(p / "index.json")
        if (
            not isinstance(index, dict)
            or index.get("format") != FORMAT
            or not isinstance(index.get("bundles"), list)
        ):
            raise BundleError(f"{p / 'index.json'}: not an index of {FORMAT} bundles")
        out = []
        for b in index["bundles"]:
            sub = b.get("path") if isinstance(b, dict) else None
            if not isinstance(sub, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", sub) or sub.startswith("."):
                raise BundleError(f"{p / 'index.json'}: bundle path {sub!r} is not a plain folder name")
            bundle = _load_one(p / sub, check_files)
            if bundle.manifest["content_sha256"] != b.get("content_sha256"):
                raise BundleError(
                    f"{p / sub}: content hash {bundle.manifest['content_sha256'][:12]}... does not match "
                    f"the index's {str(b.get('content_sha256'))[:12]}..."
                )
            out.append(bundle)
        return out
    raise BundleError(f"{p}: no manifest.json (a bundle) or index.json (an export folder) there")


def _read_json(path: Path, limit: int = 256 * 2**20) -> Any:
    size = path.stat().st_size
    if size > limit:
        raise BundleError(f"{path}: {size} bytes, more than the {limit} a manifest may have")
    try:
        return json.loads(path.read_bytes().decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError(f"{path}: not valid JSON ({str(e).splitlines()[0][:120]})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@functools.lru_cache(maxsize=1)
def _manifest_check() -> Any:
    """The shipped schema, compiled once (`jsonschema_lite.compile_schema`)."""
    from attnspec.conformance.jsonschema_lite import compile_schema

    return compile_schema(json.loads(SCHEMA_FILE.read_text()))


def _load_one(folder: Path, check_files: bool) -> Bundle:
    from attnspec.conformance.jsonschema_lite import SchemaError

    mpath = folder / "manifest.json"
    if not mpath.is_file():
        raise BundleError(f"{folder}: no manifest.json")
    manifest = _read_json(mpath)
    if isinstance(manifest, dict) and manifest.get("format") not in (None, FORMAT):
        raise BundleError(f"{mpath}: format {manifest.get('format')!r}; this attnspec reads {FORMAT}")
    try:
        _manifest_check()(manifest, "$")
    except SchemaError as e:
        raise BundleError(f"{mpath}: does not match the bundle schema: {e}") from None
    if content_hash(manifest) != manifest["content_sha256"]:
        raise BundleError(
            f"{mpath}: content hash mismatch: the manifest was altered after export "
            f"(content_sha256 {manifest['content_sha256'][:12]}..., computed {content_hash(manifest)[:12]}...)"
        )
    family = manifest.get("family", manifest["function"])
    if family not in _FAMILIES or _FAMILIES[family].function != manifest["function"]:
        raise BundleError(
            f"{mpath}: function {manifest['function']!r}"
            + (f" in family {family!r}" if "family" in manifest else "")
            + f" is not one this attnspec judges ({', '.join(_FAMILIES)})"
        )
    seen = set()
    data: dict[str, bytes] = {}
    for entry in manifest["cases"]:
        if entry["id"] in seen:
            raise BundleError(f"{mpath}: case id {entry['id']!r} appears twice")
        seen.add(entry["id"])
        f = folder / entry["file"]
        if not check_files:
            continue
        if not f.is_file():
            raise BundleError(f"{f}: listed in the manifest but missing")
        if f.stat().st_size != entry["bytes"]:
            raise BundleError(f"{f}: {f.stat().st_size} bytes, the manifest says {entry['bytes']}")
        raw = f.read_bytes()
        if hashlib.sha256(raw).hexdigest() != entry["sha256"]:
            raise BundleError(f"{f}: SHA-256 does not match the manifest: the file was altered or corrupted")
        data[entry["file"]] = raw
    return Bundle(folder, manifest, data)


# -- producing outputs with a backend --------------------------------------------------------


def run(
    backend: Any,
    bundles: list[Bundle],
    outputs: str | os.PathLike,
    device: str | None = None,
    case_filter: str | None = None,
) -> dict[str, int]:
    """Call ``backend`` (a `Backend`) on every case and write its outputs in the bundle format:
    ``ID.safetensors``, or ``ID.unsupported`` (it declined: `Unsupported`, or its `supports`
    said why) or ``ID.error`` (it raised). Returns counts by outcome."""
    from attnspec.backends import Unsupported

    out = Path(outputs)
    out.mkdir(parents=True, exist_ok=True)
    counts = {"written": 0, "unsupported": 0, "error": 0}
    for b in bundles:
        fam = _FAMILIES[b.family]
        for entry in b.cases:
            if case_filter and not re.search(case_filter, entry["id"]):
                continue
            case = b.case(entry)
            for suffix in (".safetensors", ".unsupported", ".error"):
                (out / f"{case.id}{suffix}").unlink(missing_ok=True)
            try:
                reasons = fam.refusals(backend, case, device)
            except Exception:
                reasons = []
            if reasons:
                (out / f"{case.id}.unsupported").write_text("; ".join(reasons) + "\n")
                counts["unsupported"] += 1
                continue
            try:
                arrays, opts = fam.spec_call(case)
                conv = {k: backend.asarray(v, device=device) for k, v in arrays.items()}
                names = fam.outputs({**arrays, **opts})  # sdpa_vjp's dbias follows a bias
                result = fam.call(backend, conv, opts)
                got = fam.finish(case, {n: np.asarray(backend.to_numpy(r)) for n, r in zip(names, result)})
            except Unsupported as e:
                (out / f"{case.id}.unsupported").write_text(f"{e}\n")
                counts["unsupported"] += 1
                continue
            except Exception as e:
                (out / f"{case.id}.error").write_text(f"raised {type(e).__name__}: {e}\n")
                counts["error"] += 1
                continue
            tensorfile.write(out / f"{case.id}.safetensors", got)
            counts["written"] += 1
    return counts


# -- verify ----------------------------------------------------------------------------------


def _read_output(path: Path, case: VectorCase) -> tuple[dict[str, np.ndarray] | None, str]:
    """(arrays, problem) of one output file; arrays None and a one-line problem when malformed."""
    need = sum(e.golden.size * 8 for e in case.expected.values())
    try:
        arrays, _ = tensorfile.read(path, max_bytes=OUTPUT_SLACK * need + 4096)
    except tensorfile.TensorFileError as e:
        return None, f"output file malformed: {str(e).replace(str(path), path.name)}"
    except OSError as e:
        return None, f"output file unreadable: {e.strerror or e}"
    return arrays, ""


def judge(
    case: VectorCase, family: Family, got: dict[str, np.ndarray]
) -> tuple[str, list[str], dict[str, Any]]:
    """(status, problems, comparisons) of one case's outputs under the tolerance rule; problems
    begin with what broke (a missing output, a dtype, a row not exactly 0)."""
    from attnspec.spec.tolerance import compare

    problems: list[str] = []
    comparisons = {}
    for name, e in case.expected.items():
        a = got.get(name)
        if a is None:
            problems.append(
                f"returned no {name}"
                + (f", but option return_{name}=true asks for it" if name in ("weights", "lse") else "")
            )
            continue
        if tuple(a.shape) != tuple(e.golden.shape):
            problems.append(f"{name}.shape={tuple(a.shape)}, but should be {tuple(e.golden.shape)}")
            continue
        if _dtype_name(a) != e.dtype:
            problems.append(f"{name}.dtype={_dtype_name(a)}, but should be {e.dtype}")
        with np.errstate(all="ignore"):
            r = a.astype(np.float64)
        with np.errstate(all="ignore"):
            comparisons[name] = compare(r, e.golden, e.allowed)
        if e.zero_rows is not None and e.zero_rows.any():
            rows = r[e.zero_rows]
            bad = ~(rows == 0).all(axis=-1)
            if bad.any():
                worst = float(np.nanmax(np.abs(np.where(np.isnan(rows), np.inf, rows)), initial=0.0))
                kind = "NaN" if np.isnan(rows).any() else f"values up to {worst:.3g}"
                # the rows of sdpa_vjp's dk and dv are keys
                what = "hidden key" if name in ("dk", "dv") else "row with no visible key"
                problems.append(
                    f"{what}: expected exactly 0, got {kind} in {name} "
                    f"({int(bad.sum())} of {int(e.zero_rows.sum())} such rows)"
                )
    ok = not problems and all(c.ok for c in comparisons.values())
    return ("passed" if ok else "failed"), problems, comparisons


def verify(
    bundles: list[Bundle],
    outputs: str | os.PathLike,
    name: str,
    device: str = "external",
    case_filter: str | None = None,
) -> dict[str, Any]:
    """Judge the outputs an implementation wrote for ``bundles``; the results JSON of a conformance
    run of backend ``name`` (`attnspec.conformance.recorder`), with ``vectors`` added (per bundle:
    cases judged, passed, failed, unsupported, not run)."""
    import time

    from attnspec.conformance.recorder import Recorder

    out = Path(outputs)
    if not out.is_dir():
        raise BundleError(f"{out}: the outputs folder does not exist")
    profile = bundles[0].manifest["profile"] if bundles else "dev"
    rec = Recorder(profile)
    rec.backend_name = name
    rec.device = device
    t0 = time.time()
    summary = []
    for b in bundles:
        fam = _FAMILIES[b.family]
        counts = {"cases": 0, "passed": 0, "failed": 0, "unsupported": 0, "not_run": 0}
        for entry in b.cases:
            if case_filter and not re.search(case_filter, entry["id"]):
                continue
            counts["cases"] += 1
            case = b.case(entry)
            r = case_record(case, fam, out, name, b.path)
            counts["not_run" if r["status"] == "not run" else r["status"]] = (
                counts.get("not_run" if r["status"] == "not run" else r["status"], 0) + 1
            )
            if r["status"] == "not run":
                continue
            node = f"vectors::{b.path.name}"
            rec.record(node, r)
        rec.test_finished(f"vectors::{b.path.name}", "done", log=False)
        summary.append(
            {
                "bundle": b.path.name,
                "function": b.function,
                "dtype": b.manifest["dtype"],
                "content_sha256": b.manifest["content_sha256"],
                **counts,
            }
        )
    results = rec.results()
    results["vectors"] = {
        "format": FORMAT,
        "outputs": str(out),
        "bundles": summary,
        "spec_versions": sorted({b.manifest["spec_version"] for b in bundles}),
        "elapsed_s": round(time.time() - t0, 3),
    }
    results["spec_version"] = SPEC_VERSION
    return results


def case_record(case: VectorCase, family: Family, outputs: Path, name: str, bundle: Path) -> dict[str, Any]:
    """The record of one case, as the suite's judge writes one: status passed, failed,
    unsupported (with the consumer's reason) or "not run" (no file at all)."""
    base: dict[str, Any] = {
        "function": case.function,
        "property": case.prop,
        "feature": case.feature,
        "dtype": case.dtype,
        "tags": list(case.tags),
        "shapes": {n: list(a.shape) for n, a in case.inputs.items() if n in family.positional},
        "phase": "drawn",
        "called": True,
        "needs": family.needs(case),
        "key": case.id,
        "clauses": list(case.clauses),
    }
    stem = outputs / case.id
    if stem.with_name(case.id + ".safetensors").exists():
        got, problem = _read_output(stem.with_name(case.id + ".safetensors"), case)
        if got is None:
            return {
                **base,
                "status": "failed",
                "message": message(name, case, [problem], {}, [], bundle, outputs),
            }
        status, problems, comparisons = judge(case, family, got)
        worst = max(comparisons.values(), key=lambda c: c.budget_used, default=None)
        rec = {
            **base,
            "status": status,
            "max_abs_err": finite_or_none(worst.max_abs_err) if worst else None,
            "max_rel_err": finite_or_none(worst.max_rel_err) if worst else None,
            "budget_used": finite_or_none(worst.budget_used) if worst else None,
        }
        if status == "failed":
            causes = (
                []
                if problems and not problems[0].startswith("row with no visible key")
                else family.causes(case, got)
            )
            rec["message"] = message(name, case, problems, comparisons, causes, bundle, outputs)
        return rec
    if stem.with_name(case.id + ".error").exists():
        text = _small_text(stem.with_name(case.id + ".error"))
        return {
            **base,
            "status": "failed",
            "message": message(
                name,
                case,
                [f"raised {text}" if not text.startswith("raised") else text],
                {},
                [],
                bundle,
                outputs,
            ),
        }
    if stem.with_name(case.id + ".unsupported").exists():
        reason = (
            _small_text(stem.with_name(case.id + ".unsupported")) or "declared unsupported (no reason given)"
        )
        return {**base, "called": False, "status": "unsupported", "reason": reason}
    return {**base, "called": False, "status": "not run"}


def _small_text(path: Path, limit: int = 2000) -> str:
    """The first line of a small text file (at most ``limit`` bytes read), undecodable bytes replaced."""
    with open(path, "rb") as f:
        raw = f.read(limit)
    return (raw.decode("utf-8", errors="replace").strip().splitlines() or [""])[0]


def not_run_ids(bundles: list[Bundle], outputs: Path) -> Iterator[str]:
    for b in bundles:
        for e in b.cases:
            if not any(
                (outputs / f"{e['id']}{s}").exists() for s in (".safetensors", ".unsupported", ".error")
            ):
                yield e["id"]


def message(
    name: str,
    case: VectorCase,
    problems: list[str],
    comparisons: dict[str, Any],
    causes: list[str],
    bundle: Path,
    outputs: Path,
) -> str:
    """A failure message as the suite writes one: cause and clause first (the case there when
    no cause is known), then the case, the problems, the comparisons, and where its inputs and
    output are."""
    from attnspec.conformance.pytest_helpers import comparison_lines

    first = (causes or problems or [""])[0]
    label = clause_label(failure_clauses(first, case.function, case.prop, case.clauses))
    shapes = " ".join(f"{n}{tuple(a.shape)}" for n, a in case.inputs.items() if n in family_shapes(case))
    described = f"{case.id} feature={case.feature} dtype={case.dtype} {shapes} options={case.options}"
    head = f"[{name}] {case.function} {case.prop}: "
    lines = [f"{head}{first} {label}", f"  case: {described}"] if first else [f"{head}{described} {label}"]
    lines += [f"  {p}" for p in (causes[1:] + problems if causes else problems[1:])]
    lines += comparison_lines(comparisons)
    from attnspec.conformance.pytest_helpers import with_spec_line

    lines.append("  reproduce with:")
    lines += ["    " + line for line in reproducer(case, bundle, outputs, name).splitlines()]
    return with_spec_line("\n".join(lines), failure_clauses(first, case.function, case.prop, case.clauses))


def reproducer(case: VectorCase, bundle: Path, outputs: Path, name: str) -> str:
    """Python that reads the case and the implementation's output and prints each output's
    largest error against the golden and the allowed error; then the command that judges it."""
    case_file, out_file = (
        bundle.resolve() / f"{case.id}.safetensors",
        outputs.resolve() / f"{case.id}.safetensors",
    )
    return "\n".join(
        [
            "import numpy as np",
            "from attnspec.conformance import tensorfile",
            f"case, meta = tensorfile.read({str(case_file)!r})  # inputs, expected.NAME, zero_rows.NAME",
            f"got, _ = tensorfile.read({str(out_file)!r})  # what the implementation wrote",
            f"for name in {list(case.expected)!r}:",
            "    if name not in got:",
            "        print(name, 'missing'); continue",
            "    err = np.abs(got[name].astype(np.float64) - case['expected.' + name])",
            "    print(name, got[name].dtype, 'error', np.nanmax(err, initial=0), 'allowed', meta['allowed.' + name])",
            f"# judged again: attnspec vectors verify {bundle} {outputs} --name {name} --case {re.escape(case.id)}",
        ]
    )


def family_shapes(case: VectorCase) -> tuple[str, ...]:
    """The inputs a message shows the shapes of: the positional arrays of the case's function."""
    fam = _FAMILIES.get(case.family or case.function)
    return fam.positional if fam else ("q", "k", "v")


def finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


# the other functions' families (sdpa_vjp, mha, lsh_attention) register themselves, then the
# serving, paged and FP8 ones: registered after, so the earlier bundles and case ids stay put
from attnspec.conformance import vectors_families as _families  # noqa: E402,F401
from attnspec.conformance import vectors_kernels as _kernels  # noqa: E402,F401
