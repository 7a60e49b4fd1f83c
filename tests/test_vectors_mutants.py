"""The kit's mutants through the bundle path: each fails there, and the same way it fails the suite.

A bundle is only as strong as the suite it is exported from, so every sdpa mutant of
``tests/mutants.py`` (the core bugs, the variants', the finite fills) must fail verify after
``vectors run``, and the correct control must pass. For a few mutants the suite itself also runs
(its sdpa properties, dev profile), and the clause the suite's failures
name must be among those the bundle's failures name.
"""

from __future__ import annotations

import json

import mutants as M
import pytest
from suite_runs import run_all

from attnspec.conformance.vectors import export, load, run, verify


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    out = tmp_path_factory.mktemp("vectors")
    export(out, "dev", ["sdpa"])
    return load(out)


def _verify(bundles, backend, tmp_path):
    run(backend, bundles, tmp_path / "out")
    return verify(bundles, tmp_path / "out", backend.name)


def test_control_passes(bundles, tmp_path):
    results = _verify(bundles, M.control(), tmp_path)
    assert not results["failures"]
    assert sum(b["passed"] for b in results["vectors"]["bundles"]) == sum(len(b.cases) for b in bundles)


@pytest.mark.parametrize("mutant", sorted({**M.MUTANTS, **M.VARIANT_MUTANTS, **M.FILL_MUTANTS}))
def test_mutant_fails_through_the_bundle(bundles, tmp_path, mutant):
    results = _verify(bundles, getattr(M, f"mutant_{mutant}")(), tmp_path)
    failed = {b["dtype"] for b in results["vectors"]["bundles"] if b["failed"]}
    assert failed, f"{mutant} passed every case of the bundles"
    if mutant in M.FILL_MUTANTS:  # the dtypes where the suite's corners must expose the fill
        assert M.fill_caught_in(mutant) <= failed
    else:
        assert "float64" in failed  # every core and variant bug shows at float64's tight tolerance
    for f in results["failures"]:
        assert f["clauses"], f"{mutant}: a failure names no clause: {f['message'].splitlines()[0]}"
        assert "[clause" in f["message"].splitlines()[0]


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite")
    targets = {m: (f"mutants:mutant_{m}", "test_sdpa and not bad_input") for m in SAME_CLAUSE}
    return run_all(tmp, targets, shrink=False)


#: mutant -> the clause its failures must name (a rule-specific cause) in the suite and the bundle
SAME_CLAUSE = {
    "empty_rows_mean": "sdpa.empty_row",
    "gqa_modulo": "sdpa.gqa",
    "fill_minus_1e9": "sdpa.empty_row",
    "finite_fill_minus_1e4": "sdpa.visibility",
}


@pytest.mark.proof
@pytest.mark.parametrize("mutant", sorted(SAME_CLAUSE))
def test_mutant_fails_the_same_way_as_in_the_suite(bundles, tmp_path, suite_runs, mutant):
    proc, path = suite_runs[mutant]
    assert proc.returncode == 1, proc.stdout[-2000:]
    suite = {c for f in json.loads(path.read_text())["failures"] for c in f.get("clauses") or ()}
    vectors = {
        c
        for f in _verify(bundles, getattr(M, f"mutant_{mutant}")(), tmp_path)["failures"]
        for c in f["clauses"]
    }
    assert SAME_CLAUSE[mutant] in suite, sorted(suite)
    assert SAME_CLAUSE[mutant] in vectors, sorted(vectors)
