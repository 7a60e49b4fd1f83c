"""The conformance pages: ``accuracy.md`` (results per backend, device, feature, dtype) and
``deviations.md`` (declared native-primitive deviations and what each run observed)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from attnspec.reports._io import Results, as_float
from attnspec.reports._md import DASH, anchor, fence, num, run_label, table

__all__ = ["accuracy_page", "declared_deviations", "deviations_page", "totals", "verdict"]

FUNCTION_ORDER = ("sdpa", "sdpa_blocked", "mha", "lsh_attention",
                  "sdpa_vjp", "sdpa_blocked_vjp", "mha_vjp", "lsh_attention_vjp")
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
    """"FAILS" on any failed, crashed or timed-out case; else "deviates as declared" if a
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
        rows.append([doc["backend"], doc["device"], doc.get("device_name"), *(t[c] for c in COUNTS),
                     num(_max(r.get("max_budget_used") for r in doc["rows"])), verdict(doc)])
    headers = ["backend", "device", "device name", "run", "passed", "failed", "unsupported",
               "deviation", "crashed", "timeout", "worst budget used", "verdict"]
    return table(headers, rows, "lll" + "r" * 8 + "l")


def _matrix(results: Results, gradients: bool) -> str:
    """One row per run and function (forward ones, or the ``*_vjp`` ones), one cell per dtype:
    cases passed of those run, declared deviations, and the worst budget used."""
    dtypes = ("float16", "bfloat16", "float32", "float64")
    rows = []
    for doc in sorted(results.conformance, key=run_key):
        fns = sorted({r["function"] for r in doc["rows"] if str(r["function"]).endswith("_vjp") == gradients},
                     key=_function_key)
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
            rows.append([doc["backend"], doc["device"], fn, *cells, t["failed"] + t["crashed"] + t["timeout"]])
    if not rows:
        return ""
    return table(["backend", "device", "function", *dtypes, "failed"], rows, "lll" + "l" * 4 + "r")


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
        rows.append([doc["backend"], doc["device"], r.get("property") or DASH, r["feature"], r["dtype"],
                     r["run"], r["passed"], r["unsupported"], r["failed"], r.get("deviation", 0), crashed,
                     num(r.get("max_abs_err")), num(r.get("max_rel_err")),
                     num(r.get("max_budget_used")), _notes(r)])
    headers = ["backend", "device", "property", "feature", "dtype", "run", "passed", "unsupported",
               "failed", "deviation", "crashed/timeout", "max abs err", "max rel err",
               "max budget used", "notes"]
    return table(headers, rows, "lllll" + "r" * 9 + "l")


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
            out.append(f"- {run_label(doc)}: {bad} failed, crashed or timed-out cases, "
                       f"{len(listed)} kept in the results file (`{doc['_file']}`).")
    if out:
        out = ["", *out]
    for i, (_, _, doc, f) in enumerate(sorted(items, key=lambda t: (t[0], t[1])), 1):
        what = " ".join(x for x in (f.get("function"), f.get("property")) if x)
        where = ", ".join(x for x in (f.get("feature"), f.get("dtype")) if x)
        out += ["", f"### {i}. {run_label(doc)}: {what} [{where}] — {f.get('status') or 'failed'}", "",
                fence(f.get("message") or "(no message)")]
        if f.get("repro"):
            out += ["", "Reproducer:", "", fence(f["repro"], "python")]
    return out


def accuracy_page(results: Results, plots: list[tuple[str, str]] | None = None) -> str:
    """The Markdown of ``accuracy.md``. ``plots``: (title, path) of figures to show at the end."""
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
        "", "## Summary", "", _summary(results),
        "", "## By function and dtype", "",
        "Each cell: cases passed of those run (the rest failed, were unsupported or showed a",
        "declared deviation, counted as *dev.*) and the worst budget used. A function the",
        "backend supports at no dtype is left out here; the tables further down give the reason.", "",
        _matrix(results, gradients=False),
    ]
    grads = _matrix(results, gradients=True)
    if grads:
        lines += ["", "## Gradients", "",
                  "Gradient functions (`*_vjp`), cells as above; the budget is the worst over the",
                  "gradient tensors (`attnspec.spec.tolerance_grads`).", "", grads]
    entries = [(doc, r) for doc in results.conformance for r in doc["rows"]]
    for fn in sorted({r["function"] for _, r in entries}, key=_function_key):
        mine = sorted((e for e in entries if e[1]["function"] == fn),
                      key=lambda e: (run_key(e[0]), e[1].get("property") or "", e[1]["feature"],
                                     e[1]["dtype"]))
        lines += ["", f"## {fn}", "", _function_table(mine)]
    lines += ["", "## Failures"]
    fails = _failures(results)
    lines += fails if fails else ["", "None."]
    if plots:
        lines += ["", "## Attention weights of the golden specification", ""]
        lines += ["\n\n".join(f"![{title}]({path})" for title, path in plots)]
    return "\n".join(lines) + "\n"


