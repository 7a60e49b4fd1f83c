"""The README's sample output of `attnspec check` is what the tool prints (#25).

The block between ``<!-- check-sample:begin -->`` and ``<!-- check-sample:end -->`` is the output
of the command it shows, from its first FAIL line to its verdict, with the output folder written
as the default ``attnspec-report``. Regenerate it after a change to the suite or the summary:

    ATTNSPEC_UPDATE_README=1 python -m pytest tests/test_readme_sample.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
BEGIN, END = "<!-- check-sample:begin -->", "<!-- check-sample:end -->"
COMMAND = [
    "check",
    "examples/tutorial/seed_attention.py:fill_neg_1e9_nan_to_num",
    "--convention",
    "tutorial",
    "--dtype",
    "float32",
]


def sample(out: Path) -> str:
    """The tool's output for the README: the command, then its summary from the first FAIL line."""
    tool = Path(sys.executable).with_name("attnspec")
    proc = subprocess.run(
        [str(tool), *COMMAND, "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=900
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    lines = proc.stderr.replace(str(out), "attnspec-report").splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("FAIL "))
    last = next(i for i, line in enumerate(lines) if line.startswith(("FAILS: ", "CONFORMS", "INCOMPLETE: ")))
    body = [line for line in lines[first : last + 1] if line.strip()]
    return "\n".join(["```", f"$ attnspec {' '.join(COMMAND)}", "...", *body, "```"])


@pytest.mark.proof
def test_readme_sample_is_what_check_prints(tmp_path):
    text = README.read_text()
    assert BEGIN in text and END in text, "README.md lost its check-sample markers"
    got = sample(tmp_path / "out")
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    if os.environ.get("ATTNSPEC_UPDATE_README") == "1":
        README.write_text(text.replace(shown, got))
        return
    assert re.sub(r"\s+$", "", shown, flags=re.M) == got, (
        "README.md's sample output differs from what attnspec check prints; regenerate it with "
        "ATTNSPEC_UPDATE_README=1 python -m pytest tests/test_readme_sample.py\n" + got
    )
