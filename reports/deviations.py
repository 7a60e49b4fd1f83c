"""The page ``deviations.md``: every declared deviation, its facts and reproducer, where it is
declared, and what each conformance run observed.

The built-in catalogue is read from `attnspec.backends.deviations`. A deviation declared
elsewhere (a plugin's own, in its package; an atlas entry) comes from the results files, which
carry its declaration and its source (reports/SCHEMA.md).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from attnspec.reports._io import Results
from attnspec.reports._md import DASH, anchor, fence, run_label, table
from attnspec.reports.accuracy import run_key

__all__ = ["declared_deviations", "deviations_page"]

CATALOGUE = "attnspec.backends.deviations"


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


def _normalized(d: Any, source: str, declared_in: str) -> dict[str, Any] | None:
    did = _field(d, "id", "deviation_id")
    if did is None:
        return None
    return {
        "id": str(did),
        "backend": _field(d, "backend"),
        "feature": _field(d, "feature"),
        "spec_says": _field(d, "spec_says", "spec"),
        "native_does": _field(d, "native_does", "native"),
        "reproducer": _field(d, "reproducer", "repro"),
        "fixed_by": _field(d, "fixed_by", "fixup"),
        "upstream": _field(d, "upstream", "issue", "link"),
        "source": source,
        "declared_in": declared_in,
    }


def declared_deviations() -> tuple[list[dict[str, Any]], str | None]:
    """The deviations of `attnspec.backends.deviations`, normalized; and a note if it failed."""
    try:
        module = importlib.import_module(CATALOGUE)
    except ModuleNotFoundError as exc:
        if exc.name in (CATALOGUE, "attnspec.backends"):
            return [], None
        return [], f"`{CATALOGUE}` failed to import: {exc}"
    except Exception as exc:  # a broken declaration file must not stop the report
        return [], f"`{CATALOGUE}` failed to import: {type(exc).__name__}: {exc}"
    items = getattr(module, "DEVIATIONS", None) or getattr(module, "deviations", None) or []
    if isinstance(items, dict):  # {id: deviation}
        items = [d if _field(d, "id", "deviation_id") else {**_as_dict(d), "id": k} for k, d in items.items()]
    out = [_normalized(d, "declared", CATALOGUE) for d in items]
    return [d for d in out if d is not None], None


def _all_deviations(results: Results) -> tuple[list[dict[str, Any]], str | None]:
    declared, note = declared_deviations()
    known = {d["id"] for d in declared}
    for doc in results.conformance:
        for entry in doc.get("deviations") or []:
            if entry["id"] in known:
                continue
            known.add(entry["id"])
            declaration = entry.get("declaration")
            if isinstance(declaration, dict):  # declared outside the catalogue (a plugin, the atlas)
                dev = _normalized(
                    {**declaration, "id": entry["id"]},
                    "declaration",
                    str(entry.get("source") or "a results file"),
                )
                if dev is not None:
                    declared.append(dev)
                    continue
            declared.append(
                {
                    "id": entry["id"],
                    "backend": doc["backend"],
                    "source": "results",
                    "declared_in": entry.get("source"),
                }
            )
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
            rows.append(
                [
                    run_label(doc),
                    entry["status"].replace("_", " "),
                    entry.get("observed"),
                    entry.get("exercised"),
                ]
            )
    return rows


def deviations_page(results: Results) -> str:
    """The Markdown of ``deviations.md``."""
    devs, note = _all_deviations(results)
    lines = [
        "# Declared deviations",
        "",
        "Where a framework's native primitive does not do what the spec says, the adapter fixes it",
        "up, and the native behaviour is declared in `backends/deviations/torch.toml` or `jax.toml` with a",
        "reproducer. A plugin declares its own backend's deviations in its own package, and the",
        "atlas its natives' in `backends/atlas/deviations.toml`: *declared in* names where each",
        "entry comes from. The conformance suite checks each declaration in both directions: *observed*",
        "(cases showed it), *stale* (cases that should show it ran and none did: the framework may",
        "have changed, so the declaration and its fix-up need review), *not exercised* (no case",
        "reached it). A failure that no declaration covers fails the run.",
    ]
    if note:
        lines += ["", f"> {note}"]
    if not devs:
        return "\n".join([*lines, "", "No deviations are declared.", ""])
    summary = []
    for d in devs:
        seen = "; ".join(f"{r[0]}: {r[1]}" for r in _observations(d, results)) or "no run of this backend"
        summary.append(
            [
                f"[{d['id']}](#{anchor(d['id'])})",
                d.get("backend"),
                d.get("feature"),
                d.get("fixed_by") or DASH,
                d.get("declared_in") or DASH,
                seen,
            ]
        )
    lines += [
        "",
        "## Summary",
        "",
        table(["id", "backend", "feature", "fixed by", "declared in", "status per run"], summary),
    ]
    for d in devs:
        lines += ["", f"## {d['id']}", ""]
        if d["source"] == "results":
            lines += [
                "Reported by a results file but not declared in this checkout's",
                "`attnspec.backends.deviations`, and the file carries no declaration",
                "(results from another version?).",
                "",
            ]
        facts = [
            ["backend", d.get("backend")],
            ["feature", d.get("feature")],
            ["spec says", d.get("spec_says")],
            ["framework does", d.get("native_does")],
            ["fixed by", d.get("fixed_by") or DASH],
            ["declared in", d.get("declared_in") or DASH],
        ]
        if d.get("upstream"):
            facts.append(["upstream", d["upstream"]])
        lines += [table(["field", "value"], facts)]
        if d.get("reproducer"):
            lines += ["", "Reproducer:", "", fence(str(d["reproducer"]), "python")]
        obs = _observations(d, results)
        lines += [""]
        lines += (
            [table(["run", "status", "observed", "exercised"], obs, "llrr")]
            if obs
            else [f"No conformance run of backend `{d.get('backend')}` in the results."]
        )
    return "\n".join(lines) + "\n"
