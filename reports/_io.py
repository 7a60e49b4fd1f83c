"""Reading results JSON (validated) and staging a render; writing it is `attnspec.results`.

Results are written by other processes, possibly on other machines and by older or newer kits, so
every file is checked against its schema (`reports/SCHEMA.md`) before anything is rendered; a
problem is reported as ``<file>: <where>: <what is wrong>`` through `ResultsError`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnspec.results import fsync_dir

__all__ = ["Results", "ResultsError", "StagedOutput", "load_results"]

CONFORMANCE = "attnspec.conformance/1"
BENCH = "attnspec.bench/1"
LSH_QUALITY = "attnspec.lsh_quality/1"
SUITE_TIMING = "attnspec.suite_timing/1"
MAX_PROBLEMS_PER_FILE = 5


class ResultsError(ValueError):
    """A results file that cannot be rendered: the message names the file and the problem."""


# -- staging a render ---------------------------------------------------------------------------
class StagedOutput:
    """Render into a temporary directory inside ``out``; move the files into place only on success.

    Each file is moved with `os.replace` (same filesystem, so atomic per file): an interrupted
    render leaves every previous file byte-identical, and a reader never sees a truncated page.
    Plots under ``plots/`` and pages under ``accuracy/`` from an earlier render that this one did
    not produce are removed after the move, so the directory holds exactly what the pages reference.
    """

    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self.tmp: Path | None = None
        self.written: list[str] = []

    def __enter__(self) -> StagedOutput:
        self.out.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix="_tmp-render-", dir=self.out))
        return self

    @property
    def _staging(self) -> Path:
        assert self.tmp is not None, "StagedOutput used outside its with-block"
        return self.tmp

    def path(self, rel: str) -> Path:
        """Where to write the output file ``rel`` (a POSIX path relative to ``out``) for now."""
        p = self._staging / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if rel not in self.written:
            self.written.append(rel)
        return p

    def write_text(self, rel: str, text: str) -> None:
        self.path(rel).write_text(text, encoding="utf-8", newline="\n")  # same bytes everywhere

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self._commit()
        finally:
            shutil.rmtree(self._staging, ignore_errors=True)

    def _commit(self) -> None:
        # plots first and index.md last: a page never links to a plot that is not there yet
        order = sorted(self.written, key=lambda r: (not r.startswith("plots/"), r == "index.md", r))
        for rel in order:
            with open(self._staging / rel, "r+b") as f:  # writable: Windows refuses fsync otherwise
                os.fsync(f.fileno())
        for rel in order:
            dest = self.out / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._staging / rel, dest)
        for folder, pattern in (("plots", "*.png"), ("accuracy", "*.md")):
            if (self.out / folder).is_dir():
                for old in sorted((self.out / folder).glob(pattern)):
                    if f"{folder}/{old.name}" not in self.written:
                        old.unlink()
        fsync_dir(self.out)


# -- reading --------------------------------------------------------------------------------------
@dataclass
class Results:
    """Every results document found in one directory, validated, in file-name order.

    Each document is the parsed JSON plus ``"_file"``: its file name.
    """

    directory: Path
    conformance: list[dict[str, Any]] = field(default_factory=list)
    bench: list[dict[str, Any]] = field(default_factory=list)
    lsh_quality: list[dict[str, Any]] = field(default_factory=list)
    suite_timing: list[dict[str, Any]] = field(default_factory=list)

    @property
    def files(self) -> list[str]:
        return sorted(
            d["_file"] for d in (*self.conformance, *self.bench, *self.lsh_quality, *self.suite_timing)
        )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    if isinstance(x, str):
        return x.strip().lower() in ("inf", "+inf", "-inf", "nan", "infinity", "-infinity")
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_CHECKS = {
    "str": (lambda x: isinstance(x, str), "a string"),
    "int": (_is_int, "an integer"),
    "num": (_is_number, "a number"),
    "num?": (lambda x: x is None or _is_number(x), "a number or null"),
    "int?": (lambda x: x is None or _is_int(x), "an integer or null"),
    "str?": (lambda x: x is None or isinstance(x, str), "a string or null"),
    "bool": (lambda x: isinstance(x, bool), "true or false"),
    "bool?": (lambda x: x is None or isinstance(x, bool), "true, false or null"),
    "list": (lambda x: isinstance(x, list), "a list"),
    "dict": (lambda x: isinstance(x, dict), "an object"),
}

# field -> (kind, required)
Fields = dict[str, tuple[str, bool]]


def _fields(required: str, optional: str = "") -> Fields:
    """A record's fields from ``"name:kind name:kind ..."``, those in ``required`` required (kinds: the
    keys of `_CHECKS`)."""
    out: Fields = {}
    for names, needed in ((required, True), (optional, False)):
        for entry in names.split():
            name, kind = entry.split(":")
            out[name] = (kind, needed)
    return out


_TOP = _fields("schema:str backend:str device:str rows:list", "device_name:str? environment:dict")
_CONF_TOP = {**_TOP, **_fields("", "failures:list deviations:list spec_version:str")}
_BENCH_TOP = {**_TOP, **_fields("", "matmul_tflops:dict targets:list")}
_CONF_ROW = _fields(
    "function:str feature:str dtype:str run:int passed:int failed:int unsupported:int",
    "property:str deviation:int crashed:int timeout:int max_abs_err:num? max_rel_err:num? "
    "max_budget_used:num? unsupported_reasons:list deviation_ids:list",
)
_FAILURE = _fields(
    "",
    "function:str? property:str? feature:str? dtype:str? status:str? cause:str? message:str? repro:str? "
    "clauses:list",
)
_DEVIATION = _fields("id:str status:str", "observed:int? exercised:int?")
_BENCH_ROW = _fields(
    "implementation:str pass:str dtype:str B:int H:int n:int m:int d:int causal:bool median_s:num",
    "min_s:num? max_s:num? repeats:int? tflops:num? share_of_matmul:num? peak_mem_bytes:int? mem_method:str?",
)
_TARGET = _fields("name:str met:bool?", "value:num? target:num? detail:str?")
_LSH_TOP = _fields("schema:str rows:list")
_TIMING = _fields(
    "schema:str backend:str device:str profile:str selection:str jobs:int tests:int cases:int seconds:num "
    "first_result_s:num? incomplete:bool",
    "date:str git_commit:str?",
)
_LSH_ROW = _fields("input:str n_hashes:int seed:int rel_err:num")


def _check(obj: Any, spec: dict[str, tuple[str, bool]], where: str, problems: list[str]) -> bool:
    if not isinstance(obj, dict):
        problems.append(f"{where}: must be an object, got {type(obj).__name__}")
        return False
    for name, (kind, required) in spec.items():
        if name not in obj:
            if required:
                problems.append(f"{where}: missing field {name!r}")
            continue
        ok, expected = _CHECKS[kind]
        if not ok(obj[name]):
            problems.append(f"{where}: field {name!r} must be {expected}, got {json.dumps(obj[name])[:60]}")
    return True


def _check_list(doc: dict, key: str, spec: dict, problems: list[str]) -> None:
    items = doc.get(key)
    if isinstance(items, list):
        for i, item in enumerate(items):
            _check(item, spec, f"{key}[{i}]", problems)


def _validate(doc: Any, kind: str) -> list[str]:
    problems: list[str] = []
    expected = {
        "conformance": CONFORMANCE,
        "bench": BENCH,
        "lsh_quality": LSH_QUALITY,
        "suite_timing": SUITE_TIMING,
    }[kind]
    if not isinstance(doc, dict):
        return [f"top level must be an object, got {type(doc).__name__}"]
    if doc.get("schema") != expected:
        return [
            f"schema is {json.dumps(doc.get('schema'))}, expected {expected!r} "
            f"(a {kind} results file, see reports/SCHEMA.md)"
        ]
    if kind == "conformance":
        _check(doc, _CONF_TOP, "top level", problems)
        _check_list(doc, "rows", _CONF_ROW, problems)
        _check_list(doc, "failures", _FAILURE, problems)
        _check_list(doc, "deviations", _DEVIATION, problems)
    elif kind == "bench":
        _check(doc, _BENCH_TOP, "top level", problems)
        _check_list(doc, "rows", _BENCH_ROW, problems)
        _check_list(doc, "targets", _TARGET, problems)
        rates = doc.get("matmul_tflops")
        for dtype, rate in rates.items() if isinstance(rates, dict) else ():
            if not (rate is None or _is_number(rate)):
                problems.append(f"matmul_tflops[{dtype!r}]: must be a number, got {json.dumps(rate)[:60]}")
    elif kind == "suite_timing":
        _check(doc, _TIMING, "top level", problems)
    else:
        _check(doc, _LSH_TOP, "top level", problems)
        _check_list(doc, "rows", _LSH_ROW, problems)
    return problems


def _read(path: Path, kind: str) -> tuple[dict | None, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, [f"cannot be read: {exc}"]
    if not text.strip():
        return None, ["is empty (was its writer interrupted?)"]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, [f"is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]
    return doc, _validate(doc, kind)


def read_document(path: str | os.PathLike, schema: str) -> dict[str, Any]:
    """A results file of one schema (a page of its own: copy task, mutation), read as JSON and
    its ``schema`` checked; `ResultsError` names the file and the problem."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: cannot be read as JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != schema:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ResultsError(f"{path}: schema is {json.dumps(got)}, expected {schema!r}")
    return doc


