"""The LSH conformance properties catch every LSH mutant, through the properties named in
`mutants_lsh.MUTANTS`, and pass the control.

Each backend runs the real suite (``pytest --pyargs attnspec.conformance -k test_lsh``) in a
subprocess with the quick ``dev`` profile, as a backend author would run it.
"""

from __future__ import annotations

import pytest
from mutants_lsh import MUTANTS
from suite_runs import caught, passed, run_all

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mutants_lsh")
    targets = {"control": "mutants_lsh:control", **{m: f"mutants_lsh:mutant_{m}" for m in MUTANTS}}
    return run_all(tmp, {name: (t, "test_lsh") for name, t in targets.items()}, timeout=900, fail_fast=True)


def test_control_passes(suite_runs):
    rows = passed(suite_runs["control"], "lsh_attention", cases=150)  # the properties really ran cases
    props = {r["property"] for r in rows if r["passed"]}
    assert {
        "matches_golden",
        "one_round_is_full",
        "dedup_union",
        "causal_values",
        "padded_absent",
        "deterministic",
        "bad_input",
    } <= props


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught_by_its_properties(suite_runs, mutant):
    proc = suite_runs[mutant][0]
    results = caught(suite_runs[mutant], f"mutant {mutant}")
    failed_tests = {
        line.split("::")[1].split("[")[0]
        for line in proc.stdout.splitlines()
        if line.startswith("FAILED") and "::" in line
    }
    missing = set(MUTANTS[mutant]) - failed_tests
    assert not missing, f"{mutant}: failing tests {sorted(failed_tests)} miss {sorted(missing)}"
    assert any(r["failed"] for r in results["rows"] if r["function"] == "lsh_attention")
    assert "reproduce with:" in proc.stdout and "b.lsh_attention(" in proc.stdout
