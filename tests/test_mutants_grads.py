"""The gradient properties catch every broken backward, name the property, and pass the control.

Each backend runs the real suite (``pytest --pyargs attnspec.conformance -k grads``, the quick
``dev`` profile) in a subprocess, as a backend author would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mutants_grads import GRAD_MUTANTS

HERE = Path(__file__).parent


def run_suite(target: str, results: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "attnspec.conformance", "--attn-backend", target,
           "--attn-profile", "dev", "--attn-results", str(results), "-q", "-p", "no:cacheprovider",
           "-W", "ignore::RuntimeWarning", "-k", "grads"]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=results.parent)


@pytest.fixture(scope="module")
def grad_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grad_mutants")
    targets = {"control": "mutants_grads:control", **{m: f"mutants_grads:mutant_{m}" for m in GRAD_MUTANTS}}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run_suite, t, tmp / f"{name}.json")
                   for name, t in targets.items()}
        return {name: (f.result(), tmp / f"{name}.json") for name, f in futures.items()}


def _vjp_rows(path):
    return [r for r in json.loads(path.read_text())["rows"] if r["function"] == "sdpa_vjp"]


def test_control_passes(grad_runs):
    proc, path = grad_runs["control"]
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = _vjp_rows(path)
    assert sum(r["passed"] for r in rows) > 150  # the gradient properties really ran cases
    assert not any(r["failed"] for r in rows)


@pytest.mark.parametrize("mutant", sorted(GRAD_MUTANTS))
def test_grad_mutant_is_caught_and_property_named(grad_runs, mutant):
    proc, path = grad_runs[mutant]
    assert proc.returncode == 1, f"grad mutant {mutant} survived the suite:\n{proc.stdout[-2000:]}"
    failed = {r["property"] for r in _vjp_rows(path) if r["failed"]}
    expected = GRAD_MUTANTS[mutant]
    assert expected in failed, f"{mutant}: failing properties {sorted(failed)} miss {expected}"
    assert f"sdpa_vjp {expected}" in proc.stdout  # the message names function and property
    assert "reproduce with" in proc.stdout
