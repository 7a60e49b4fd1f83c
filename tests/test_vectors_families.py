"""The sdpa_vjp, mha and lsh_attention bundles (conformance/vectors_families.py) judge as the suite does.

A bundle is only as strong as the suite it is exported from: NumPy, the reference, conforms on
every case; the kit's mutants of each function (tests/mutants_grads.py, mutants_mha.py,
mutants_lsh.py) fail after ``vectors run`` and ``verify``, each naming the clause of what it
broke, and their correct controls pass. One dtype (float32) keeps this fast: it has the
variants' backward in the grad mutants and the tolerance at which each of these bugs shows.
"""

from __future__ import annotations

import mutants_grads as MG
import mutants_lsh as ML
import mutants_mha as MM
import pytest

from attnspec.backends import get as get_backend
from attnspec.conformance.vectors import export, load, run, verify

FUNCTIONS = ("sdpa_vjp", "mha", "lsh_attention")
#: mutant -> (function, backend factory, the property that must fail, a clause its failures must name): every
#: mutant of the three modules; those the suite catches with a metamorphic property (mha's split_wrong_axis,
#: kv_heads_modulo) break the golden comparison too
BUGS = [
    ("grads", "no_scale", "matches_golden", "sdpa_vjp.definition"),
    ("grads", "masked_key_leak", "masked_keys_get_zero", "sdpa_vjp.hidden_keys"),
    ("grads", "nan_empty_rows", "empty_rows_zero_and_finite", "sdpa_vjp.empty_row"),
    ("grads", "softcap_grad_dropped", "variants_match_golden", "sdpa_vjp.variants"),
    ("grads", "sinks_no_grad", "variants_match_golden", "sdpa_vjp.variants"),
    ("mha", "split_wrong_axis", "matches_golden", "mha.definition"),
    ("mha", "no_out_proj", "matches_golden", "mha.definition"),
    ("mha", "kv_heads_modulo", "matches_golden", "mha.definition"),
    ("mha", "drops_softcap", "variants_match_golden", "mha.variants"),
    *(("lsh", bug, "matches_golden", "lsh.definition") for bug in ML.MUTANTS),
]
FAMILIES = {"grads": ("sdpa_vjp", MG), "mha": ("mha", MM), "lsh": ("lsh_attention", ML)}
MUTANTS = {
    f"{family}:{bug}": (FAMILIES[family][0], FAMILIES[family][1].make(bug), prop, clause)
    for family, bug, prop, clause in BUGS
}
CONTROLS = {"sdpa_vjp": MG.control, "mha": MM.control, "lsh_attention": ML.control}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("vectors")
    export(out, "dev", FUNCTIONS, ["float32"])
    return out


@pytest.fixture(scope="module")
def bundles(folder):
    return {b.function: [b] for b in load(folder)}


def _verify(bundles, backend, tmp_path):
    run(backend, bundles, tmp_path / "out")
    return verify(bundles, tmp_path / "out", backend.name)


def _cases(bundles) -> int:
    return sum(len(b.cases) for b in bundles)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_numpy_conforms(bundles, tmp_path, function):
    results = _verify(bundles[function], get_backend("numpy"), tmp_path)
    assert not results["failures"], results["failures"][0]["message"]
    (summary,) = results["vectors"]["bundles"]
    assert summary["passed"] == summary["cases"] == _cases(bundles[function]) > 40


def test_numpy_conforms_float16(tmp_path):
    """A narrow dtype too: goldens rounded once, tolerances grown by float16's eps."""
    export(tmp_path / "v", "dev", FUNCTIONS, ["float16"])
    results = _verify(load(tmp_path / "v"), get_backend("numpy"), tmp_path)
    assert not results["failures"], results["failures"][0]["message"]
    assert all(b["passed"] == b["cases"] for b in results["vectors"]["bundles"])


def test_every_property_and_output_is_there(bundles):
    """sdpa_vjp carries its four golden-judged properties, zero rows and the optional gradients;
    mha its parameters as tensors; lsh its rotations."""
    vjp = bundles["sdpa_vjp"][0].cases
    assert {c["property"] for c in vjp} == {
        "matches_golden",
        "variants_match_golden",
        "masked_keys_get_zero",
        "empty_rows_zero_and_finite",
    }
    assert any(
        c["outputs"].get("dk", {}).get("zero_rows") for c in vjp if c["property"] == "masked_keys_get_zero"
    )
    assert any(c["outputs"]["dq"]["zero_rows"] for c in vjp if c["property"] == "empty_rows_zero_and_finite")
    assert any("dbias" in c["outputs"] for c in vjp) and any("dsinks" in c["outputs"] for c in vjp)
    mha = bundles["mha"][0].cases
    assert all({"params.w_q", "params.w_k", "params.w_v", "params.w_o"} <= set(c["inputs"]) for c in mha)
    assert any("weights" in c["outputs"] for c in mha) and any("lse" in c["outputs"] for c in mha)
    assert all("rotations" in c["inputs"] for c in bundles["lsh_attention"][0].cases)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_control_passes(bundles, tmp_path, function):
    results = _verify(bundles[function], CONTROLS[function](), tmp_path)
    assert not results["failures"], results["failures"][0]["message"]
    (summary,) = results["vectors"]["bundles"]
    assert summary["failed"] == 0 and summary["passed"] > 20


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_fails_naming_a_clause(bundles, tmp_path, mutant):
    function, factory, prop, clause = MUTANTS[mutant]
    results = _verify(bundles[function], factory(), tmp_path)
    assert results["failures"], f"{mutant} passed every case of the bundle"
    failed = {r["property"] for r in results["rows"] if r["failed"]}
    assert prop in failed, f"{mutant}: failed properties {sorted(failed)} miss {prop}"
    named = {c for f in results["failures"] for c in f["clauses"]}
    assert clause in named, f"{mutant}: failures name {sorted(named)}, not {clause}"
    for f in results["failures"]:
        assert "[clause" in f["message"].splitlines()[0]


def test_export_is_deterministic(folder, tmp_path):
    """The same selection gives the same bytes: every file of a second export equals the first's."""
    export(tmp_path, "dev", FUNCTIONS, ["float32"])
    first = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    second = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert first.keys() == second.keys()
    assert [name for name in first if first[name] != second[name]] == []


def test_every_kit_mutant_is_listed():
    """A mutant added to the kit is added here too."""
    listed = {m.split(":", 1)[1] for m in MUTANTS}
    assert {*MG.GRAD_MUTANTS, *MG.VARIANT_GRAD_MUTANTS, *MM.MHA_MUTANTS, *ML.MUTANTS} == listed
