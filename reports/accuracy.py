"""The conformance page ``accuracy.md``: results per backend, device, feature and dtype.
``deviations.md`` is rendered by `attnspec.reports.deviations`."""

from __future__ import annotations

import re
from typing import Any

from attnspec.reports._io import Results, as_float
from attnspec.reports._md import DASH, anchor, fence, num, run_label, table

__all__ = ["FUNCTION_ORDER", "accuracy_page", "run_key", "totals", "verdict"]

#: the order functions are listed in, here and in the docs' results pages (FP8 last: its dtypes are
#: columns of their own)
FUNCTION_ORDER = (
    *("sdpa", "sdpa_blocked", "mha", "lsh_attention"),
    *("sdpa_vjp", "sdpa_blocked_vjp", "mha_vjp", "lsh_attention_vjp"),
    "sdpa_fp8",
)
COUNTS = ("run", "passed", "failed", "unsupported", "deviation", "crashed", "timeout")
NO_RESULTS = "No conformance results in `{dir}`; run `nox -s conformance`."


def _function_key(name: str) -> tuple[int, str]:
    return (FUNCTION_ORDER.index(name), "") if name in FUNCTION_ORDER else (len(FUNCTION_ORDER), name)


def _max(values) -> float | None:
    vals = [v for v in (as_float(x) for x in values) if v is not None and v == v]  # drop NaN
    return max(vals) if vals else None


def run_key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return (doc["backend"], doc["device"], doc["_file"])


def verdict(doc: dict[str, Any]) -> str:
    """ "FAILS" on any failed, crashed or timed-out case; else "deviates as declared" if a
    declared deviation was observed; else "conforms" (or "nothing run"). Stale declarations
    are appended, since a declaration that no longer matches the framework needs attention."""
    total = totals(doc)
    if total["failed"] + total["crashed"] + total["timeout"]:
        text = "FAILS"
    elif total["passed"] + total["deviation"] == 0:
        text = "nothing run"
    elif total["deviation"]:
        text = "deviates as declared"
    else:
        text = "conforms"
    stale = sum(1 for d in doc.get("deviations", []) if d.get("status") == "stale")
    if stale:
        text += f" ({stale} declared deviation{'s' if stale > 1 else ''} stale)"
    return text


def totals(doc: dict[str, Any]) -> dict[str, int]:
    return _counts(doc["rows"])


def _counts(rows) -> dict[str, int]:
    return {c: sum(int(r.get(c, 0)) for r in rows) for c in COUNTS}


def _summary(results: Results) -> str:
    rows = []
    for doc in sorted(results.conformance, key=run_key):
        t = totals(doc)
        rows.append(
            [
                doc["backend"],
                doc["device"],
                doc.get("device_name"),
                *(t[c] for c in COUNTS),
                num(_max(r.get("max_budget_used") for r in doc["rows"])),
                verdict(doc),
            ]
        )
    headers = [
        "backend",
        "device",
        "device name",
        "run",
        "passed",
        "failed",
        "unsupported",
        "deviation",
        "crashed",
        "timeout",
        "worst budget used",
        "verdict",
    ]
    return table(headers, rows, "lll" + "r" * 8 + "l")


def _matrix(results: Results, gradients: bool) -> str:
    """One row per run and function (forward ones, or the ``*_vjp`` ones), one cell per dtype:
    cases passed of those run, declared deviations, and the worst budget used."""
    # the FP8 storage dtypes (sdpa_fp8's cases) get columns only where some run has them
    seen = {r["dtype"] for doc in results.conformance for r in doc["rows"]}
    dtypes = (
        "float16",
        "bfloat16",
        "float32",
        "float64",
        *(d for d in ("float8_e4m3fn", "float8_e5m2") if d in seen),
    )
    rows = []
    for doc in sorted(results.conformance, key=run_key):
        fns = sorted(
            {r["function"] for r in doc["rows"] if str(r["function"]).endswith("_vjp") == gradients},
            key=_function_key,
        )
        for fn in fns:
            mine = [r for r in doc["rows"] if r["function"] == fn]
            cells = []
            for dt in dtypes:
                rs = [r for r in mine if r["dtype"] == dt]
                t = _counts(rs)
                if not t["run"]:
                    cells.append(DASH)
                elif t["unsupported"] == t["run"]:
                    cells.append("unsupported")
                else:
                    worst = _max(r.get("max_budget_used") for r in rs)
                    deviated = f" + {t['deviation']} dev." if t["deviation"] else ""
                    cells.append(f"{t['passed']}/{t['run']}{deviated}, budget {num(worst)}")
            t = _counts(mine)
            if t["unsupported"] == t["run"]:
                continue  # the per-function tables below give the reason
            rows.append(
                [doc["backend"], doc["device"], fn, *cells, t["failed"] + t["crashed"] + t["timeout"]]
            )
    if not rows:
        return ""
    return table(["backend", "device", "function", *dtypes, "failed"], rows, "lll" + "l" * len(dtypes) + "r")


