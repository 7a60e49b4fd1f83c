"""The conformance results as pages a person can navigate: an index of every run's verdict, one
page per backend (its runs, their failures with causes and clauses, its declared deviations) and
one per spec function (every run side by side, feature by feature). ``reports/accuracy.md`` holds
the same numbers on one page of 13,000 lines."""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from attnspec.reports.accuracy import FUNCTION_ORDER, verdict
from attnspec.spec.dtypes import FLOAT_DTYPES
from attnspec.spec.fp8 import FP8_DTYPES

from .atlas_pages import _table, rel
from .data import DASH, atlas, conformance, md_cell, slug

INDEX = "results/index.md"
COUNTS = ("run", "passed", "failed", "unsupported", "deviation", "crashed", "timeout")
DTYPES = (*FLOAT_DTYPES, *FP8_DTYPES)


def backend_page(backend: str) -> str:
    return f"results/backends/{slug(backend)}.md"


def function_page(function: str) -> str:
    return f"results/functions/{slug(function)}.md"


def _functions(docs) -> list[str]:
    seen = {r["function"] for d in docs for r in d["rows"]}
    return [f for f in FUNCTION_ORDER if f in seen] + sorted(seen - set(FUNCTION_ORDER))


def _counts(rows) -> dict[str, int]:
    return {c: sum(int(r.get(c) or 0) for r in rows) for c in COUNTS}


def _worst(rows) -> float | None:
    vals = [
        float(r["max_budget_used"])
        for r in rows
        if isinstance(r.get("max_budget_used"), (int, float)) and r["max_budget_used"] == r["max_budget_used"]
    ]
    return max(vals) if vals else None


def _num(x: float | None) -> str:
    return DASH if x is None else f"{x:.3g}"


def _bad(t: dict[str, int]) -> int:
    return t["failed"] + t["crashed"] + t["timeout"]


def _dtype_cell(rows) -> str:
    """passed/run, declared deviations, failures, and the worst budget after a dot: short enough
    that a column of them does not wrap."""
    t = _counts(rows)
    if not t["run"]:
        return DASH
    if t["unsupported"] == t["run"]:
        return "refused"
    text = f"{t['passed']}/{t['run']}"
    if t["deviation"]:
        text += f" +{t['deviation']} dev."
    if _bad(t):
        text += f" **{_bad(t)} failed**"
    worst = _worst(rows)
    return text + ("" if worst is None else f" · {worst:.2g}")


def _dtypes(rows) -> list[str]:
    seen = {r["dtype"] for r in rows}
    return [d for d in DTYPES if d in seen] + sorted(seen - set(DTYPES))


def _verdict(doc) -> str:
    v = verdict(doc)
    return f"**{v}**" if v.startswith("FAILS") else v


def _label(doc) -> str:
    return f"{doc['backend']} / {doc['device']}"


def index_page(docs, functions: list[str]) -> str:
    rows = []
    for doc in docs:
        t = _counts(doc["rows"])
        rows.append(
            [
                f"[{doc['backend']}]({rel(INDEX, backend_page(doc['backend']))})",
                doc["device"],
                md_cell(doc.get("device_name") or DASH),
                _verdict(doc),
                t["passed"],
                t["deviation"],
                _bad(t),
                t["unsupported"],
                _num(_worst(doc["rows"])),
            ]
        )
    frows = []
    for fn in functions:
        mine = [(d, r) for d in docs for r in d["rows"] if r["function"] == fn]
        t = _counts([r for _, r in mine])
        ran = {d["_file"] for d, r in mine if r["unsupported"] < r["run"]}
        frows.append(
            [f"[`{fn}`]({rel(INDEX, function_page(fn))})", len(ran), t["passed"], t["deviation"], _bad(t)]
        )
    lines = [
        "# Conformance results",
        "",
        f"{len(docs)} runs of the conformance suite, rendered from `reports/results/conformance-*.json`.",
        "A backend *conforms* when every case it accepted matched the golden within the tolerance rule;",
        "it *deviates as declared* when the cases that differ are exactly its declared deviations; it",
        "*FAILS* on anything else. *Budget* is the worst error divided by the allowed error (a case",
        "passes at 1 or less). Each backend's page lists its failures with their cause, the clauses",
        "they break and a reproducer; each function's page compares every run feature by feature.",
        "",
        "## Runs",
        "",
        _table(
            [
                "backend",
                "device",
                "device name",
                "verdict",
                "passed",
                "deviation",
                "failed",
                "refused",
                "worst budget",
            ],
            [[str(x) for x in r] for r in rows],
        ),
        "",
        "## By function",
        "",
        _table(
            ["function", "runs that ran it", "passed", "deviation", "failed"],
            [[str(x) for x in r] for r in frows],
        ),
        "",
    ]
    return "\n".join(lines)


