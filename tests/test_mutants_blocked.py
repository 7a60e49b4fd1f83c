"""The conformance suite's sdpa_blocked properties catch a blocked implementation that forgets to
rescale its running sums, name the feature, and pass the correct control.

As in test_mutants: the real suite (``pytest --pyargs attnspec.conformance``) in a subprocess with
the ``dev`` profile, limited to the sdpa_blocked tests (the backends' sdpa is mutants.Naive's, which
test_mutants already covers).
"""

from __future__ import annotations

import pytest
from mutants_blocked import MUTANTS_BLOCKED
from suite_runs import caught, passed, run_all

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mutants_blocked")
    targets = {
        "control": "mutants_blocked:control_blocked",
        **{m: f"mutants_blocked:mutant_{m}" for m in MUTANTS_BLOCKED},
    }
    return run_all(tmp, {name: (t, "test_blocked_") for name, t in targets.items()}, shrink=False)


def test_control_passes(suite_runs):
    passed(suite_runs["control"], "sdpa_blocked", cases=50)  # the blocked properties really ran cases


@pytest.mark.parametrize("mutant", sorted(MUTANTS_BLOCKED))
def test_mutant_is_caught_and_feature_named(suite_runs, mutant):
    proc = suite_runs[mutant][0]
    results = caught(suite_runs[mutant], f"mutant {mutant}")
    failed = {(r["function"], r["feature"]) for r in results["rows"] if r["failed"]}
    expected = MUTANTS_BLOCKED[mutant][1]
    assert ("sdpa_blocked", expected) in failed, f"{mutant}: failures {sorted(failed)} miss {expected}"
    # a failure message names it (the one printed first is whichever drawn case failed first)
    assert any(f"feature={expected}" in r["message"] for r in results["failures"]), results["failures"]
    # the reproducer calls sdpa_blocked, with the tile sizes of the failing case
    assert "reproduce with:" in proc.stdout and ".sdpa_blocked(to(q)" in proc.stdout
    assert "block_k=" in proc.stdout