def _notes(row: dict[str, Any]) -> str:
    parts = []
    reasons = sorted(str(r) for r in row.get("unsupported_reasons") or [] if r is not None)
    if reasons:
        parts.append("unsupported: " + "; ".join(reasons))
    ids = sorted(str(i) for i in row.get("deviation_ids") or [])
    if ids:
        parts.append("deviations: " + ", ".join(f"[{i}](deviations.md#{anchor(i)})" for i in ids))
    return " · ".join(parts) or ""


def _function_table(entries: list[tuple[dict, dict]]) -> str:
    rows = []
    for doc, r in entries:
        crashed = int(r.get("crashed", 0)) + int(r.get("timeout", 0))
        rows.append(
            [
                doc["backend"],
                doc["device"],
                r.get("property") or DASH,
                r["feature"],
                r["dtype"],
                r["run"],
                r["passed"],
                r["unsupported"],
                r["failed"],
                r.get("deviation", 0),
                crashed,
                num(r.get("max_abs_err")),
                num(r.get("max_rel_err")),
                num(r.get("max_budget_used")),
                _notes(r),
            ]
        )
    headers = [
        "backend",
        "device",
        "property",
        "feature",
        "dtype",
        "run",
        "passed",
        "unsupported",
        "failed",
        "deviation",
        "crashed/timeout",
        "max abs err",
        "max rel err",
        "max budget used",
        "notes",
    ]
    return table(headers, rows, "lllll" + "r" * 9 + "l")


def _refused_table(entries: list[tuple[dict, dict]]) -> str:
    """The rows whose every case the backend refused, one line per backend, device and reason:
    listed one by one they were most of the page (each repeating its reason)."""
    groups: dict[tuple[str, str, str], dict[str, set[str]]] = {}
    cases: dict[tuple[str, str, str], int] = {}
    for doc, r in entries:
        reasons = sorted(str(x) for x in r.get("unsupported_reasons") or [] if x is not None)
        key = (doc["backend"], doc["device"], "; ".join(reasons) or DASH)
        g = groups.setdefault(key, {"property": set(), "feature": set(), "dtype": set()})
        g["property"].add(r.get("property") or DASH)
        g["feature"].add(r["feature"])
        g["dtype"].add(r["dtype"])
        cases[key] = cases.get(key, 0) + int(r["run"])
    rows = [
        [*key[:2], ", ".join(sorted(g["dtype"])), len(g["property"]), len(g["feature"]), cases[key], key[2]]
        for key, g in sorted(groups.items())
    ]
    return table(
        ["backend", "device", "dtypes", "properties", "features", "cases", "reason"],
        rows,
        "lll" + "r" * 3 + "l",
    )


def _failures(results: Results) -> list[str]:
    out = []
    fields = ("function", "property", "feature", "dtype", "status", "message", "repro")
    items = []
    for doc in sorted(results.conformance, key=run_key):
        listed = doc.get("failures") or []
        for f in listed:
            items.append((run_key(doc), tuple(str(f.get(k) or "") for k in fields), doc, f))
        t = totals(doc)
        bad = t["failed"] + t["crashed"] + t["timeout"]
        if bad > len(listed):
            out.append(
                f"- {run_label(doc)}: {bad} failed, crashed or timed-out cases, "
                f"{len(listed)} kept in the results file (`{doc['_file']}`)."
            )
    if out:
        out = ["", *out]
    for i, (_, _, doc, f) in enumerate(sorted(items, key=lambda t: (t[0], t[1])), 1):
        what = " ".join(x for x in (f.get("function"), f.get("property")) if x)
        where = ", ".join(x for x in (f.get("feature"), f.get("dtype")) if x)
        out += [
            "",
            f"### {i}. {run_label(doc)}: {what} [{where}] — {f.get('status') or 'failed'}",
            "",
            fence(f.get("message") or "(no message)"),
        ]
        if f.get("repro"):
            out += ["", "Reproducer:", "", fence(f["repro"], "python")]
    return out


