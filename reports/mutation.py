"""The mutation run's page: ``reports/mutation.md`` from ``reports/results/mutation.json``
(schema ``attnspec.mutation/1``, written by `nox -s mutation`, reports/SCHEMA.md).

It states how strong the conformance suite is as a number: of every single-token change
cosmic-ray makes to a reference sdpa and to the calling conventions, how many the suite kills,
which survive as equivalent programs (each with its reason) and which survive as gaps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnspec.reports._io import ResultsError, read_document
from attnspec.reports._md import cell, seconds, table

__all__ = ["SCHEMA", "load", "mutation_page"]

SCHEMA = "attnspec.mutation/1"
_TOTALS = (
    "generated",
    "skipped",
    "run",
    "killed",
    "timed_out",
    "survived_equivalent",
    "survived_gap",
    "error",
    "score",
)


def load(path: str | Path) -> dict[str, Any]:
    """Read and check a mutation results file; `ResultsError` names the file and the problem."""
    doc = read_document(path, SCHEMA)
    problems = [
        f"{key}: missing"
        for key in (
            "tool",
            "totals",
            "by_target",
            "by_file",
            "by_operator",
            "mutants",
            "elapsed_s",
            "filters",
        )
        if key not in doc
    ]
    for where, t in [
        ("totals", doc.get("totals", {})),
        *((f"by_target.{k}", v) for k, v in doc.get("by_target", {}).items()),
    ]:
        problems += [f"{where}.{key}: missing" for key in _TOTALS if key not in t]
    for i, m in enumerate(doc.get("mutants", [])):
        if m.get("outcome") not in (
            "killed",
            "timed_out",
            "survived_equivalent",
            "survived_gap",
            "error",
            "skipped",
            "pending",
        ):
            problems.append(f"mutants[{i}].outcome={m.get('outcome')!r} is not an outcome")
    if problems:
        raise ResultsError(f"{path}: " + "; ".join(problems[:5]))
    return doc


def _row(name: str, t: dict[str, Any]) -> list[Any]:
    return [
        name,
        t["generated"],
        t["skipped"],
        t["run"],
        t["killed"],
        t["timed_out"],
        t["survived_equivalent"],
        t["survived_gap"],
        t["error"],
        f"{100 * t['score']:.1f}%",
    ]


_HEAD = ["", "generated", "set aside", "run", "killed", "timed out", "equivalent", "gaps", "errors", "score"]


def _mutant_line(m: dict[str, Any]) -> list[Any]:
    return [
        f"`{m['file']}:{m['line']}`",
        f"`{m['definition']}`",
        m["operator"],
        f"`{m.get('before', '')}`",
        f"`{m.get('after', '')}`",
    ]


def mutation_page(doc: dict[str, Any], source: str = "results/mutation.json") -> str:
    t = doc["totals"]
    tool = doc["tool"]
    lines = [
        "# Mutation testing: how many wrong attentions the suite catches",
        "",
        f"Rendered from `{source}` (`nox -s mutation`, {tool['name']} {tool['version']}, commit "
        f"`{doc.get('git_commit', '')}`, {doc.get('date', '')}); the full run took "
        f"{seconds(doc['elapsed_s'])} on {doc.get('workers', 2)} cores.",
        "",
        "cosmic-ray makes every single-token change to two targets: `tests/mutation/reference_sdpa.py`, a "
        "plain sdpa written apart from the golden, and the calling conventions "
        "(`backends/conventions*.py`). Each mutant is judged by the `attnspec check` machinery in the `dev` "
        "profile, stopping at the first failure:",
        "",
        "- a **reference** mutant is killed when the verdict on it is FAILS or INCOMPLETE;",
        "- a **convention** mutant is killed when the suite fails a correct function through it, when "
        "that function refuses a need or reports a coverage (cases per need) the unmutated convention "
        "does not, or when the suite passes a known-wrong one (tiled GQA, a -1e9 mask fill, is_causal "
        "on the wrong diagonal, sinks ignored): tests/mutation/adapters.py has both, for every convention "
        "the mutated line reaches, its `+canonical` form and a convention made with `Convention.extend`.",
        "",
        "A survivor is either **equivalent** (it computes the same function; listed below with the reason, "
        "from `tests/mutation/equivalent.toml`) or a **gap**, which gets a new property, strategy or corner. "
        "Score = (killed + timed out + errors) / (run - equivalent).",
        "",
        "## Totals",
        "",
        table(_HEAD, [*(_row(k, v) for k, v in doc["by_target"].items()), _row("**all**", t)]),
        "",
    ]
    pending = {k: v.get("pending", 0) for k, v in doc["by_target"].items() if v.get("pending")}
    if pending:
        lines += [
            "**Not finished:** "
            + ", ".join(f"{n} mutants of the {k} target" for k, n in pending.items())
            + " have not run yet (the run was stopped before them; `nox -s mutation` resumes it and "
            "runs only those). The counts and the score cover the mutants that ran.",
            "",
        ]
    skipped = doc["filters"].get("skipped", {})
    if skipped:
        lines += [
            "Set aside before running: "
            + ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
            + " (tests/mutation/filters.py: an annotation is never evaluated under `from __future__ import "
            "annotations`; the definitions out of scope are below).",
            "",
        ]
    gaps = [m for m in doc["mutants"] if m["outcome"] == "survived_gap"]
    lines += ["## Gaps", ""]
    if gaps:
        lines += [
            f"{len(gaps)} mutants survive and are not known equivalents: the suite cannot see them. Those "
            "analysed and left open say why (tests/mutation/open_gaps.toml).",
            "",
            table(
                ["where", "definition", "operator", "before", "after", "why it is still open"],
                [[*_mutant_line(m), m.get("open", "not analysed yet")] for m in gaps],
            ),
            "",
        ]
    else:
        lines += ["None: every mutant that is not equivalent is killed.", ""]
    before = doc.get("before_after", {}).get("before", {})
    if before:
        lines += [
            "## Before and after",
            "",
            "Each target's first run, before its gaps were closed, beside this run:",
            "",
            table(
                ["", "run", "killed", "survived", "of them gaps now", "score", "first run"],
                [
                    [
                        name,
                        b.get("run", ""),
                        b.get("killed", 0) + b.get("timed_out", 0),
                        b.get("survived_equivalent", 0) + b.get("survived_gap", 0),
                        doc["by_target"].get(name, {}).get("survived_gap", ""),
                        f"{b.get('score', 0.0):.1%} -> {doc['by_target'].get(name, {}).get('score', 0.0):.1%}",
                        b.get("note", ""),
                    ]
                    for name, b in before.items()
                ],
            ),
            "",
            "(The first runs count every survivor as a gap: the equivalents were sorted out after them.)",
            "",
        ]
    found = doc.get("before_after", {}).get("gaps", [])
    if found:
        lines += [
            "Gaps the first runs found, and what killed each mutant once the gap was closed:",
            "",
            table(
                ["target", "mutant", "killed now by"],
                [[g.get("target", ""), f"`{g['mutant']}`", g["fixed_by"]] for g in found],
            ),
            "",
        ]
    eq = [m for m in doc["mutants"] if m["outcome"] == "survived_equivalent"]
    lines += [
        "## Equivalent mutants",
        "",
        f"{len(eq)} survivors compute the same function as the original:",
        "",
    ]
    if eq:
        lines += [
            table(
                ["where", "definition", "operator", "before", "after", "why it is the same function"],
                [[*_mutant_line(m), m.get("reason", "")] for m in eq],
            ),
            "",
        ]
    errors = [m for m in doc["mutants"] if m["outcome"] == "error"]
    if errors:
        lines += [
            "## Errors",
            "",
            "Mutants cosmic-ray could not run (counted as killed: the mutant did not run as a program):",
            "",
            table(
                ["where", "definition", "operator", "what happened"],
                [
                    [
                        f"`{m['file']}:{m['line']}`",
                        f"`{m['definition']}`",
                        m["operator"],
                        cell(m.get("why", "")),
                    ]
                    for m in errors
                ],
            ),
            "",
        ]
    lines += [
        "## By file",
        "",
        table(_HEAD, [_row(f"`{k}`", v) for k, v in doc["by_file"].items()]),
        "",
        "## By operator",
        "",
        table(_HEAD, [_row(k, v) for k, v in doc["by_operator"].items()]),
        "",
        "## Out of scope",
        "",
        "Definitions of the convention modules whose mutants are not run, because no verdict of the suite "
        "on a function can reach them:",
        "",
        table(["definition", "why"], [[f"`{k}`", v] for k, v in doc["filters"]["out_of_scope"].items()]),
        "",
    ]
    killed = [m for m in doc["mutants"] if m["outcome"] in ("killed", "timed_out") and m.get("seconds")]
    if killed:
        secs = sorted(m["seconds"] for m in killed)
        lines += [
            "## Cost",
            "",
            f"A killed mutant took {secs[len(secs) // 2]:.0f} s (median, {secs[-1]:.0f} s at most) to judge; "
            "a survivor runs every check to the end.",
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m attnspec.reports.mutation [RESULTS] [OUT]``: render only the mutation page."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="render reports/mutation.md from reports/results/mutation.json")
    ap.add_argument("results", nargs="?", default="reports/results/mutation.json")
    ap.add_argument("out", nargs="?", default="reports/mutation.md")
    args = ap.parse_args(argv)
    try:
        doc = load(args.results)
    except ResultsError as e:
        print(f"attnspec.reports.mutation: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    source = Path(args.results).resolve()
    try:
        shown = source.relative_to(out.resolve().parent).as_posix()
    except ValueError:
        shown = str(args.results)
    out.write_text(mutation_page(doc, shown), encoding="utf-8")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
