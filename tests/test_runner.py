"""The runner survives a backend that aborts or hangs: that case is recorded, the rest reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.parametrize("target,status", [("mutants:Crasher", "crashed"), ("mutants:Hanger", "timeout")])
def test_runner_isolates_crash_and_hang(tmp_path, target, status):
    out = tmp_path / "results.json"
    env = {**os.environ, "PYTHONPATH": str(HERE), "ATTNSPEC_MAX_SIDE": "16"}
    proc = subprocess.run(
        [sys.executable, "-m", "attnspec.conformance.run", "--backend", target, "--profile", "dev",
         "--out", str(out), "--case-timeout", "6", "--", "-k", "matches_golden"],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-2000:]  # a crash or hang is a failure of the backend
    results = json.loads(out.read_text())
    rows = results["rows"]
    bad = sum(r[status] for r in rows)
    assert bad >= 1, proc.stderr[-2000:]
    assert sum(r["passed"] for r in rows) > 20  # everything else was still run and reported
    # every dtype's test finished despite the restarts
    assert {r["dtype"] for r in rows if r["passed"]} == {"float16", "bfloat16", "float32", "float64"}
    assert any(f["status"] == status for f in results["failures"])