def accuracy_page(
    results: Results, plots: list[tuple[str, str]] | None = None, details: dict[str, str] | None = None
) -> str:
    """The Markdown of ``accuracy.md``. ``plots``: (title, path) of figures to show at the end.

    With ``details`` (a dict to fill), each function's table of every property, feature and
    dtype becomes a page of its own, ``accuracy/<function>.md`` -> its Markdown, and
    ``accuracy.md`` links them: a page a person can open (the single page passed 2 MB).
    """
    lines = ["# Accuracy", ""]
    if not results.conformance:
        return "\n".join([*lines, NO_RESULTS.format(dir=results.directory), ""])
    files = ", ".join(f"`{d['_file']}`" for d in sorted(results.conformance, key=run_key))
    lines += [
        f"Conformance to the golden specification, from {len(results.conformance)} run(s): {files}.",
        "A row counts the generated cases of one backend, device, property, feature and dtype.",
        "*Budget used* is the largest error divided by the allowed error of the tolerance rule",
        "(`attnspec.spec.tolerance`): a case passes at 1 or less. *Deviation* counts cases that",
        "differ from the spec exactly as a [declared deviation](deviations.md) says. *Max rel err*",
        "is taken only over elements whose golden magnitude exceeds their allowed error (nearer 0 a",
        "relative error measures nothing; results written before this rule may show absurd values).",
        "",
        "## Summary",
        "",
        _summary(results),
        "",
        "## By function and dtype",
        "",
        "Each cell: cases passed of those run (the rest failed, were unsupported or showed a",
        "declared deviation, counted as *dev.*) and the worst budget used. A function the",
        "backend supports at no dtype is left out here; the tables further down give the reason.",
        "",
        _matrix(results, gradients=False),
    ]
    grads = _matrix(results, gradients=True)
    if grads:
        lines += [
            "",
            "## Gradients",
            "",
            "Gradient functions (`*_vjp`), cells as above; the budget is the worst over the",
            "gradient tensors (`attnspec.spec.tolerance_grads`).",
            "",
            grads,
        ]
    entries = [(doc, r) for doc in results.conformance for r in doc["rows"]]
    functions = sorted({r["function"] for _, r in entries}, key=_function_key)
    if details is not None and functions:
        lines += [
            "",
            "## Every property, feature and dtype",
            "",
            "One page per function, a row per backend, device, property, feature and dtype:",
            "",
            *(f"- [{fn}](accuracy/{fn}.md)" for fn in functions),
        ]
    for fn in functions:
        mine = sorted(
            (e for e in entries if e[1]["function"] == fn),
            key=lambda e: (run_key(e[0]), e[1].get("property") or "", e[1]["feature"], e[1]["dtype"]),
        )
        ran = [e for e in mine if e[1]["unsupported"] < e[1]["run"]]
        refused = [e for e in mine if e[1]["unsupported"] >= e[1]["run"]]
        section = [_function_table(ran)] if ran else ["No backend ran a case of it."]
        if refused:
            section += [
                "",
                f"Refused in every case ({len(refused)} rows of property, feature and dtype, "
                "folded by backend and reason):",
                "",
                _refused_table(refused),
            ]
        if details is None:
            lines += ["", f"## {fn}", "", *section]
        else:  # one folder down: its relative links gain a ../
            body = re.sub(r"\]\((?!https?:|#|\.\./)", "](../", "\n".join(section))
            details[f"accuracy/{fn}.md"] = "\n".join(
                [
                    f"# Accuracy: {fn}",
                    "",
                    "Part of [the accuracy page](../accuracy.md), which explains the columns.",
                    "",
                    body,
                    "",
                ]
            )
    lines += ["", "## Failures"]
    fails = _failures(results)
    lines += fails if fails else ["", "None."]
    if plots:
        lines += ["", "## Attention weights of the golden specification", ""]
        lines += ["\n\n".join(f"![{title}]({path})" for title, path in plots)]
    return "\n".join(lines) + "\n"
