"""The spec's version and labelled clauses (#26): every property states clauses that exist, the
semantics page lists exactly `CLAUSES`, and a failure names the clause it breaks, in its message
and in the results JSON.

The clause table of ``spec/README.md`` (between ``<!-- clauses:begin -->`` and
``<!-- clauses:end -->``) is generated from `attnspec.spec.clauses.CLAUSES`. Regenerate it after
adding a clause:

    ATTNSPEC_UPDATE_README=1 python -m pytest tests/test_clauses.py
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest
from suite_runs import run_suite

from attnspec.spec.clauses import (
    CLAUSES,
    PROPERTY_CLAUSES,
    SPEC_VERSION,
    case_clauses,
    clause_label,
    failure_clauses,
    split_label,
)

ROOT = Path(__file__).parent.parent
SEMANTICS = ROOT / "spec" / "README.md"
CHANGELOG = ROOT / "spec" / "CHANGELOG.md"
BEGIN, END = "<!-- clauses:begin -->", "<!-- clauses:end -->"


def clause_table() -> str:
    """The Markdown table of every clause: id, rule, where the page states it, and the conformance
    properties that check it on every case (`PROPERTY_CLAUSES`; cases add theirs)."""
    rows = ["| clause | rule | stated in | checked on every case by |", "|---|---|---|---|"]
    for c in CLAUSES.values():
        props = [f"{f}.{p}" for (f, p), ids in PROPERTY_CLAUSES.items() if c.id in ids]
        by = ", ".join(props) if props else "the cases that exercise it"
        rows.append(f"| `{c.id}` | {c.title.replace('|', chr(92) + '|')} | {c.where} | {by} |")
    return "\n".join(rows)


def judged_properties() -> set[tuple[str, str]]:
    """Every (function, property) a test of the conformance suite passes to ``judge``: its first
    two arguments, literal strings or the module's constants (``FN``, ``MHA``, ``LSH``); sdpa and
    the first argument of ``judge.sdpa``; and for a helper that passes its own ``prop`` parameter
    on to ``judge`` (test_grads' ``_judge_vjp``), what each call of it passes there."""
    found = set()
    for path in sorted((ROOT / "conformance").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        names = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)
        }

        def value(a, names=names):
            return (
                a.value
                if isinstance(a, ast.Constant)
                else names.get(a.id)
                if isinstance(a, ast.Name)
                else None
            )

        helpers = {}  # helper name -> (function judged, position of its prop parameter)
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef):
                params = [a.arg for a in fn.args.args]
                for node in ast.walk(fn):
                    if (
                        isinstance(node, ast.Call)
                        and ast.unparse(node.func) == "judge"
                        and len(node.args) > 1
                    ):
                        arg = node.args[1]
                        if isinstance(arg, ast.Name) and arg.id in params:
                            helpers[fn.name] = (value(node.args[0]), params.index(arg.id))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = ast.unparse(node.func)
            if called == "judge" and not any(
                isinstance(a, ast.Name) and a.id == "prop" for a in node.args[1:2]
            ):
                found.add((value(node.args[0]), value(node.args[1])))
            elif called == "judge.sdpa":
                found.add(("sdpa", value(node.args[0])))  # judge.sdpa(prop, case): judge("sdpa", prop, ...)
            elif called in helpers:
                function, at = helpers[called]
                found.add((function, value(node.args[at])))
    return found


def test_every_clause_a_property_states_exists():
    for key, ids in PROPERTY_CLAUSES.items():
        assert ids, key
        assert set(ids) <= set(CLAUSES), (key, set(ids) - set(CLAUSES))


def test_every_judged_property_states_its_clauses():
    judged = judged_properties()
    assert len(judged) > 30  # the parse found the suite's properties
    assert judged <= set(PROPERTY_CLAUSES), sorted(judged - set(PROPERTY_CLAUSES))


def test_clause_ids_are_stable_names():
    for cid, c in CLAUSES.items():
        assert c.id == cid and cid == cid.lower() and "." in cid and " " not in cid, cid
        assert c.title and c.where, cid


def test_a_label_names_its_clauses_and_reads_back():
    assert clause_label(["sdpa.empty_row"]) == "[clause sdpa.empty_row]"
    assert clause_label(["sdpa.mask", "sdpa.window", "sdpa.mask"]) == "[clauses sdpa.mask, sdpa.window]"
    assert clause_label([]) == ""
    line = "[b] sdpa matches_golden: row with no visible key: expected 0, got NaN [clause sdpa.empty_row]"
    assert split_label(line) == (line.removesuffix(" [clause sdpa.empty_row]"), ("sdpa.empty_row",))
    assert split_label("no label here") == ("no label here", ())


