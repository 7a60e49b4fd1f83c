"""``reports/atlas.md``: outside implementations against the spec, one cross-table.

Rows are implementations, columns the semantic questions the spec decides
(`attnspec.backends.atlas.questions`) and the worst budget used per dtype in the conformance
suite. Each cell is the measured answer; one that differs from the spec links its declared
deviation, or is marked undeclared. Rendered from ``atlas-*.json`` (``nox -s atlas``) and the
same backends' ``conformance-*.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attnspec.reports._md import DASH, anchor, table
from attnspec.spec.dtypes import FLOAT_DTYPES

__all__ = ["atlas_page", "load_atlas"]

DTYPES = FLOAT_DTYPES


def load_atlas(directory: Path) -> list[dict[str, Any]]:
    """Every ``atlas-*.json`` of ``directory`` (schema attnspec.atlas/1), sorted by backend."""
    docs = []
    for path in sorted(Path(directory).glob("atlas-*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("schema") == "attnspec.atlas/1":
            doc["_file"] = path.name
            docs.append(doc)
    return sorted(docs, key=lambda d: d["backend"])


def _cell(answer: dict[str, Any], declared: dict[str, dict[str, Any]]) -> str:
    got, spec = answer["answer"], answer["spec"]
    if got.startswith("n/a"):
        return f"{DASH} ({got[5:]})" if len(got) < 60 else DASH
    if not spec or got == spec:
        return got
    entry = declared.get(answer["id"])
    if entry is not None:
        return f"**{got}** [{entry['id']}](#{anchor(entry['id'])})"
    return f"**{got}** (undeclared)"


def _budgets(conf: dict[str, Any] | None) -> list[str]:
    if conf is None:
        return [DASH] * len(DTYPES)
    worst: dict[str, float] = {}
    runs: dict[str, int] = {}
    for r in conf["rows"]:
        runs[r["dtype"]] = runs.get(r["dtype"], 0) + r["passed"] + r["failed"]
        if r.get("max_budget_used") is not None and r["passed"]:
            worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), r["max_budget_used"])
    return [f"{worst[d]:.2g}" if d in worst else ("unsupported" if not runs.get(d) else DASH) for d in DTYPES]


def _verdict(conf: dict[str, Any] | None) -> str:
    if conf is None:
        return "not run"
    tot = {
        s: sum(r.get(s, 0) for r in conf["rows"])
        for s in ("passed", "failed", "deviation", "crashed", "timeout")
    }
    bad = tot["failed"] + tot["crashed"] + tot["timeout"]
    return f"{tot['passed']} passed, {tot['deviation']} deviations, {bad} failed" + (
        " (incomplete)" if conf.get("incomplete") else ""
    )


def atlas_page(atlas: list[dict[str, Any]], conformance: list[dict[str, Any]], source: str) -> str:
    from attnspec.backends.atlas.deviations import check
    from attnspec.backends.atlas.questions import QUESTIONS

    conf_by = {d["backend"]: d for d in conformance}
    lines = [
        "# The attention atlas",
        "",
        f"Rendered by `python -m attnspec.reports.render` from `{source}/atlas-*.json` and the same backends'",
        "conformance results (`nox -s atlas`); do not edit by hand.",
        "",
        "Each row is an implementation nobody here wrote, called as its users call it (its native",
        "primitive through a calling convention, no fix-up); each column a question where",
        "implementations disagree and the spec decides. **Bold** answers differ from the spec and link",
        "their declared deviation below; *undeclared* ones are new. A dash is a question the",
        "implementation cannot be asked (it has no such argument). The spec's own answers are the",
        "first row. *Budget* is the worst error / allowed error of the conformance suite's passing",
        "cases per dtype (1 = the edge of the tolerance).",
    ]
    questions = [q for q in QUESTIONS]
    headers = [
        "implementation",
        *(q.title for q in questions),
        *(f"budget {d}" for d in DTYPES),
        "suite (dev)",
    ]
    rows = [["**the spec**", *(q.spec or "(both exist)" for q in questions), *([DASH] * len(DTYPES)), DASH]]
    all_entries: list[tuple[str, dict[str, Any]]] = []
    undeclared_all: list[tuple[str, dict[str, Any]]] = []
    for doc in atlas:
        entries, undeclared = check(doc["backend"], doc["answers"])
        declared = {e["question"]: e for e in entries}
        all_entries += [(doc["backend"], e) for e in entries]
        undeclared_all += [(doc["backend"], u) for u in undeclared]
        by_id = {a["id"]: a for a in doc["answers"]}
        conf = conf_by.get(doc["backend"])
        cells = [_cell(by_id[q.id], declared) if q.id in by_id else DASH for q in questions]
        rows.append([f"`{doc['backend']}`", *cells, *_budgets(conf), _verdict(conf)])
    lines += ["", table(headers, rows)]
    lines += ["", "## Implementations and versions measured", ""]
    vrows = []
    for doc in atlas:
        impl = doc.get("implementation") or {}
        env = (doc.get("environment") or {}).get("frameworks", {})
        versions = ", ".join(
            f"{k} {v}" for k, v in sorted(env.items()) if k not in ("hypothesis", "ml_dtypes")
        )
        vrows.append(
            [f"`{doc['backend']}`", impl.get("function", DASH), impl.get("convention", DASH), versions]
        )
    lines += [table(["backend", "function", "convention", "versions"], vrows)]
    lines += [
        "",
        "## Declared deviations",
        "",
        "From `backends/atlas/deviations.toml`, checked both ways on this run: *observed* (the question",
        "still gives the declared answer), *stale* (it no longer does: the entry must go), *not exercised*.",
        "Each reproducer is the exact framework call the atlas made, standalone (no attnspec in it).",
        "",
    ]
    shown: set[str] = set()
    for backend, e in all_entries:
        if e["id"] in shown:  # a built-in deviation can answer for two questions
            continue
        shown.add(e["id"])
        doc = next(d for d in atlas if d["backend"] == backend)
        snippet = next((a["reproducer"] for a in doc["answers"] if a["id"] == e["question"]), "")
        link = f" Upstream: <{e['upstream']}>." if e["upstream"] else ""
        lines += [
            f"### {e['id']}",
            "",
            f"`{backend}`, question *{e['question']}*: declared **{e['declared']}**, measured "
            f"**{e['measured']}**, status **{e['status']}**. {e['summary']}.{link}",
            "",
        ]
        if snippet:
            lines += [
                "<details><summary>reproducer</summary>",
                "",
                "```python",
                snippet,
                "```",
                "",
                "</details>",
                "",
            ]
    if undeclared_all:
        lines += [
            "## Undeclared differences",
            "",
            table(
                ["backend", "question", "answer", "spec"],
                [[b, u["title"], u["answer"], u["spec"]] for b, u in undeclared_all],
            ),
        ]
    lines += [
        "",
        "## How to read and extend it",
        "",
        "`nox -s atlas` installs each implementation in its own environment (`pip install .[atlas]` installs",
        "them all), asks it the questions (`python -m attnspec.backends.atlas.questions NAME --out FILE`)",
        "and runs the conformance suite on it. An implementation is a few lines: a function on a calling",
        "convention (`attnspec.backends.atlas.natives`), then its deviations as data in",
        "`backends/atlas/deviations.toml`.",
    ]
    return "\n".join(lines) + "\n"
