"""The conformance suite run on a mutant (or a control) in a subprocess, as a backend author
would run it: the quick ``dev`` profile, results JSON written, this folder importable so the
``mutants*`` modules load by ``module:attr``. Shared by tests/test_mutants*.py.

A mutant's run may be *fail-fast* (``ATTNSPEC_FAIL_FAST=1``, as ``nox -s mutation`` judges its
mutants): each property stops at its first failing example, unshrunk, with no sweep after it.
Which properties fail, and the message naming them, are the same; what is skipped is the
shrinking, which cost 80% of a mutant's run (136 s against 24 s for one mha mutant here).
`tests/test_mutants_mha.py` runs one mutant both ways and compares.

A mutant judged by the *features* its failures name runs *unshrunk* (``ATTNSPEC_SHRINK=0``): every
failure is still judged and swept, but each is reported as drawn. The first unshrunk failure alone
can name another feature than the shrunk one (fail-fast made 9 of those tests fail); with the sweep,
the features failed are the same (`tests/test_mutants.py` runs one mutant both ways), at about half
the time (9 s against 5 s for an sdpa mutant, 230 s against 116 s for a serving one, here).

A control always runs whole: a passing run has nothing to shrink, and it is the verdict a user
gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tiers

from attnspec.conformance.run import suite_arguments

HERE = Path(__file__).parent

#: name -> (the backend target, the pytest -k selection or None for the whole suite)
Targets = dict[str, tuple[str, "str | None"]]


def suite_command(target: str, profile: str, *pytest_args: str) -> list[str]:
    """``python -m pytest`` running the suite on ``target`` in ``profile`` as the runner's children
    run it (`attnspec.conformance.run.suite_arguments`), ``pytest_args`` added. Not guarded: a test
    that runs it for long is marked a proof by hand (tests/tiers.py)."""
    return [sys.executable, "-m", "pytest", *suite_arguments(target, profile, pytest_args)]


def run_suite(
    target: str,
    results: Path,
    keyword: str | None = None,
    timeout: float = 600,
    fail_fast: bool = False,
    shrink: bool = True,
) -> subprocess.CompletedProcess:
    tiers.require_proof(f"the conformance suite on {target}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env["ATTNSPEC_FAIL_FAST"] = "1" if fail_fast else "0"
    env["ATTNSPEC_SHRINK"] = "1" if shrink else "0"
    cmd = suite_command(target, "dev", "--attn-results", str(results), *(["-k", keyword] if keyword else []))
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=results.parent)


def run_all(
    tmp: Path, targets: Targets, timeout: float = 600, fail_fast: bool = False, shrink: bool = True
) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Each target's run (two at a time) and the path of its results JSON, by name. With
    ``fail_fast``, every target not named ``control...`` runs fail-fast; with ``shrink`` False,
    unshrunk (every failure judged and swept, each reported as drawn)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(
                run_suite,
                target,
                tmp / f"{name}.json",
                keyword,
                timeout,
                fail_fast and not name.startswith("control"),
                shrink or name.startswith("control"),
            )
            for name, (target, keyword) in targets.items()
        }
        return {name: (f.result(), tmp / f"{name}.json") for name, f in futures.items()}


Run = tuple[subprocess.CompletedProcess, Path]


def passed(run: Run, function: str | None = None, cases: int = 0) -> list[dict]:
    """A control's result rows (of ``function`` only, when given), once its run exited 0, no row
    failed and more than ``cases`` cases passed (the properties really ran)."""
    proc, path = run
    assert proc.returncode == 0, proc.stdout[-3000:]
    rows = [r for r in json.loads(path.read_text())["rows"] if function in (None, r["function"])]
    assert not any(r["failed"] for r in rows)
    assert sum(r["passed"] for r in rows) > cases, f"{sum(r['passed'] for r in rows)} cases passed"
    return rows


def caught(run: Run, name: str) -> dict:
    """A mutant's results JSON, once its run exited 1 (a run the mutant survived shows its output)."""
    proc, path = run
    assert proc.returncode == 1, f"{name} survived the suite:\n{proc.stdout[-2000:]}"
    return json.loads(path.read_text())
