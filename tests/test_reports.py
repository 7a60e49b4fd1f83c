"""The report renderer: synthetic results JSON in, Markdown tables with the right numbers out.

The fixtures hold one backend ("torch") on two devices, so every test also checks that results of
several machines are merged with their device kept.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import types
from pathlib import Path

import pytest

from attnspec.reports import deviations, plots
from attnspec.reports._io import ResultsError, load_results
from attnspec.reports.render import main, render
from attnspec.results import write_json_atomic

ENV = {
    "attnspec": "0.1.0",
    "git_commit": "abc1234",
    "git_dirty": True,
    "python": "3.11.7",
    "frameworks": {"numpy": "2.4.6", "torch": "2.13.0"},
    "numerics_policy": {"torch.backends.cuda.matmul.allow_tf32": False},
    "hypothesis_profile": "ci",
    "hypothesis_seed": 0,
    "date": "2026-11-21T23:10:00Z",
}
DEV_ID = "torch-native/no-visible-row"
REAL_DECLARED = deviations.declared_deviations


def _row(
    function,
    feature,
    dtype,
    run,
    passed,
    failed=0,
    unsupported=0,
    deviation=0,
    crashed=0,
    budget=0.25,
    **extra,
):
    return {
        "function": function,
        "property": "matches_golden",
        "feature": feature,
        "dtype": dtype,
        "run": run,
        "passed": passed,
        "failed": failed,
        "unsupported": unsupported,
        "deviation": deviation,
        "crashed": crashed,
        "timeout": 0,
        "max_abs_err": 1.5e-7,
        "max_rel_err": 3e-6,
        "max_budget_used": budget,
        "unsupported_reasons": [],
        "deviation_ids": [],
        **extra,
    }


def conformance(device: str) -> dict:
    rows = [
        _row("sdpa", "causal_lower_right", "float32", 120, 118, deviation=2, deviation_ids=[DEV_ID]),
        _row(
            "mha",
            "basic",
            "float64",
            10,
            7,
            unsupported=3,
            unsupported_reasons=["torch has no float64 | here"],
        ),
    ]
    failures, deviations = [], [{"id": DEV_ID, "status": "observed", "observed": 2, "exercised": 2}]
    if device == "cuda":  # the GPU run fails one window case in float16
        rows.append(_row("sdpa", "window", "float16", 40, 37, failed=2, crashed=1, budget=3.5))
        failures.append(
            {
                "function": "sdpa",
                "property": "matches_golden",
                "feature": "window",
                "dtype": "float16",
                "status": "failed",
                "message": "sdpa: out differs\nmax error 1e-2 > allowed 3e-3",
                "repro": "import torch\nq = torch.zeros(1, 2, 3)",
            }
        )
        deviations = [{"id": DEV_ID, "status": "stale", "observed": 0, "exercised": 5}]
    return {
        "schema": "attnspec.conformance/1",
        "backend": "torch",
        "device": device,
        "device_name": {"cpu": "x86_64 CPU (2 cores)", "cuda": "NVIDIA H100"}[device],
        "environment": {**ENV, "date": f"2026-11-2{len(device)}T00:00:00Z"},
        "rows": rows,
        "failures": failures,
        "deviations": deviations,
    }


def bench(device: str) -> dict:
    rows = []
    for impl, power in (("adapter", 2), ("lsh", 1)):
        for n in (256, 512, 1024):
            t = 1e-3 * (n / 256) ** power
            rows.append(
                {
                    "implementation": impl,
                    "pass": "forward",
                    "dtype": "float32",
                    "B": 1,
                    "H": 8,
                    "n": n,
                    "m": n,
                    "d": 64,
                    "causal": False,
                    "median_s": t,
                    "min_s": 0.9 * t,
                    "max_s": 1.2 * t,
                    "repeats": 10,
                    "tflops": 0.05,
                    "peak_mem_bytes": 2**20 * n,
                    "mem_method": "rss-subprocess",
                }
            )
    return {
        "schema": "attnspec.bench/1",
        "backend": "torch",
        "device": device,
        "device_name": "NVIDIA H100" if device == "cuda" else "x86_64 CPU",
        "environment": ENV,
        "matmul_tflops": {"float32": 0.1},
        "rows": rows,
        "targets": [
            {
                "name": "adapter float32 forward >= 40% of matmul",
                "value": 0.3,
                "target": 0.4,
                "met": False,
                "detail": "B=1 H=8 n=1024 d=64",
            }
        ],
    }


@pytest.fixture
def results(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    for device in ("cpu", "cuda"):
        write_json_atomic(d / f"conformance-torch-{device}.json", conformance(device))
    write_json_atomic(d / "bench-torch-cuda.json", bench("cuda"))
    return d


@pytest.fixture(autouse=True)
def no_module_deviations(monkeypatch):
    """The checkout's real declarations change as backends grow: tests use their own."""
    declared = [
        {
            "id": DEV_ID,
            "backend": "torch",
            "feature": "sdpa causal, no visible key",
            "spec_says": "output 0",
            "native_does": "NaN",
            "reproducer": "torch.sdpa(...)",
            "fixed_by": "adapter zeroes empty rows",
            "upstream": None,
            "source": "declared",
        }
    ]
    monkeypatch.setattr(deviations, "declared_deviations", lambda: (declared, None))


