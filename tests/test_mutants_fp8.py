"""The FP8 property (conformance/test_fp8.py) catches every FP8 mutant (tests/mutants_fp8.py) in
both FP8 dtypes, passes the control, passes FA3's P rounding when the kernel claims it, and passes
the numpy and torch backends.

Each run is the real suite (``pytest --pyargs attnspec.conformance``) in a subprocess with the
quick ``dev`` profile, selected to the FP8 property, as a backend author would run it.
"""

from __future__ import annotations

import pytest
from suite_runs import caught, passed, run_all

from attnspec.spec.fp8 import FP8_DTYPES

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof

#: the property's pytest -k selection (the backend's name may hold "fp8" itself)
SELECT = "test_fp8_matches_golden"
MUTANTS = ("forget_descale", "descale_twice", "p_e4m3")
PASSING = {
    "control": "mutants_fp8:control",
    "p_e4m3_claimed": "mutants_fp8:mutant_p_e4m3_claimed",
    "numpy": "numpy",
    "torch": "torch",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    targets = {
        **{name: (target, SELECT) for name, target in PASSING.items()},
        **{m: (f"mutants_fp8:mutant_{m}", SELECT) for m in MUTANTS},
    }
    return run_all(tmp_path_factory.mktemp("fp8"), targets, timeout=300, fail_fast=True)


@pytest.mark.parametrize("name", sorted(PASSING))
def test_correct_kernels_pass(runs, name):
    found = passed(runs[name])
    assert all(r["function"] == "sdpa_fp8" for r in found)
    for dtype in FP8_DTYPES:  # every example of both dtypes ran and passed
        assert sum(r["passed"] for r in found if r["dtype"] == dtype) >= 12, (name, dtype)
    assert not any(r["unsupported"] for r in found)


@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutant_fails_in_both_dtypes(runs, mutant):
    proc = runs[mutant][0]
    failed = {r["dtype"] for r in caught(runs[mutant], f"mutant {mutant}")["rows"] if r["failed"]}
    assert failed == set(FP8_DTYPES), failed
    # the message names the function, the property, the claim and carries a reproducer
    assert "sdpa_fp8 matches_golden" in proc.stdout
    assert "whose P is float32" in proc.stdout
    assert "fp8_golden(q, k, v" in proc.stdout


def test_p_rounding_fails_only_float32_claim(runs):
    """The same kernel, FA3's e4m3 P: failed while claiming float32 P, passes once it claims e4m3."""
    assert runs["p_e4m3"][0].returncode == 1 and runs["p_e4m3_claimed"][0].returncode == 0
