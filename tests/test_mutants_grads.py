"""The gradient properties catch every broken backward, name the property, and pass the control.

Each backend runs the real suite (``pytest --pyargs attnspec.conformance -k ...``, the quick
``dev`` profile) in a subprocess, as a backend author would run it: the sdpa_vjp properties for
`GRAD_MUTANTS`, the mha_vjp or lsh_attention_vjp ones for `MHA_LSH_MUTANTS`.
"""

from __future__ import annotations

import pytest
from mutants_grads import GRAD_MUTANTS, MHA_LSH_MUTANTS, VARIANT_GRAD_MUTANTS
from suite_runs import caught, passed, run_all

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof

SDPA_VJP = "grads and not mha_vjp and not lsh_attention_vjp"  # test_grads.py's properties
MHA_LSH_VJP = "mha_vjp or lsh_attention_vjp"  # test_grads_mha_lsh.py's


@pytest.fixture(scope="module")
def grad_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grad_mutants")
    targets = {
        "control": ("mutants_grads:control", SDPA_VJP),
        **{m: (f"mutants_grads:mutant_{m}", SDPA_VJP) for m in GRAD_MUTANTS},
        "control_all": ("mutants_grads:control_all", MHA_LSH_VJP),
        **{m: (f"mutants_grads:mutant_{m}", fn) for m, (fn, _) in MHA_LSH_MUTANTS.items()},
    }
    return run_all(tmp, targets, fail_fast=True)


def _vjp_rows(results: dict, function: str = "sdpa_vjp"):
    return [r for r in results["rows"] if r["function"] == function]


def test_control_passes(grad_runs):
    passed(grad_runs["control"], "sdpa_vjp", cases=150)  # the gradient properties really ran cases


@pytest.mark.parametrize("mutant", sorted(GRAD_MUTANTS))
def test_grad_mutant_is_caught_and_property_named(grad_runs, mutant):
    proc = grad_runs[mutant][0]
    failed = {
        r["property"] for r in _vjp_rows(caught(grad_runs[mutant], f"grad mutant {mutant}")) if r["failed"]
    }
    expected = GRAD_MUTANTS[mutant]
    assert expected in failed, f"{mutant}: failing properties {sorted(failed)} miss {expected}"
    assert f"sdpa_vjp {expected}" in proc.stdout  # the message names function and property
    assert "reproduce with" in proc.stdout


def test_mha_lsh_control_passes(grad_runs):
    all_rows = passed(grad_runs["control_all"])
    for function, properties in (
        (
            "mha_vjp",
            {"matches_golden", "masked_keys_get_zero", "empty_rows_zero_and_finite", "deterministic"},
        ),
        ("lsh_attention_vjp", {"matches_golden", "padded_zero_and_finite", "deterministic"}),
    ):
        rows = [r for r in all_rows if r["function"] == function]
        assert {r["property"] for r in rows} == properties
        assert sum(r["passed"] for r in rows) >= 10 * len(properties)  # the properties really ran cases


@pytest.mark.parametrize("mutant", sorted(MHA_LSH_MUTANTS))
def test_mha_lsh_mutant_is_caught_and_property_named(grad_runs, mutant):
    proc = grad_runs[mutant][0]
    function, expected = MHA_LSH_MUTANTS[mutant]
    results = caught(grad_runs[mutant], f"grad mutant {mutant}")
    failed = {r["property"] for r in _vjp_rows(results, function) if r["failed"]}
    assert expected in failed, f"{mutant}: failing properties {sorted(failed)} miss {expected}"
    assert "deterministic" not in failed  # the mutant is wrong, not flaky
    assert f"{function} {expected}" in proc.stdout  # the message names function and property
    assert "reproduce with" in proc.stdout


# -- the variants' backward (issue #15) ------------------------------------------------------------

VARIANT_VJP = "vjp_variants_match_golden"  # test_grads.py's variant property
VARIANT_OF = {"softcap_grad_dropped": "softcap", "sinks_no_grad": "sinks"}  # the feature each breaks


@pytest.fixture(scope="module")
def variant_grad_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("variant_grad_mutants")
    targets = {
        "control": ("mutants_grads:control", VARIANT_VJP),
        **{m: (f"mutants_grads:mutant_{m}", VARIANT_VJP) for m in VARIANT_GRAD_MUTANTS},
    }
    return run_all(tmp, targets, fail_fast=True)


def test_variant_grad_control_passes(variant_grad_runs):
    rows = [
        r
        for r in passed(variant_grad_runs["control"], "sdpa_vjp")
        if r["property"] == "variants_match_golden"
    ]
    for feature in VARIANT_OF.values():  # the control's softcap and sinks backward really ran
        assert sum(r["passed"] for r in rows if r["feature"] == feature) >= 4, feature


@pytest.mark.parametrize("mutant", sorted(VARIANT_GRAD_MUTANTS))
def test_variant_grad_mutant_is_caught_and_feature_named(variant_grad_runs, mutant):
    proc = variant_grad_runs[mutant][0]
    expected, feature = VARIANT_GRAD_MUTANTS[mutant], VARIANT_OF[mutant]
    results = caught(variant_grad_runs[mutant], f"grad mutant {mutant}")
    failed = {(r["property"], r["feature"], r["dtype"]) for r in _vjp_rows(results) if r["failed"]}
    assert {(expected, feature, d) for d in ("float32", "float64")} <= failed, sorted(failed)
    assert f"sdpa_vjp {expected}: feature={feature}" in proc.stdout  # function, property, feature
    assert "reproduce with" in proc.stdout
