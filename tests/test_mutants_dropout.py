"""The statistical dropout property (``dropout_drawn``) passes a correct drawing backend and
fails one that keeps weights with rate p instead of 1 - p, and one that does not rescale.

Each runs through the real suite (``pytest --pyargs attnspec.conformance -k dropout_drawn``) in a
subprocess, as `tests/test_mutants.py` runs the others.
"""

from __future__ import annotations

import json

import pytest
from mutants_dropout import DRAWN_MUTANTS, DRAWN_RUN
from suite_runs import caught, passed, run_all

from attnspec.conformance.test_dropout import P_VALUES
from attnspec.spec.validate import FLOAT_DTYPES

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    targets = {"control": ("mutants_dropout:Drawing", DRAWN_RUN)}
    targets |= {name: (f"mutants_dropout:{cls}", DRAWN_RUN) for name, (cls, _) in DRAWN_MUTANTS.items()}
    return run_all(tmp_path_factory.mktemp("dropout"), targets, shrink=False)


def _rows(rows):
    """The results rows of the property, one per dtype (each counts its three values of p)."""
    return {r["dtype"]: r for r in rows if r["property"] == "dropout_drawn"}


def test_control_passes(runs):
    rows = _rows(passed(runs["control"]))
    # every dtype and p ran and passed (none unsupported: the control declares dropout_drawn)
    assert sorted(rows) == sorted(FLOAT_DTYPES)
    assert all(r["run"] == r["passed"] == len(P_VALUES) for r in rows.values()), rows


@pytest.mark.parametrize("mutant", sorted(DRAWN_MUTANTS))
def test_mutant_is_caught(runs, mutant):
    proc = runs[mutant][0]
    results = caught(runs[mutant], f"mutant {mutant}")
    assert {f["feature"] for f in results["failures"]} == {"dropout_drawn"}
    said = DRAWN_MUTANTS[mutant][1]
    assert any(said in f["message"] for f in results["failures"]), [
        f["message"][:300] for f in results["failures"]
    ]
    assert "reproduce with:" in proc.stdout


def test_keep_rate_p_fails_where_it_differs(runs):
    """Keeping with rate p is the same distribution at p = 0.5; at 0.1 and 0.9 the keep rate is off
    by 0.8, far beyond Bernstein's bound (~0.006 over 65536 entries), in every dtype."""
    proc, path = runs["drawn_keep_rate_p"]
    rows = _rows(json.loads(path.read_text())["rows"])
    assert sorted(rows) == sorted(FLOAT_DTYPES)
    assert all(r["failed"] == 2 and r["passed"] == 1 for r in rows.values()), rows
    assert "dropout_p=0.1" in proc.stdout and "dropout_p=0.9" in proc.stdout
    assert "dropout_p=0.5" not in proc.stdout  # the one that passed