def tables(md: str) -> list[list[dict[str, str]]]:
    """Every pipe table of ``md`` as a list of {header: cell} rows."""
    out, block = [], []
    for line in [*md.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif block:
            out.append([dict(zip(block[0], row)) for row in block[2:]])
            block = []
    return out


def section(md: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    level = heading.split()[0]
    start = md.index(heading + "\n")
    rest = md[start + len(heading) + 1 :]
    nxt = re.search(rf"^#{{1,{len(level)}}} ", rest, re.M)
    return rest[: nxt.start()] if nxt else rest


def snapshot(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_summary_merges_devices_with_counts_and_verdicts(results, tmp_path):
    out = tmp_path / "out"
    render(results, out, plots=False)
    md = (out / "accuracy.md").read_text()
    summary = {(r["backend"], r["device"]): r for r in tables(section(md, "## Summary"))[0]}
    assert set(summary) == {("torch", "cpu"), ("torch", "cuda")}
    cpu, cuda = summary["torch", "cpu"], summary["torch", "cuda"]
    assert (cpu["run"], cpu["passed"], cpu["failed"], cpu["unsupported"], cpu["deviation"]) == (
        "130",
        "125",
        "0",
        "3",
        "2",
    )
    assert cpu["verdict"] == "deviates as declared" and cpu["worst budget used"] == "0.25"
    assert (cuda["run"], cuda["passed"], cuda["failed"], cuda["crashed"]) == ("170", "162", "2", "1")
    assert cuda["verdict"] == "FAILS (1 declared deviation stale)"
    assert cuda["worst budget used"] == "3.5" and cuda["device name"] == "NVIDIA H100"


def test_rows_grouped_by_function_with_errors_and_reasons(results, tmp_path):
    out = tmp_path / "out"
    (out / "accuracy").mkdir(parents=True)
    (out / "accuracy" / "gone.md").write_text("a function no run has any more")
    render(results, out, plots=False)
    md = (out / "accuracy.md").read_text()
    # one page per function, linked in the spec's order; a page no run made is removed
    assert md.index("- [sdpa](accuracy/sdpa.md)") < md.index("- [mha](accuracy/mha.md)")
    assert sorted(p.name for p in (out / "accuracy").iterdir()) == ["mha.md", "sdpa.md"]
    page = (out / "accuracy" / "sdpa.md").read_text()
    assert page.startswith("# Accuracy: sdpa\n") and "](../accuracy.md)" in page
    assert "](deviations.md" not in page and "](../deviations.md#" in page  # links still resolve
    sdpa = tables(page)[0]
    assert [(r["device"], r["feature"], r["dtype"]) for r in sdpa] == [
        ("cpu", "causal_lower_right", "float32"),
        ("cuda", "causal_lower_right", "float32"),
        ("cuda", "window", "float16"),
    ]
    window = sdpa[2]
    assert (window["run"], window["failed"], window["crashed/timeout"], window["max budget used"]) == (
        "40",
        "2",
        "1",
        "3.5",
    )
    assert sdpa[0]["max abs err"] == "1.5e-07" and sdpa[0]["max rel err"] == "3e-06"
    assert DEV_ID in sdpa[0]["notes"]
    mha = tables((out / "accuracy" / "mha.md").read_text())[0]
    assert mha[0]["unsupported"] == "3"
    assert mha[0]["notes"] == r"unsupported: torch has no float64 \| here"  # a pipe cannot break the row


def test_failures_listed_with_message_and_repro(results, tmp_path):
    out = tmp_path / "out"
    render(results, out, plots=False)
    fails = section((out / "accuracy.md").read_text(), "## Failures")
    assert "### 1. torch / cuda: sdpa matches_golden [window, float16] — failed" in fails
    assert "```\nsdpa: out differs\nmax error 1e-2 > allowed 3e-3\n```" in fails
    assert "```python\nimport torch\nq = torch.zeros(1, 2, 3)\n```" in fails
    assert "3 failed, crashed or timed-out cases, 1 kept" in fails


def test_deviations_page_has_facts_and_status_per_run(results, tmp_path):
    out = tmp_path / "out"
    render(results, out, plots=False)
    md = (out / "deviations.md").read_text()
    dev = section(md, f"## {DEV_ID}")
    facts = [[r["field"], r["value"]] for r in tables(dev)[0]]
    assert ["spec says", "output 0"] in facts and ["framework does", "NaN"] in facts
    assert ["fixed by", "adapter zeroes empty rows"] in facts
    assert "```python\ntorch.sdpa(...)\n```" in dev
    status = {r["run"]: (r["status"], r["observed"], r["exercised"]) for r in tables(dev)[1]}
    assert status == {"torch / cpu": ("observed", "2", "2"), "torch / cuda": ("stale", "0", "5")}


def test_performance_tables_rates_and_missed_target(results, tmp_path):
    out = tmp_path / "out"
    render(results, out, plots=False)
    md = (out / "performance.md").read_text()
    assert "Matmul rate measured in this run: float32 0.1 TFLOP/s." in md
    rows = tables(section(md, "### torch / cuda / float32"))[0]
    assert [(r["implementation"], r["n"]) for r in rows][:4] == [
        ("adapter", "256"),
        ("adapter", "512"),
        ("adapter", "1024"),
        ("lsh", "256"),
    ]
    assert rows[0]["median (min – max)"] == "1 ms (900 µs – 1.2 ms)"
    assert rows[0]["share of matmul"] == "50.0%"  # 0.05 / 0.1, computed from the same run's rate
    assert rows[0]["peak memory"] == "256 MiB"
    target = tables(section(md, "## Targets"))[0][0]
    assert target["met"] == "✗ (0.75× the target, 0.1 below)"


def test_missing_bench_is_reported(results, tmp_path):
    (results / "bench-torch-cuda.json").unlink()
    out = tmp_path / "out"
    assert main(["--results", str(results), "--out", str(out), "--no-plots"]) == 0
    perf = (out / "performance.md").read_text()
    assert "No benchmark results in" in perf and "run `nox -s bench`" in perf
    assert "No benchmark results: run `nox -s bench`." in (out / "index.md").read_text()


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("conformance-torch-cpu.json", '{"schema": "attnspec.conformance/1", "rows": [', "is not valid JSON"),
        ("bench-torch-cpu.json", "", "is empty"),
        (
            "conformance-torch-cpu.json",
            json.dumps({"schema": "attnspec.bench/1"}),
            "expected 'attnspec.conformance/1'",
        ),
    ],
)
def test_malformed_file_gives_a_clear_error(results, tmp_path, capsys, name, text, expected):
    (results / name).write_text(text)
    out = tmp_path / "out"
    assert main(["--results", str(results), "--out", str(out), "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert f"{results / name}: " in err and expected in err and "Traceback" not in err
    assert not out.exists()  # validated before anything is written


def test_malformed_row_names_row_and_field(results):
    doc = conformance("cpu")
    del doc["rows"][1]["passed"]
    doc["rows"][0]["max_abs_err"] = "tiny"
    write_json_atomic(results / "conformance-torch-cpu.json", doc)
    with pytest.raises(ResultsError) as info:
        load_results(results)
    msg = str(info.value)
    assert "conformance-torch-cpu.json: rows[1]: missing field 'passed'" in msg
    assert "conformance-torch-cpu.json: rows[0]: field 'max_abs_err' must be a number or null" in msg


LSH_QUALITY = {
    "schema": "attnspec.lsh_quality/1",
    "rows": [
        {"input": kind, "n_hashes": nh, "seed": s, "rel_err": 0.4 / nh + 0.01 * s}
        for kind in ("clustered", "isotropic")
        for nh in (1, 2, 4)
        for s in (0, 1)
    ],
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """One full render, plots included (the slow part, ~3 s), shared by the tests below.

    Returns the base directory holding ``results/`` and ``out/``; tests copy it before changing it.
    """
    base = tmp_path_factory.mktemp("rendered")
    d = base / "results"
    for device in ("cpu", "cuda"):
        write_json_atomic(d / f"conformance-torch-{device}.json", conformance(device))
    write_json_atomic(d / "bench-torch-cuda.json", bench("cuda"))
    write_json_atomic(d / "lsh-quality-cpu.json", LSH_QUALITY)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(deviations, "declared_deviations", lambda: ([], None))
        render(d, base / "out")
    return base


def test_interrupted_render_leaves_previous_report_intact(rendered, tmp_path, monkeypatch):
    base = tmp_path / "copy"
    shutil.copytree(rendered, base)
    out = base / "out"
    before = snapshot(out)
    assert {"index.md", "accuracy.md", "plots/weights-window.png"} <= set(before)
    write_json_atomic(base / "results" / "conformance-torch-cpu.json", conformance("cuda"))  # new content
    staged = []

    def boom(results, staged_output):  # runs after the heatmaps were staged, before the pages
        staged.extend(staged_output.written)
        raise RuntimeError("interrupted")

    monkeypatch.setattr(plots, "perf_plots", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        render(base / "results", out)
    assert "plots/weights-window.png" in staged  # the render was really midway
    assert snapshot(out) == before
    assert not list(out.glob("_tmp*"))


def test_rerender_is_deterministic_and_complete(rendered, tmp_path):
    first = snapshot(rendered / "out")
    base = tmp_path / "copy"
    shutil.copytree(rendered, base)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(deviations, "declared_deviations", lambda: ([], None))
        written = render(base / "results", base / "out")
    assert snapshot(base / "out") == first
    assert sorted(first) == written  # nothing else is left in the output directory
    assert {
        "plots/perf-torch-cuda-forward-float32.png",
        "plots/lsh-quality.png",
        "plots/weights-lsh.png",
    } <= set(written)
    assert all(len(b) < 200_000 for name, b in first.items() if name.endswith(".png"))
    index = first["index.md"].decode()
    for ref in (
        "(accuracy.md)",
        "(deviations.md)",
        "(performance.md)",
        "nox -s conformance",
        "nox -s bench",
        "nox -s report",
        "(plots/weights-causal-lower-right.png)",
        "(plots/weights-padded.png)",
        "(plots/weights-window.png)",
        "(plots/lsh-quality.png)",
        "(plots/perf-torch-cuda-forward-float32.png)",
    ):
        assert ref in index
    assert "numpy 2.4.6, torch 2.13.0" in index and "abc1234 (with uncommitted changes)" in index
    assert "torch.backends.cuda.matmul.allow_tf32=false" in index
    perf = first["performance.md"].decode()
    assert "(plots/perf-torch-cuda-forward-float32.png)" in perf
    quality = tables(section(perf, "## LSH approximation error"))[0]
    assert quality[0] == {
        "input": "clustered",
        "n_hashes": "1",
        "seeds": "2",
        "mean rel err": "0.405",
        "min": "0.4",
        "max": "0.41",
    }


def test_declared_deviations_read_defensively(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Deviation:  # field names as a backends module might spell them
        deviation_id: str
        backend: str
        feature: str
        spec_says: str
        native_does: str
        reproducer: str
        fixed_by: str

    module = types.ModuleType("attnspec.backends.deviations")
    module.DEVIATIONS = [
        Deviation("jax-native/x", "jax", "sdpa", "0", "NaN", "f()", "mask fix-up"),
        object(),
    ]  # no id: ignored
    monkeypatch.setitem(sys.modules, "attnspec.backends.deviations", module)
    devs, note = REAL_DECLARED()
    assert note is None
    assert [(d["id"], d["backend"], d["native_does"], d["fixed_by"]) for d in devs] == [
        ("jax-native/x", "jax", "NaN", "mask fix-up")
    ]


def test_write_json_atomic_round_trips_non_finite(tmp_path):
    path = tmp_path / "r" / "x.json"
    write_json_atomic(path, {"a": float("inf"), "b": [1.0, float("nan")]})
    assert json.loads(path.read_text()) == {"a": "inf", "b": [1.0, "nan"]}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temporary file left


def test_verdict_table_says_when_and_at_which_commit_each_run_finished(results):
    """The main job's closing table reads every results file: a one-backend run also lists the
    other backends' earlier results, so each line carries its finish time and commit."""
    from attnspec.reports.render import verdict_table

    header, *lines = verdict_table(load_results(results)).splitlines()
    assert header.split()[-2:] == ["finished", "commit"]
    assert sorted(line.split()[-3:] for line in lines) == [
        ["2026-11-23", "00:00", "abc1234"],
        ["2026-11-24", "00:00", "abc1234"],
    ]


def test_lsh_scaling_reads_a_skipped_group_without_implementation():
    """A skipped group with no "implementation" next to an implementation outside
    IMPLEMENTATION_ORDER: the table sorts both (it raised TypeError comparing None with a str)."""
    from attnspec.reports.performance import lsh_scaling

    shape = {"B": 1, "H": 2, "d": 8, "n": 64, "m": 64, "dtype": "float32", "causal": False}
    doc = {
        "backend": "numpy",
        "device": "cpu",
        "rows": [
            {**shape, "implementation": "lsh", "median_s": 2.0, "params": {"n_buckets": 4}},
            {**shape, "implementation": "flash", "median_s": 1.0},
        ],
        "skipped": [
            {
                "dtype": "float32",
                "reason": "no memory",
                "cases": [{k: shape[k] for k in ("B", "H", "d", "n")}],
            }
        ],
    }
    text = "\n".join(lsh_scaling(doc))
    assert "flash median" in text and "None median" in text and "skipped: no memory" in text