# -- deviations ---------------------------------------------------------------------------------
def _field(obj: Any, *names: str) -> Any:
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _as_dict(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return dict(getattr(obj, "__dict__", {}))


def declared_deviations() -> tuple[list[dict[str, Any]], str | None]:
    """The deviations of `attnspec.backends.deviations`, normalized; and a note if it failed."""
    try:
        module = importlib.import_module("attnspec.backends.deviations")
    except ModuleNotFoundError as exc:
        if exc.name in ("attnspec.backends.deviations", "attnspec.backends"):
            return [], None
        return [], f"`attnspec.backends.deviations` failed to import: {exc}"
    except Exception as exc:  # a broken declaration file must not stop the report
        return [], f"`attnspec.backends.deviations` failed to import: {type(exc).__name__}: {exc}"
    items = getattr(module, "DEVIATIONS", None) or getattr(module, "deviations", None) or []
    if isinstance(items, dict):  # {id: deviation}
        items = [d if _field(d, "id", "deviation_id") else {**_as_dict(d), "id": k} for k, d in items.items()]
    out = []
    for d in items:
        did = _field(d, "id", "deviation_id")
        if did is None:
            continue
        out.append({
            "id": str(did), "backend": _field(d, "backend"), "feature": _field(d, "feature"),
            "spec_says": _field(d, "spec_says", "spec"), "native_does": _field(d, "native_does", "native"),
            "reproducer": _field(d, "reproducer", "repro"), "fixed_by": _field(d, "fixed_by", "fixup"),
            "upstream": _field(d, "upstream", "issue", "link"), "source": "declared",
        })
    return out, None


def _all_deviations(results: Results) -> tuple[list[dict[str, Any]], str | None]:
    declared, note = declared_deviations()
    known = {d["id"] for d in declared}
    for doc in results.conformance:
        for entry in doc.get("deviations") or []:
            if entry["id"] not in known:
                known.add(entry["id"])
                declared.append({"id": entry["id"], "backend": doc["backend"], "source": "results"})
    return sorted(declared, key=lambda d: (str(d.get("backend")), d["id"])), note


def _observations(dev: dict[str, Any], results: Results) -> list[list[Any]]:
    rows = []
    for doc in sorted(results.conformance, key=run_key):
        entry = next((e for e in doc.get("deviations") or [] if e["id"] == dev["id"]), None)
        if entry is None and doc["backend"] != dev.get("backend"):
            continue
        if entry is None:
            rows.append([run_label(doc), "not recorded", DASH, DASH])
        else:
            rows.append([run_label(doc), entry["status"].replace("_", " "), entry.get("observed"),
                         entry.get("exercised")])
    return rows


def deviations_page(results: Results) -> str:
    """The Markdown of ``deviations.md``."""
    devs, note = _all_deviations(results)
    lines = [
        "# Declared deviations", "",
        "Where a framework's native primitive does not do what the spec says, the adapter fixes it",
        "up, and the native behaviour is declared in `attnspec/backends/deviations.py` with a",
        "reproducer. The conformance suite checks each declaration in both directions: *observed*",
        "(cases showed it), *stale* (cases that should show it ran and none did: the framework may",
        "have changed, so the declaration and its fix-up need review), *not exercised* (no case",
        "reached it).",
    ]
    if note:
        lines += ["", f"> {note}"]
    if not devs:
        return "\n".join([*lines, "", "No deviations are declared.", ""])
    summary = []
    for d in devs:
        seen = "; ".join(f"{r[0]}: {r[1]}" for r in _observations(d, results)) or "no run of this backend"
        summary.append([f"[{d['id']}](#{anchor(d['id'])})", d.get("backend"), d.get("feature"),
                        d.get("fixed_by"), seen])
    lines += ["", "## Summary", "", table(["id", "backend", "feature", "fixed by", "status per run"],
                                          summary)]
    for d in devs:
        lines += ["", f"## {d['id']}", ""]
        if d["source"] == "results":
            lines += ["Reported by a results file but not declared in this checkout's",
                      "`attnspec.backends.deviations` (results from another version?).", ""]
        facts = [["backend", d.get("backend")], ["feature", d.get("feature")],
                 ["spec says", d.get("spec_says")], ["framework does", d.get("native_does")],
                 ["fixed by", d.get("fixed_by")]]
        if d.get("upstream"):
            facts.append(["upstream", d["upstream"]])
        lines += [table(["field", "value"], facts)]
        if d.get("reproducer"):
            lines += ["", "Reproducer:", "", fence(str(d["reproducer"]), "python")]
        obs = _observations(d, results)
        lines += [""]
        lines += [table(["run", "status", "observed", "exercised"], obs, "llrr")] if obs else \
            [f"No conformance run of backend `{d.get('backend')}` in the results."]
    return "\n".join(lines) + "\n"

