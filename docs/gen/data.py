"""The committed results and declarations the pages are rendered from, read once per build.

Nothing here runs an implementation: the atlas answers and reproducers come from
``reports/results/atlas-*.json``, the suite's verdicts from ``conformance-*.json``, the
declarations from `attnspec.backends.atlas.deviations` and `attnspec.backends.deviations`.
"""

from __future__ import annotations

import functools
import html
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "reports" / "results"

DASH = "—"

#: atlas question -> the clauses it measures. The questions name no clause themselves, and what
#: `attnspec.spec.clauses.case_clauses` derives from a question's options misses the point of
#: several (a causal flag is "sdpa.definition" there); `tests/test_docs_gen.py` checks that every
#: question is listed here and every id is a clause.
QUESTION_CLAUSES: dict[str, tuple[str, ...]] = {
    "empty_row_mask": ("sdpa.empty_row", "sdpa.mask"),
    "empty_row_bias": ("sdpa.empty_row", "sdpa.bias"),
    "nan_hidden_key": ("sdpa.hidden_nonfinite", "sdpa.visibility"),
    "nan_hidden_value": ("sdpa.hidden_nonfinite", "sdpa.visibility"),
    "causal_flag_n_lt_m": ("sdpa.causal.upper_left", "sdpa.causal.lower_right"),
    "causal_flag_n_gt_m": ("sdpa.causal.upper_left", "sdpa.causal.lower_right"),
    "window": ("sdpa.window",),
    "gqa_order": ("sdpa.gqa",),
    "dk_ne_dv": ("sdpa.definition",),
    "bias_and_mask": ("sdpa.bias", "sdpa.mask"),
    "kv_lengths": ("sdpa.lengths",),
    "weights": ("sdpa.weights",),
    "finite_floor": ("sdpa.visibility",),
    "causal_floor": ("sdpa.visibility",),
    "zero_batch": ("sdpa.zero_sizes",),
    "float64": ("sdpa.output_dtype",),
    "float64_scale": ("sdpa.output_dtype", "sdpa.scale"),
}


def slug(text: str) -> str:
    """An HTML id / file stem: lower case, anything but letters, digits and dashes to a dash."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")


def esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def md_cell(text: Any) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, one line)."""
    return re.sub(r"\s*\n\s*", " ", str(text)).replace("|", "\\|")


@dataclass
class Cell:
    """One implementation's answer to one question, judged against the spec."""

    backend: str
    question: str
    title: str
    answer: str
    spec: str
    status: str  # "spec" | "deviates" | "undeclared" | "n/a" | "documented" (the spec names several)
    reproducer: str = ""
    deviation: dict[str, Any] | None = None  # the declared entry (atlas check()), when it deviates

    @property
    def differs(self) -> bool:
        return self.status in ("deviates", "undeclared")


@dataclass
class Implementation:
    backend: str
    doc: dict[str, Any]
    cells: dict[str, Cell] = field(default_factory=dict)
    entries: list[dict[str, Any]] = field(default_factory=list)  # declared deviations, with status
    conformance: list[dict[str, Any]] = field(default_factory=list)

    @property
    def page(self) -> str:
        return f"atlas/{slug(self.backend)}.md"

    @property
    def anchor(self) -> str:
        return f"impl-{slug(self.backend)}"


def _read(pattern: str, schema: str, directory: Path) -> list[dict[str, Any]]:
    docs = []
    for path in sorted(directory.glob(pattern)):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("schema") == schema:
            doc["_file"] = path.name
            docs.append(doc)
    return docs


@functools.lru_cache(maxsize=4)
def conformance(directory: Path = RESULTS) -> tuple[dict[str, Any], ...]:
    """Every ``conformance-*.json``, by backend then device."""
    docs = _read("conformance-*.json", "attnspec.conformance/1", directory)
    return tuple(sorted(docs, key=lambda d: (d["backend"], d["device"], d["_file"])))


def _builtin_reproducers() -> dict[str, str]:
    from attnspec.backends.deviations import DEVIATIONS

    return {d.deviation_id: d.reproducer for d in DEVIATIONS}


@functools.lru_cache(maxsize=4)
def atlas(directory: Path = RESULTS) -> tuple[Implementation, ...]:
    """Every ``atlas-*.json`` as an `Implementation` whose cells are judged like ``atlas.md``'s."""
    from attnspec.backends.atlas.deviations import check

    builtin = _builtin_reproducers()
    runs = conformance(directory)
    out = []
    for doc in sorted(_read("atlas-*.json", "attnspec.atlas/1", directory), key=lambda d: d["backend"]):
        entries, undeclared = check(doc["backend"], doc["answers"])
        declared = {e["question"]: e for e in entries}
        undeclared_ids = {u["id"] for u in undeclared}
        impl = Implementation(
            doc["backend"],
            doc,
            entries=entries,
            conformance=[c for c in runs if c["backend"] == doc["backend"]],
        )
        for a in doc["answers"]:
            got, spec = a["answer"], a["spec"]
            entry = None
            if got.startswith("n/a"):
                status = "n/a"
            elif not spec:
                status = "documented"
            elif got == spec:
                status = "spec"
            elif a["id"] in declared:
                status, entry = "deviates", declared[a["id"]]
            else:
                status = "undeclared" if a["id"] in undeclared_ids else "deviates"
            repro = a.get("reproducer") or ""
            if not repro and entry is not None:  # a built-in native's: the catalogue's reproducer
                repro = builtin.get(entry["id"], "")
            impl.cells[a["id"]] = Cell(
                doc["backend"], a["id"], a.get("title") or a["id"], got, spec, status, repro, entry
            )
        out.append(impl)
    return tuple(out)


def questions() -> list[Any]:
    from attnspec.backends.atlas.questions import QUESTIONS

    return list(QUESTIONS)


def clauses() -> dict[str, Any]:
    from attnspec.spec.clauses import CLAUSES

    return CLAUSES
