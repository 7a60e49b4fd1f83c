"""The benchmark harness: its JSON, its arithmetic, its memory probe and its writer.

Timings on a shared CI machine are noise, so nothing here asserts a speed: only that the numbers
are consistent with each other and with their definitions.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

from attnspec.bench import run as bench
from attnspec.bench import targets as bench_targets
from attnspec.bench.grid import GRIDS, Case, estimated_seconds, grid_cases, workspace_bytes
from attnspec.bench.measure import probe_peak
from attnspec.reports._io import load_results
from attnspec.results import write_json_atomic
from attnspec.spec.sdpa import BLOCKED_MIN_LOGITS

#: every key a row of the harness carries (the report's schema makes some optional; the harness
#: writes them all)
_ROW = "implementation pass dtype B H n m d causal median_s min_s max_s repeats tflops share_of_matmul"
ROW_KEYS = {*_ROW.split(), "peak_mem_bytes", "mem_method"}


@pytest.fixture(scope="module")
def quick_numpy():
    # a tiny timing budget: this checks the plumbing, not the speed
    return bench.run_bench("numpy", "cpu", "quick", budget_s=0.01, max_repeats=3, log=None)


def test_quick_grid_numpy_is_valid_bench_json(quick_numpy, tmp_path):
    doc = quick_numpy
    write_json_atomic(tmp_path / "bench-numpy-cpu.json", doc)
    loaded = load_results(tmp_path)  # the renderer's validator; raises ResultsError if malformed
    assert [d["_file"] for d in loaded.bench] == ["bench-numpy-cpu.json"]
    assert doc["schema"] == "attnspec.bench/1"
    assert (doc["backend"], doc["device"], doc["grid"]) == ("numpy", "cpu", "quick")
    assert set(doc["matmul_tflops"]) == {"float32", "float64"}
    assert all(rate > 0 for rate in doc["matmul_tflops"].values())
    assert doc["targets"] == []  # targets belong to the full grid and --targets-only

    for row in doc["rows"]:
        where = f"{row['implementation']} {row['dtype']} n={row['n']} causal={row['causal']}"
        assert set(row) >= ROW_KEYS, f"{where}: missing {ROW_KEYS - set(row)}"
        assert 0 < row["min_s"] <= row["median_s"] <= row["max_s"], where
        assert row["repeats"] >= 1, where
        flops = 4 * row["B"] * row["H"] * row["n"] * row["m"] * row["d"]
        assert row["tflops"] == pytest.approx(flops / row["median_s"] / 1e12, rel=1e-12), where
        rate = doc["matmul_tflops"][row["dtype"]]
        assert row["share_of_matmul"] == pytest.approx(row["tflops"] / rate, rel=1e-12), where
        # dense-equivalent FLOPs let causal rows exceed 1; beyond 10 the reference is broken
        assert 1e-6 < row["share_of_matmul"] < 10, where
        assert row["mem_method"] == "rss-subprocess", where
        assert row["peak_mem_bytes"] >= 0, where

    # every planned case is accounted for: a row, or a skip with a reason
    planned = {c.key for c in grid_cases(GRIDS["quick"], "numpy", ("float32", "float64"))}
    measured = {bench_targets.row_key(r) for r in doc["rows"]}
    skipped = {
        (s["implementation"], s["dtype"], c["B"], c["H"], c["n"], c["m"], c["d"], c["causal"])
        for s in doc["skipped"]
        for c in s["cases"]
    }
    assert all(s["reason"] for s in doc["skipped"])
    assert measured.isdisjoint(skipped)
    assert measured | skipped == planned
    impls = {r["implementation"] for r in doc["rows"]}
    assert impls == {"adapter", "native", "golden", "blocked", "lsh"}


def test_golden_memory_grows_with_its_logits_until_it_tiles(quick_numpy):
    # n = 128 (4 heads: 65536 logits) runs vectorized and holds several float64 (n, m) arrays at
    # once, 4 * 128 * 128 * 8 B = 524 KB each. n = 512 reaches BLOCKED_MIN_LOGITS and runs tiled,
    # like sdpa_blocked: under one (n, m) float64 array (8.4 MB), of which the vectorized form
    # would hold about five (42 MB).
    by = {(r["implementation"], r["n"], r["causal"]): r["peak_mem_bytes"] for r in quick_numpy["rows"]}
    assert 4 * 128 * 128 < BLOCKED_MIN_LOGITS <= 4 * 512 * 512
    assert by[("golden", 128, False)] > 2 * 4 * 128 * 128 * 8
    assert by[("golden", 512, False)] < 4 * 512 * 512 * 8
    assert by[("blocked", 512, False)] < 4 * 512 * 512 * 8


def test_achieved_rate_hand_computed():
    case = Case("adapter", "float32", B=2, H=3, n=5, m=7, d=11)
    # q k^T and w v: 2 * n * m * d FLOPs each, per (batch, head): 4 * 2 * 3 * 5 * 7 * 11 = 9240
    assert case.flops == 9240
    tflops, share = bench.achieved(case, seconds=2e-6, matmul_tflops=0.0231)
    assert tflops == pytest.approx(9240 / 2e-6 / 1e12)  # 0.00462 TFLOP/s
    assert tflops == pytest.approx(0.00462)
    assert share == pytest.approx(0.2)
    # causal rows count the dense FLOPs too (documented: an effective rate)
    assert Case("adapter", "float32", 2, 3, 5, 7, 11, causal=True).flops == 9240
    assert bench.achieved(case, 1.0, None)[1] is None


def test_skip_rules_memory_and_time():
    golden = Case("golden", "float64", 1, 8, 4096, 4096, 64)
    # the golden holds ~5 float64 (n, m) arrays below BLOCKED_MIN_LOGITS and computes tile by
    # tile from there on; torch's fused CPU kernel holds none
    small = Case("golden", "float64", 1, 2, 512, 512, 64)
    assert workspace_bytes(small, "numpy", "cpu") == 5 * 2 * 512 * 512 * 8
    assert workspace_bytes(golden, "numpy", "cpu") is None
    assert workspace_bytes(Case("native", "float32", 1, 8, 4096, 4096, 64), "torch", "cpu") is None
    assert workspace_bytes(Case("blocked", "float64", 1, 1, 32768, 32768, 64), "numpy", "cpu") is None
    # 4 * 8 * 4096**2 * 64 = 34.4 GFLOP: 0.344 s at 0.1 TFLOP/s, 4x that at a 25% share
    assert estimated_seconds(golden, 0.1, None) == pytest.approx(0.3436, rel=1e-3)
    assert estimated_seconds(golden, 0.1, 0.25) == pytest.approx(4 * 0.3436, rel=1e-3)
    causal = Case("golden", "float64", 1, 8, 4096, 4096, 64, causal=True)
    assert estimated_seconds(causal, 0.1, None) == pytest.approx(0.3436 / 2, rel=1e-3)
    assert estimated_seconds(Case("lsh", "float32", 1, 1, 65536, 65536, 64), 0.1, 0.01) is None


def test_probe_measures_a_known_allocation():
    nbytes = 200_000_000
    peak, method = probe_peak("attnspec.bench.measure:allocation", {"nbytes": nbytes})
    assert method == "rss-subprocess"
    assert peak == pytest.approx(nbytes, rel=0.2), f"peak {peak} for a {nbytes}-byte allocation"


def test_probe_reports_a_dead_child():
    peak, method = probe_peak("attnspec.bench.measure:no_such_function", {})
    assert peak is None
    assert method.startswith("failed: probe exit code 1") and "AttributeError" in method


def test_atomic_write_keeps_the_old_file_when_the_writer_fails(tmp_path):
    path = tmp_path / "bench-x-cpu.json"
    write_json_atomic(path, {"schema": "attnspec.bench/1", "rows": [1, 2, 3]})
    before = path.read_bytes()
    # serialization dies midway: the first keys are already written to the temporary file
    with pytest.raises(TypeError):
        write_json_atomic(path, {"a": list(range(1000)), "z": object()})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no partial file left


def _target(name_part: str) -> bench_targets.Target:
    return next(t for t in bench_targets.TARGETS if name_part in t.name)


def _row(case: Case, median_s: float, **extra) -> dict:
    return {
        "implementation": case.impl,
        "dtype": case.dtype,
        **case.shape_dict(),
        "median_s": median_s,
        **extra,
    }


def test_overhead_target_says_by_how_much():
    adapter, native = _target("torch adapter").jobs[0]
    ok = bench_targets.evaluate("torch", [_row(adapter, 1.04), _row(native, 1.0)], {})
    (overhead,) = [t for t in ok if "overhead" in t["name"]]
    assert overhead["met"] is True and overhead["value"] == pytest.approx(0.04)
    bad = bench_targets.evaluate("torch", [_row(adapter, 1.10), _row(native, 1.0)], {})
    (overhead,) = [t for t in bad if "overhead" in t["name"]]
    assert overhead["met"] is False and overhead["value"] == pytest.approx(0.10)
    assert "missed by 5 %" in overhead["detail"]


def test_lsh_target_not_available_and_unmeasured_targets():
    lsh = _target("LSH").jobs[0][0]
    reason = "torch does not implement lsh_attention"
    results = bench_targets.evaluate("torch", [], {lsh.key: reason})
    (t,) = [t for t in results if "LSH" in t["name"]]
    assert t["met"] is None and t["value"] is None and t["detail"] == f"not available: {reason}"
    (golden,) = bench_targets.evaluate("numpy", [], {})[:1]
    assert golden["met"] is None and golden["detail"].startswith("not measured")


def test_blocked_memory_target_uses_the_computed_naive_size():
    (case,) = _target("blocked").jobs[0]
    naive = 32768 * 32768 * 8
    rows = [_row(case, 30.0, peak_mem_bytes=naive // 100, mem_method="rss-subprocess")]
    (t,) = [t for t in bench_targets.evaluate("numpy", rows, {}) if "blocked" in t["name"]]
    assert t["met"] is True and t["value"] == pytest.approx(0.01)


def test_list_prints_the_target_shapes():
    out = io.StringIO()
    with redirect_stdout(out):
        assert bench.main(["--backend", "numpy", "--targets-only", "--list"]) == 0
    lines = out.getvalue().splitlines()
    assert "golden float64 B=1 H=8 n=4096 m=4096 d=64  [target]" in lines
    assert "blocked float64 B=1 H=1 n=32768 m=32768 d=64  [target]" in lines