def _dtype_row(first: list[str], mine: list[dict], dts: list[str]) -> list[str] | None:
    """A results row: ``first``, a cell per dtype, the failed count; None when no case ran or
    every one was refused."""
    t = _counts(mine)
    if t["unsupported"] == t["run"]:
        return None
    return [*first, *(_dtype_cell([r for r in mine if r["dtype"] == d]) for d in dts), str(_bad(t))]


def _matrix(doc, page: str, functions: list[str]) -> str:
    dts = _dtypes(doc["rows"])
    rows = []
    for fn in functions:
        link = f"[`{fn}`]({rel(page, function_page(fn))})"
        if mine := [r for r in doc["rows"] if r["function"] == fn]:
            rows.append(_dtype_row([link], mine, dts) or [link, *(["refused"] * len(dts)), "0"])
    return _table(["function", *dts, "failed"], rows)


def _deviations(doc) -> str:
    rows = []
    for d in doc.get("deviations") or []:
        decl = d.get("declaration") or {}
        rows.append(
            [
                f"`{d['id']}`",
                d.get("status", DASH),
                f"{d.get('observed', 0)} of {d.get('exercised', 0)}",
                md_cell(decl.get("native_does") or DASH),
                md_cell(d.get("source") or DASH),
            ]
        )
    if not rows:
        return "None declared for this backend."
    return _table(
        [
            "deviation",
            "status",
            "cases showing it / carrying its tags",
            "what the implementation does",
            "declared in",
        ],
        rows,
    )


def _fence(text: str, lang: str = "") -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def _failures(doc) -> list[str]:
    fails = doc.get("failures") or []
    t = _counts(doc["rows"])
    out = []
    if _bad(t) > len(fails):
        out += [f"{_bad(t)} failed, crashed or timed-out cases; the results file keeps {len(fails)}.", ""]
    if not fails:
        return out + (["None."] if not _bad(t) else [])
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in fails:  # one entry per cause, whatever clauses its cases name
        cause = f.get("cause") or (f.get("message") or "").split("\n", 1)[0]
        groups[cause.split(" [clause")[0]].append(f)
    for i, (cause, fs) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1])), 1):
        f = fs[0]
        clauses = sorted({c for x in fs for c in x.get("clauses") or []})
        where = sorted(
            {f"{x.get('function')} {x.get('property')} [{x.get('feature')}, {x.get('dtype')}]" for x in fs}
        )
        more = f" and {len(where) - 8} more" if len(where) > 8 else ""
        out += [
            f"**{i}. {md_cell(cause)[:200]}**",
            "",
            f"- **status**: {f.get('status') or 'failed'}; {len(fs)} case(s) kept",
            f"- **clauses broken**: {', '.join(f'`{c}`' for c in clauses) or DASH}",
            f"- **where**: {md_cell('; '.join(where[:8]))}{more}",
            "",
            "<details><summary>message of the first case</summary>",
            "",
            _fence(f.get("message") or "(no message)"),
            "",
            "</details>",
            "",
        ]
        if f.get("repro"):
            out += ["Reproducer:", "", _fence(f["repro"], "python"), ""]
    return out


def _refused(doc, limit: int = 25) -> str:
    """Refused cases by single reason (a row joins several), the most frequent first."""
    cases: dict[str, int] = defaultdict(int)
    functions: dict[str, set[str]] = defaultdict(set)
    for r in doc["rows"]:
        if r["run"] and r["unsupported"]:
            for reason in {str(x) for x in r.get("unsupported_reasons") or [] if x} or {DASH}:
                cases[reason] += int(r["unsupported"])
                functions[reason].add(r["function"])
    ordered = sorted(cases, key=lambda k: (-cases[k], k))
    rows = [
        [md_cell(k if len(k) <= 300 else k[:300] + "…"), ", ".join(sorted(functions[k])), str(cases[k])]
        for k in ordered[:limit]
    ]
    if not rows:
        return "Nothing refused."
    text = _table(["reason", "functions", "cases"], rows)
    if len(ordered) > limit:
        rest = ordered[limit:]
        text += (
            f"\n\nAnd {len(rest)} rarer reasons ({sum(cases[k] for k in rest)} cases); every one is in "
            f"`reports/results/{doc['_file']}`."
        )
    return text


