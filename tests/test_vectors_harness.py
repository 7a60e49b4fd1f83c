"""The guide's GPU harness (docs/guide/vectors.md) for conformance vectors: the block shown is the file, and it runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnspec.conformance.vectors import load

ROOT = Path(__file__).resolve().parents[1]
HARNESS = ROOT / "examples" / "vectors-harness" / "harness.py"


def test_the_guide_shows_the_harness_file():
    readme = (ROOT / "docs" / "guide" / "vectors.md").read_text()
    block = re.search(
        r"<!-- vectors-harness:begin -->\n```python\n(.*?)```\n<!-- vectors-harness:end -->", readme, re.S
    )
    assert block, "docs/guide/vectors.md has no vectors-harness block"
    assert block.group(1) == HARNESS.read_text()
    assert len(HARNESS.read_text().splitlines()) <= 25


def _attnspec(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnspec", *args], capture_output=True, text=True, timeout=300
    )


def test_harness_runs_and_verifies(tmp_path):
    pytest.importorskip("torch")
    bundle, outputs = tmp_path / "vectors", tmp_path / "outputs"
    assert (
        _attnspec(
            "vectors",
            "export",
            "--out",
            str(bundle),
            "--function",
            "sdpa",
            "--dtype",
            "float32",
            "--dtype",
            "bfloat16",
        ).returncode
        == 0
    )
    run = subprocess.run(
        [sys.executable, str(HARNESS), str(bundle), str(outputs)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DEVICE": "cpu"},
    )
    assert run.returncode == 0, run.stderr
    written = list(outputs.glob("*.safetensors"))
    declared = list(outputs.glob("*.unsupported"))
    total = sum(len(b.cases) for b in load(bundle))
    assert written and declared and len(written) + len(declared) == total
    verify = _attnspec(
        "vectors",
        "verify",
        str(bundle),
        str(outputs),
        "--name",
        "torch-sdpa",
        "--out",
        str(tmp_path / "report"),
        "--atlas",
    )
    # torch's SDPA lets a masked key's NaN reach every row (spec decision 2; reports/deviations.md):
    # the atlas' NaN cases show it, and nothing else of what the harness can express fails
    assert verify.returncode == 1, verify.stderr[-3000:]
    fails = [line for line in verify.stderr.splitlines() if line.startswith("FAIL ")]
    assert len(fails) == 1 and "[clause sdpa.hidden_nonfinite]" in fails[0], fails
    assert "atlas_nan_hidden_key" in fails[0] and "atlas_nan_hidden_value" in fails[0]
    assert "FAILS: " in verify.stderr
    assert (tmp_path / "report" / "results" / "conformance-torch-sdpa-vectors.json").is_file()
    assert "torch-sdpa" in (tmp_path / "report" / "atlas.md").read_text()
