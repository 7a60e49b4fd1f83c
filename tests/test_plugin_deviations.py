"""A plugin's own declared deviations (issue #19): declared as data in the plugin's package,
loaded with its backend, checked both ways by the conformance suite (a declared deviation that
no case shows is stale, a failure no declaration covers fails), and shown in ``deviations.md``
with where it is declared. The example plugin's ``example-nan-rows`` backend deviates on purpose
(rows with no visible key give NaN) and declares it in ``attnspec_example_plugin/deviations.toml``,
the format of attnspec's own catalogue, read by `attnspec.backends.deviations.load`. A deviation
written in Python (a `Deviation` object) still declares one too."""

from __future__ import annotations

import importlib.util
import runpy
from pathlib import Path

import pytest
from check_runs import check_all, results_of

import attnspec.backends as registry
from attnspec.backends.deviations import BUILTIN_SOURCE, DEVIATIONS, Deviation, declared_for

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("attnspec_example_plugin") is None or "example-nan-rows" not in registry.names(),
    reason="the example plugin is not installed: pip install -e examples/attnspec-example-plugin",
)

HERE = Path(__file__).parent
ID = "example-nan-rows.empty-row-nan"
SOURCE = "attnspec_example_plugin (deviations.toml)"  # the package and the file it is declared in


def test_the_plugins_declaration_is_loaded_with_its_backend_and_probes_both_ways():
    be = registry.get("example-nan-rows")
    ((dev, source),) = declared_for(be.name, be)
    assert (dev.deviation_id, dev.backend, source) == (ID, "example-nan-rows", SOURCE)
    assert isinstance(dev, Deviation) and dev.tags == {"no_visible_row"}
    assert all([dev.feature, dev.spec_says, dev.native_does, dev.reproducer])
    assert dev.probe(be)  # it deviates as declared
    assert not dev.probe(registry.get("example"))  # the conformant example backend does not
    runpy.run_path(dev.reproducer_file, run_name="__main__")  # the script file; its assert holds
    assert Path(dev.reproducer_file).read_text() == dev.reproducer
    assert dev.case.__module__ == dev.shows.__module__ == "attnspec_example_plugin.cases"  # "module:name"
    assert declared_for("example", registry.get("example")) == []


def test_a_deviation_written_in_python_still_declares():
    """A third-party plugin's `Deviation` objects (the format before TOML) keep working: declared
    in the module that writes the case, probed the same way."""
    from attnspec_example_plugin.cases import empty_row_case, row1_is_nan

    dev = Deviation(
        "in-python.empty-row-nan",
        "in-python",
        "sdpa: a row with no visible key",
        "output 0",
        "output NaN",
        "assert True\n",
        empty_row_case,
        row1_is_nan,
        tags=frozenset({"no_visible_row"}),
    )

    class InPython:
        deviations = (dev,)

    ((got, source),) = declared_for("in-python", InPython())
    assert got is dev and source == "attnspec_example_plugin.cases" and dev.check == "probe"
    assert dev.probe(registry.get("example-nan-rows")) and not dev.probe(registry.get("example"))
    with pytest.raises(TypeError, match="needs case and shows"):
        Deviation("in-python.unchecked", "in-python", "f", "s", "n", "r")


def test_a_backend_shares_a_builtin_frameworks_deviations_or_declares_them_wrong():
    class KerasOnJax:  # a wrapper of jax.nn.dot_product_attention, as a plugin would write it
        deviations_of = "jax-native"

    shared = declared_for("keras-on-jax", KerasOnJax())
    assert [d.deviation_id for d, _ in shared] == [
        d.deviation_id for d in DEVIATIONS if d.backend == "jax-native"
    ]
    assert {s for _, s in shared} == {BUILTIN_SOURCE}

    class Twice:
        deviations = (DEVIATIONS[0], DEVIATIONS[0])

    class NotData:
        deviations = ({"id": "x"},)

    with pytest.raises(ValueError, match="declared twice"):
        declared_for("twice", Twice())
    with pytest.raises(
        TypeError, match=r"not-data: deviations must be a sequence of .*deviations\.Deviation"
    ):
        declared_for("not-data", NotData())


RUNS = {
    "declared": "example-nan-rows",
    "undeclared": "plugin_subjects:UndeclaredNanRows",
    "stale": "plugin_subjects:DeclaresWhatItDoesNotDo",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    args = ("-k", "matches_golden", "--dtype", "float32", "--dtype", "float64")
    return check_all(
        tmp_path_factory.mktemp("plugin-deviations"), {name: (t, *args) for name, t in RUNS.items()}
    )


@pytest.mark.proof
def test_a_declared_deviation_is_observed_and_the_run_conforms(runs):
    proc, out = runs["declared"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = results_of(out)
    (entry,) = results["deviations"]
    assert (entry["id"], entry["status"], entry["source"]) == (ID, "observed", SOURCE)
    assert entry["observed"] > 0 and entry["declaration"]["native_does"].startswith("output NaN")
    assert sum(r["deviation"] for r in results["rows"]) == entry["observed"]
    assert not results["failures"]


@pytest.mark.proof
def test_an_undeclared_failure_fails_naming_its_cause(runs):
    proc, out = runs["undeclared"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    results = results_of(out)
    assert results["deviations"] == [] and results["failures"]
    firsts = [f["message"].splitlines()[0] for f in results["failures"]]
    assert all("row with no visible key: expected 0, got NaN" in line for line in firsts), firsts


@pytest.mark.proof
def test_a_declared_deviation_that_no_case_shows_is_stale(runs):
    proc, out = runs["stale"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    (entry,) = results_of(out)["deviations"]
    assert (entry["id"], entry["status"], entry["observed"]) == (ID, "stale", 0) and entry["exercised"] > 0
    assert "STALE deviations" in proc.stderr and ID in proc.stderr


@pytest.mark.proof
def test_the_report_shows_the_plugins_deviation_with_its_source(runs):
    _, out = runs["declared"]
    md = (out / "deviations.md").read_text()
    summary = next(line for line in md.splitlines() if line.startswith(f"| [{ID}]"))
    assert SOURCE in summary and "observed" in summary
    section = md.split(f"## {ID}\n", 1)[1].split("\n## ", 1)[0]
    assert f"| declared in | {SOURCE} |" in section and "| framework does | output NaN" in section
    assert "from attnspec_example_plugin.nan_rows import NanRowsBackend" in section  # the reproducer
    assert "Reported by a results file but not declared" not in section