def backend_page_text(backend: str, docs, functions: list[str]) -> str:
    page = backend_page(backend)
    in_atlas = any(i.backend == backend for i in atlas())
    lines = [
        f"# `{backend}`",
        "",
        f"[All results]({rel(page, INDEX)})"
        + (f" · [its atlas entry]({rel(page, 'atlas/' + slug(backend) + '.md')})" if in_atlas else ""),
        "",
    ]
    for doc in docs:
        t = _counts(doc["rows"])
        env = doc.get("environment") or {}
        versions = ", ".join(f"{k} {v}" for k, v in sorted((env.get("frameworks") or {}).items()))
        lines += [
            f"## {doc['device']}",
            "",
            f"**Verdict: {_verdict(doc).strip('*')}.** {t['passed']} cases passed, {t['deviation']} showed a "
            f"declared deviation, {_bad(t)} failed, crashed or timed out, {t['unsupported']} were refused "
            f"(of {t['run']} run); worst budget used {_num(_worst(doc['rows']))}.",
            "",
            f"- **device**: {md_cell(doc.get('device_name') or doc['device'])}",
            f"- **spec version**: {doc.get('spec_version') or 'before 1.0.0'}",
            f"- **versions**: {md_cell(versions or DASH)}",
            f"- **run**: {md_cell(env.get('date') or DASH)}, commit `{env.get('git_commit') or '?'}`, "
            f"profile {env.get('hypothesis_profile') or DASH}",
            f"- **results file**: `reports/results/{doc['_file']}`",
            "",
            "### By function and dtype",
            "",
            "Each cell: cases passed / run, declared deviations (*dev.*), failures, and after the dot the worst "
            "budget used (1 is the edge of the tolerance).",
            "",
            _matrix(doc, page, functions),
            "",
            "### Failures",
            "",
            *_failures(doc),
            "",
            "### Declared deviations",
            "",
            _deviations(doc),
            "",
            "### Refused",
            "",
            "Cases the backend declined as unsupported, by reason (a case may give several).",
            "",
            _refused(doc),
            "",
        ]
    return "\n".join(lines)


def function_page_text(fn: str, docs) -> str:
    page = function_page(fn)
    entries = [(d, r) for d in docs for r in d["rows"] if r["function"] == fn]
    dts = _dtypes([r for _, r in entries])
    mrows = []
    for d in docs:
        link = f"[{d['backend']}]({rel(page, backend_page(d['backend']))})"
        if row := _dtype_row([link, d["device"]], [r for r in d["rows"] if r["function"] == fn], dts):
            mrows.append(row)
    refused = sorted(
        {
            f"{d['backend']} / {d['device']}"
            for d in docs
            if (rs := [r for r in d["rows"] if r["function"] == fn])
            and _counts(rs)["unsupported"] == _counts(rs)["run"]
        }
    )
    by_feature: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    for d, r in entries:
        by_feature[r["feature"]].append((d, r))
    frows = []
    for feat, items in sorted(by_feature.items()):
        t = _counts([r for _, r in items])
        ran = sorted({_label(d) for d, r in items if r["unsupported"] < r["run"]})
        dev = sorted(
            {
                f"[{d['backend']}]({rel(page, backend_page(d['backend']))})"
                for d, r in items
                if r.get("deviation")
            }
        )
        bad = sorted(
            {
                f"[{d['backend']}]({rel(page, backend_page(d['backend']))}) ({d['device']})"
                for d, r in items
                if _bad(_counts([r]))
            }
        )
        frows.append(
            [
                f"`{feat}`",
                str(len(ran)),
                str(t["passed"]),
                ", ".join(dev) or DASH,
                ", ".join(bad) or DASH,
                str(t["unsupported"]),
            ]
        )
    lines = [
        f"# `{fn}`",
        "",
        f"[All results]({rel(page, INDEX)})",
        "",
        "## By run and dtype",
        "",
        "Each cell: cases passed / run, declared deviations (*dev.*), failures, and after the dot the worst "
        "budget used (1 is the edge of the tolerance).",
        "",
        _table(["backend", "device", *dts, "failed"], mrows) if mrows else "No run accepted a case of it.",
        "",
    ]
    if refused:
        lines += [f"Refused in every case by: {', '.join(refused)}.", ""]
    lines += [
        "## By feature",
        "",
        "Each feature the suite draws for this function: the runs that ran some of its cases, the cases",
        "passed over all runs, the backends whose declared deviations showed there, those that failed,",
        "and the cases refused.",
        "",
        _table(["feature", "runs", "passed", "deviations", "failed", "refused"], frows),
        "",
    ]
    fails = [(d, f) for d in docs for f in d.get("failures") or [] if f.get("function") == fn]
    if fails:
        lines += ["## Failures", ""]
        rows = [
            [
                f"[{d['backend']}]({rel(page, backend_page(d['backend']))})",
                d["device"],
                md_cell(f"{f.get('property')} [{f.get('feature')}, {f.get('dtype')}]"),
                md_cell((f.get("cause") or "").split(" [clause")[0][:200]),
                ", ".join(f"`{c}`" for c in f.get("clauses") or []) or DASH,
            ]
            for d, f in fails
        ]
        lines += [_table(["backend", "device", "case", "cause", "clauses"], rows), ""]
    return "\n".join(lines)


def pages() -> list[tuple[str, str]]:
    docs = list(conformance())
    functions = _functions(docs)
    out = [(INDEX, index_page(docs, functions))]
    for backend in sorted({d["backend"] for d in docs}):
        out.append(
            (
                backend_page(backend),
                backend_page_text(backend, [d for d in docs if d["backend"] == backend], functions),
            )
        )
    for fn in functions:
        out.append((function_page(fn), function_page_text(fn, docs)))
    return out