def test_a_failure_names_the_rule_its_cause_names_else_what_the_case_exercised():
    assert failure_clauses("row with no visible key: expected 0, got NaN", "sdpa", "matches_golden") == (
        "sdpa.empty_row",
    )
    assert failure_clauses("row with no visible key: expected 0, got NaN", "mha", "matches_golden") == (
        "mha.empty_row",
    )
    both = "row with no visible key: expected 0, got NaN; a hidden key's NaN/inf reached visible row (0, 1)"
    assert failure_clauses(both, "sdpa", "matches_golden") == ("sdpa.empty_row", "sdpa.hidden_nonfinite")
    case = case_clauses({"causal": "lower_right", "mask": None}, {"gqa"})
    assert case == ("sdpa.causal.lower_right", "sdpa.gqa")
    assert failure_clauses("out: max abs err 1e-3 > allowed 1e-6", "sdpa", "matches_golden", case) == (
        *PROPERTY_CLAUSES[("sdpa", "matches_golden")],
        *case,
    )


def test_a_cases_clauses_come_from_its_options_arrays_included():
    import numpy as np

    lengths = np.array([3, 4])
    assert case_clauses({"kv_lengths": lengths, "causal": True, "dedup": False}, (), "lsh_attention") == (
        "lsh.causal",
        "lsh.padding",
    )
    assert case_clauses(
        {"mask": np.ones((2, 2), bool), "kv_lengths": lengths}, {"no_visible_row"}, "mha"
    ) == (
        "sdpa.mask",
        "sdpa.empty_row",
        "sdpa.lengths",
        "mha.empty_row",
    )


def test_the_semantics_page_lists_every_clause_and_the_version():
    text = SEMANTICS.read_text()
    assert BEGIN in text and END in text, "spec/README.md lost its clauses markers"
    before, rest = text.split(BEGIN, 1)
    shown, after = rest.split(END, 1)
    want = clause_table()
    if os.environ.get("ATTNSPEC_UPDATE_README") == "1":
        SEMANTICS.write_text(f"{before}{BEGIN}\n{want}\n{END}{after}")
        return
    shown = shown.strip()
    assert shown == want, (
        "spec/README.md's clause table differs from attnspec.spec.clauses.CLAUSES; "
        "regenerate it with ATTNSPEC_UPDATE_README=1 python -m pytest tests/test_clauses.py"
    )
    assert f"Spec version **{SPEC_VERSION}**" in text


def test_the_changelog_records_the_current_version():
    assert f"## {SPEC_VERSION} " in CHANGELOG.read_text()


@pytest.mark.proof
def test_a_mutants_failure_names_its_clause_in_the_message_and_the_results(tmp_path):
    """The empty-rows-as-mean(V) mutant, run through the real suite (one property, float64):
    the failure's first line and its results entry name sdpa.empty_row, the results carry the
    spec version."""
    path = tmp_path / "results.json"
    proc = run_suite(
        "mutants:mutant_empty_rows_mean", path, "test_sdpa and test_matches_golden and float64", timeout=300
    )
    assert proc.returncode == 1, proc.stdout[-3000:]
    results = json.loads(path.read_text())
    assert results["spec_version"] == SPEC_VERSION
    assert results["environment"]["frameworks"]["attnspec.spec"] == SPEC_VERSION
    assert results["failures"]
    for f in results["failures"]:
        assert f["clauses"] == ["sdpa.empty_row"], f["clauses"]
        first = f["message"].splitlines()[0]
        assert first.startswith(
            "[mutants:mutant_empty_rows_mean] sdpa matches_golden: row with no visible key"
        )
        assert first.endswith("[clause sdpa.empty_row]"), first
        assert f["cause"].endswith("[clause sdpa.empty_row]"), f["cause"]
    assert "[clause sdpa.empty_row]" in proc.stdout  # what pytest shows the user


@pytest.mark.parametrize("status", ["crashed", "timeout"])
def test_a_case_without_a_message_names_the_clauses_it_exercised(status):
    from attnspec.conformance.recorder import Recorder

    clauses = [*PROPERTY_CLAUSES[("sdpa", "matches_golden")], "sdpa.mask"]  # as the judge records them
    rec = Recorder("dev")
    rec.record(
        "node",
        {
            "function": "sdpa",
            "property": "matches_golden",
            "feature": "mask",
            "dtype": "float32",
            "status": status,
            "clauses": clauses,
        },
    )
    (failure,) = rec.results()["failures"]
    assert failure["clauses"] == clauses
    assert failure["cause"] == f"{status} {clause_label(clauses)}"
