"""`attnspec check` run as a user runs it: a subprocess with this folder importable, so the
``check_subjects*`` modules load by ``module:fn``. Shared by the tests that read its verdict
(test_check, test_verdict, test_plugin_deviations, test_corners_floor, test_paged, test_new_users
and conftest's tutorial seeds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tiers

HERE = Path(__file__).parent
#: ``python -m attnspec``: the command without the installed script
MODULE = [sys.executable, "-m", "attnspec"]

Run = tuple[subprocess.CompletedProcess, Path]


def check(
    *args: str,
    cwd: Path = HERE,
    timeout: float = 900,
    env: dict[str, str] | None = None,
    command: list[str] = MODULE,
) -> subprocess.CompletedProcess:
    """``attnspec ARGS`` (``check ...``, ``backends``...), its output captured."""
    path = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        timeout=timeout,
        cwd=cwd,
    )


def check_all(
    tmp: Path,
    runs: dict[str, tuple[str, ...]],
    workers: int = 2,
    envs: dict[str, dict[str, str]] | None = None,
    **kw,
) -> dict[str, Run]:
    """``attnspec check ARGS --out tmp/NAME`` for each name (``workers`` at a time, with
    ``envs[NAME]`` added to the environment): name -> (the finished process, its --out folder)."""
    tiers.require_proof(f"`attnspec check` on {', '.join(runs)}")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            name: pool.submit(
                check, "check", *args, "--out", str(tmp / name), env=(envs or {}).get(name), **kw
            )
            for name, args in runs.items()
        }
        return {name: (f.result(), tmp / name) for name, f in futures.items()}


def results_of(out: Path) -> dict:
    """The results JSON a check wrote under ``out``."""
    (path,) = (out / "results").glob("conformance-*.json")
    return json.loads(path.read_text())
