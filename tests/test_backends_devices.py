"""Devices: every backend names the device of its arrays (`Backend.device_of`) as `devices` and
``asarray(device=...)`` do, results stay there, and the suite fails a result that comes back on
another device, naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import attnspec.backends as registry
from attnspec.backends.numpy import NumpyBackend
from attnspec.conformance.pytest_helpers import check_metadata

INSTALLED = [n for n, a in registry.available().items() if a.installed and n not in registry.atlas_names()]
HERE = Path(__file__).parent


class ElsewhereBackend(NumpyBackend):
    """The golden, but its results report another device than the one the case ran on (as a
    backend that moved them to a device of its choosing would)."""

    name = "elsewhere"

    def device_of(self, x) -> str:
        return "elsewhere:0"


@pytest.mark.parametrize("name", INSTALLED)
def test_device_of_names_each_device_as_asarray_takes_it_and_results_stay_there(name):
    be = registry.get(name)
    for device in be.devices():
        q = be.asarray(np.ones((1, 2, 4)), "float32", device=device)
        assert be.device_of(q) == device
        assert be.device_of(be.sdpa(q, q, q)) == device


def test_check_metadata_names_the_wrong_device():
    be = ElsewhereBackend()
    out = be.sdpa(*(be.asarray(np.ones((2, 3, 4), np.float32)),) * 3)
    assert check_metadata(be, out, (2, 3, 4), "float32", "cpu") == [
        "out.device=elsewhere:0, but should be cpu"
    ]
    assert check_metadata(NumpyBackend(), out, (2, 3, 4), "float32", "cpu") == []


@pytest.mark.proof
def test_the_suite_fails_results_on_another_device(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    results = tmp_path / "elsewhere.json"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        "attnspec.conformance.test_sdpa",
        "--attn-backend",
        "test_backends_devices:ElsewhereBackend",
        "--attn-profile",
        "dev",
        "--attn-results",
        str(results),
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore::RuntimeWarning",
        "-k",
        "test_matches_golden",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "out.device=elsewhere:0, but should be cpu" in proc.stdout
    rows = json.loads(results.read_text())["rows"]
    assert sum(r["failed"] for r in rows) >= 1 and not any(r["passed"] for r in rows)
