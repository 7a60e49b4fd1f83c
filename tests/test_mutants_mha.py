"""The mha conformance properties catch every mha mutant, name the property, and pass the control.

Each backend of `mutants_mha` runs through the real suite (``pytest --pyargs attnspec.conformance
-k mha``) in a subprocess with the quick ``dev`` profile, as a backend author would run it.
"""

from __future__ import annotations

import json

import pytest
from mutants_mha import MHA_MUTANTS
from suite_runs import caught, passed, run_all, run_suite

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mutants_mha")
    targets = {"control": "mutants_mha:control", **{m: f"mutants_mha:mutant_{m}" for m in MHA_MUTANTS}}
    return run_all(tmp, {name: (t, "mha") for name, t in targets.items()}, fail_fast=True)


def test_control_passes(suite_runs):
    rows = passed(suite_runs["control"], "mha")
    assert {r["property"] for r in rows} >= {
        "matches_golden",
        "head_split_merge",
        "kv_head_mapping",
        "deterministic",
        "bad_input",
        "variants_match_golden",
    }
    variant_rows = [r for r in rows if r["property"] == "variants_match_golden"]
    assert sum(r["passed"] for r in variant_rows) > 20  # the variants really ran, and passed
    assert sum(r["passed"] for r in rows) > 150  # the suite really ran cases


@pytest.mark.parametrize("mutant", sorted(MHA_MUTANTS))
def test_mutant_is_caught_and_property_named(suite_runs, mutant):
    proc = suite_runs[mutant][0]
    results = caught(suite_runs[mutant], f"mutant {mutant}")
    failed = {r["property"] for r in results["rows"] if r["function"] == "mha" and r["failed"]}
    expected = MHA_MUTANTS[mutant][1]
    assert expected in failed, f"{mutant}: failed properties {sorted(failed)} miss {expected}"
    assert "deterministic" not in failed and "bad_input" not in failed  # each mutant is only wrong
    # the message a user sees names function and property, and carries a reproducer
    assert (
        any(f"mha {expected}:" in f["message"] for f in results["failures"])
        or f"mha {expected}:" in proc.stdout
    )
    assert "reproduce with:" in proc.stdout


def test_fail_fast_names_the_same_properties_as_the_whole_run(tmp_path):
    """The mutant runs above are fail-fast (no shrinking, no sweep: tests/suite_runs.py). One
    mutant run both ways fails the same properties, and both carry a reproducer."""
    runs = {
        fast: run_suite(
            "mutants_mha:mutant_kv_heads_modulo", tmp_path / f"{fast}.json", "mha", fail_fast=fast
        )
        for fast in (True, False)
    }
    failed = {}
    for fast, proc in runs.items():
        assert proc.returncode == 1, proc.stdout[-2000:]
        assert "reproduce with:" in proc.stdout
        rows = json.loads((tmp_path / f"{fast}.json").read_text())["rows"]
        failed[fast] = {r["property"] for r in rows if r["function"] == "mha" and r["failed"]}
    assert failed[True] == failed[False] and "kv_head_mapping" in failed[True]