def load_results(directory: str | os.PathLike) -> Results:
    """Read and validate every ``conformance-*.json``, ``bench-*.json``, ``lsh-quality*.json`` and
    ``suite-timings/*.json``.

    A missing directory gives empty results. Raises `ResultsError` listing every malformed file.
    """
    directory = Path(directory)
    results = Results(directory)
    if not directory.is_dir():
        return results
    errors: list[str] = []
    for kind, pattern in (
        ("conformance", "conformance-*.json"),
        ("bench", "bench-*.json"),
        ("lsh_quality", "lsh-quality*.json"),
        ("suite_timing", "suite-timings/*.json"),
    ):
        for path in sorted(directory.glob(pattern)):
            doc, problems = _read(path, kind)
            if problems:
                shown = problems[:MAX_PROBLEMS_PER_FILE]
                more = len(problems) - len(shown)
                errors.extend(f"{path}: {p}" for p in shown)
                if more:
                    errors.append(f"{path}: ... and {more} more problems")
                continue
            assert doc is not None  # _read gives a document whenever it finds no problem
            doc["_file"] = str(path.relative_to(directory))
            getattr(results, kind).append(doc)
    if errors:
        raise ResultsError("\n".join(errors))
    return results


def as_float(x: Any) -> float | None:
    """A schema number (int, float, or "inf"/"nan" string) as a float; None stays None."""
    if x is None:
        return None
    return float(x)
