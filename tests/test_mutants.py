"""The conformance suite catches every mutant, names the feature, and passes the control.

Each mutant runs through the real suite (``pytest --pyargs attnspec.conformance``) in a
subprocess with the quick ``dev`` profile, exactly as a backend author would run it, on the
properties that catch it (`mutants.MUTANT_RUN`, `variant_run`, `FILL_RUN`); the control passes
every chapter those draw from (`CONTROL_RUN`).
"""

from __future__ import annotations

import json

import pytest
from mutants import (
    CONTROL_RUN,
    FILL_MUTANTS,
    FILL_RUN,
    KILLED_BY,
    MUTANT_RUN,
    MUTANTS,
    VARIANT_MUTANTS,
    fill_caught_in,
    variant_run,
)
from suite_runs import caught, passed, run_all, run_suite

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof

#: a drawn feature -> the corner case that exercises the same rule
CORNER_OF = {
    "no_visible_rows": "corner_empty_rows",
    "masked_nonfinite": "corner_hidden_nonfinite",
    "window": "corner_window_edge",
    "plain": "corner_plain",
    "causal_upper_left": "corner_causal_edge",
}


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("mutants")
    targets = {
        "control": ("mutants:control", CONTROL_RUN),
        # the forward sdpa property that names each one's feature (the whole suite: 476 s)
        **{m: (f"mutants:mutant_{m}", MUTANT_RUN) for m in MUTANTS},
        # a variant's bug only shows in the variant properties: run the ones that catch it
        **{m: (f"mutants:mutant_{m}", variant_run(m)) for m in VARIANT_MUTANTS},
        # a finite fill shows in matches_golden's corner cases: run just that
        **{m: (f"mutants:mutant_{m}", FILL_RUN) for m in FILL_MUTANTS},
    }
    # only the runs the selected tests read (pytest -k no_scale runs one suite, not thirteen)
    wanted = {
        (getattr(item, "callspec", None) and item.callspec.params.get("mutant")) or "control"
        for item in request.session.items
        if item.module is request.module
    }
    return run_all(tmp, {name: t for name, t in targets.items() if name in wanted}, shrink=False)


def test_unshrunk_runs_name_the_same_features_as_shrunk_ones(tmp_path):
    """The mutant runs here are unshrunk (``shrink=False``, tests/suite_runs.py): every failure is
    still judged and swept, only the example each reports is the one drawn. Shrinking picks that
    example, not which features fail: one mutant run both ways fails the same features."""
    failed = {}
    for shrink in (True, False):
        path = tmp_path / f"shrink-{shrink}.json"
        proc = run_suite("mutants:mutant_causal_off_by_one", path, MUTANT_RUN, shrink=shrink)
        assert proc.returncode == 1, proc.stdout[-2000:]
        assert "reproduce with:" in proc.stdout
        failed[shrink] = {r["feature"] for r in json.loads(path.read_text())["rows"] if r["failed"]}
    assert failed[True] == failed[False] and {"causal_upper_left", "corner_causal_edge"} & failed[True], (
        failed
    )


def test_control_passes(suite_runs):
    rows = passed(suite_runs["control"], cases=200)  # the suite really ran cases
    # every property a mutant must fail ran on the control, and passed
    ran = {r["property"] for r in rows if r["function"] == "sdpa" and r["passed"]}
    assert {p for props in KILLED_BY.values() for p in props} <= ran, sorted(ran)


@pytest.mark.parametrize("mutant", sorted(MUTANTS) + sorted(VARIANT_MUTANTS))
def test_mutant_is_caught_and_feature_named(suite_runs, mutant):
    proc = suite_runs[mutant][0]
    results = caught(suite_runs[mutant], f"mutant {mutant}")
    failed_features = {r["feature"] for r in results["rows"] if r["failed"]}
    expected = {**MUTANTS, **VARIANT_MUTANTS}[mutant][1]
    # the corner built for that feature (conformance/corners.py) runs first and may be the one named
    named = {expected, CORNER_OF.get(expected)} & failed_features
    assert named, f"{mutant}: failures {sorted(failed_features)} miss {expected}"
    # by each of the properties that caught it when it ran through the whole suite (or chapter)
    killers = {r["property"] for r in results["rows"] if r["failed"] and r["function"] == "sdpa"}
    assert set(KILLED_BY[mutant]) <= killers, f"{mutant}: {sorted(killers)} miss {KILLED_BY[mutant]}"
    # the message a user sees names the feature and carries a reproducer
    assert any(f"feature={f}" in r["message"] for r in results["failures"] for f in named) or any(
        f"feature={f}" in proc.stdout for f in named
    )
    assert "reproduce with:" in proc.stdout


@pytest.mark.parametrize("mutant", sorted(FILL_MUTANTS))
def test_finite_fill_is_caught_in_every_dtype_it_reaches(suite_runs, mutant):
    """A backend that masks with a finite fill, even with empty rows zeroed and hidden values
    zeroed, fails matches_golden on the corner case in every dtype whose finfo.min lies at or
    below its fill (derived in mutants.fill_caught_in), and the message names the cause."""
    proc = suite_runs[mutant][0]
    rows = caught(suite_runs[mutant], f"mutant {mutant}")["rows"]
    caught_in = {
        r["dtype"]
        for r in rows
        if r["failed"] and r["property"] == "matches_golden" and r["feature"] == "corner_finite_floor"
    }
    assert caught_in == fill_caught_in(mutant)
    assert "hidden keys took weight there, as under a finite mask fill" in proc.stdout
