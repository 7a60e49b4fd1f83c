"""The verdict of `attnspec check` on code nobody here wrote (#25): never "conforms" when nothing
ran, imports that cannot be shadowed, every distinct failure recorded, result files named by the
subject, coverage stated, and the probe's friction gone. Each test here failed on the code before
#25 (tests/check_subjects_verdict.py holds the functions); the note of that change lists how.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import check_runs
import pytest

HERE = Path(__file__).parent
SUBJECTS = "check_subjects_verdict"


#: the installed command, as a user runs it (``python -m attnspec`` puts the current folder first on
#: the path, so there a folder named attnspec shadows the package before attnspec's code runs)
COMMAND = [str(Path(sys.executable).with_name("attnspec"))]


def check(*args: str, cwd: Path = HERE) -> subprocess.CompletedProcess:
    return check_runs.check("check", *args, cwd=cwd, command=COMMAND)


def results_in(out: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in (out / "results").glob("conformance-*.json")}


NUMPY = ("--convention", "torch_sdpa", "--arrays", "numpy")
#: one dtype and one property: the quick selection most runs here use
QUICK = ("--dtype", "float64", "-k", "matches_golden")
RUNS = {
    "uncallable": (f"{SUBJECTS}:attention", "--convention", "torch_sdpa"),
    "correct": (f"{SUBJECTS}:correct", *NUMPY, "--dtype", "float64"),
    "two_bugs": (f"{SUBJECTS}:two_bugs", *NUMPY, *QUICK),
    "prefix": (f"{SUBJECTS}:prefix_masks_only", *NUMPY, *QUICK),
    "four_d": (f"{SUBJECTS}:four_d_only", *NUMPY, *QUICK),
    "four_d_canonical": (
        f"{SUBJECTS}:four_d_only",
        *NUMPY,
        "--canonical",
        "--dtype",
        "float64",
        "-k",
        "matches_golden",
    ),
    "user_convention": (
        f"{SUBJECTS}:capped",
        "--convention",
        "check_subjects_convention:CAPPED",
        "--arrays",
        "numpy",
        "--dtype",
        "float64",
        "-k",
        "variants_match_golden",
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return check_runs.check_all(tmp_path_factory.mktemp("verdict"), RUNS, command=COMMAND)


@pytest.mark.proof
def test_a_function_that_cannot_be_called_is_not_conformant(runs):
    """Problem 1: `def attention(q, k)` through torch_sdpa was CONFORMS, exit 0."""
    proc, _ = runs["uncallable"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "CONFORMS" not in proc.stderr and "\nINCOMPLETE: " in proc.stderr
    assert "never called successfully" in proc.stderr
    # the probe's reason is printed, not only kept in the JSON
    assert "TypeError: attention() takes 2 positional arguments but 3 were given" in proc.stderr


def test_a_folder_named_attnspec_in_the_current_folder_shadows_nothing(tmp_path):
    """Problem 2: run from the folder holding a clone called attnspec, every child died on
    `cannot import name 'SpecError'` and the check reported 0 cases."""
    clone = tmp_path / "attnspec"  # a namespace-package-shaped folder, as a clone of this repo is
    (clone / "examples").mkdir(parents=True)
    shutil.copy(HERE / f"{SUBJECTS}.py", clone / "examples" / "mine.py")
    proc = check(
        "attnspec/examples/mine.py:correct",
        *NUMPY,
        *QUICK,
        "--out",
        str(tmp_path / "out"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = results_in(tmp_path / "out").values()
    assert sum(r["passed"] for r in results["rows"]) > 20


def test_a_child_that_cannot_import_attnspec_stops_the_check_in_one_line(tmp_path):
    """Problem 2, its other half: when the kit's own package cannot import in a child, the check
    says so in one line and exits 2, not "0 cases"."""
    shadow = tmp_path / "shadow" / "attnspec"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('a broken copy of attnspec')\n")
    code = (
        "import os, sys, attnspec.cli; os.environ['PYTHONPATH'] = sys.argv[1]; "
        "sys.exit(attnspec.cli.main(sys.argv[2:]))"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            str(shadow.parent),
            "check",
            "numpy",
            *QUICK,
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("attnspec check:")]
    assert len(lines) == 1 and "a broken copy of attnspec" in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.proof
def test_every_distinct_failure_is_recorded(runs):
    """Problem 3: a property stopped at its first failure, so a second bug in the same property
    and dtype went unreported. Both bugs of two_bugs are in matches_golden, float64."""
    proc, out = runs["two_bugs"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    (results,) = results_in(out).values()
    failing = {r["feature"] for r in results["rows"] if r["property"] == "matches_golden" and r["failed"]}
    assert {"gqa", "scale"} <= failing, failing
    causes = [f["cause"] for f in results["failures"]]
    assert any("GQA heads tiled" in c for c in causes), causes
    # one FAIL line per distinct cause: "FAIL features (dtypes; properties; count): cause; repro: path"
    fail_lines = [line for line in proc.stderr.splitlines() if line.startswith("FAIL ")]
    assert any(line.startswith("FAIL gqa ") and "): GQA heads tiled" in line for line in fail_lines), (
        fail_lines
    )
    assert any(line.startswith("FAIL scale ") for line in fail_lines), fail_lines


@pytest.mark.proof
def test_result_files_are_named_by_the_subject(runs, tmp_path):
    """Problem 5: every MODULE:FN --arrays numpy check wrote conformance-numpy-cpu.json."""
    names = {name for key in ("correct", "two_bugs") for name in results_in(runs[key][1])}
    assert names == {
        "conformance-check_subjects_verdict.correct_torch_sdpa-numpy-cpu.json",
        "conformance-check_subjects_verdict.two_bugs_torch_sdpa-numpy-cpu.json",
    }, names


@pytest.mark.proof
def test_the_verdict_states_its_coverage(runs):
    """Problem 6: a reader could not tell a thorough check from a thin one."""
    proc, out = runs["correct"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\nCONFORMS: " in proc.stderr
    (results,) = results_in(out).values()
    needs = results["coverage"]["needs"]
    # torch_sdpa expresses these, and every one ran (the feature tour draws each feature once)
    shapes = ("gqa", "rank2", "rank3", "rank5", "scale", "empty")
    visibility = ("mask", "mask_broadcast", "bias", "causal_upper_left", "causal_lower_right", "window")
    for need in (*shapes, *visibility, "q_lengths", "kv_lengths"):
        assert needs[need]["status"] == "ran" and needs[need]["cases"] > 0, (need, needs[need])
    assert needs["return_weights"]["status"] == "not expressible"
    assert "needs run (" in proc.stderr and "not expressible" in proc.stderr
    assert results["coverage"]["functions"]["sdpa"]["called"] > 100


@pytest.mark.proof
def test_a_refused_mask_shape_disables_only_itself(runs):
    """Problem 7: one refused probe (a non-prefix mask) turned off every explicit-mask case."""
    _, out = runs["prefix"]
    (results,) = results_in(out).values()
    mask = [c for c in results["capabilities"] if c["need"] == "mask"]
    assert mask and mask[0]["status"] == "ok", mask
    assert results["coverage"]["needs"]["mask"]["cases"] > 0


@pytest.mark.proof
def test_canonical_inputs_for_a_library_that_takes_only_4d(runs):
    """Problem 7: a function that unpacks four axes failed with "too many values to unpack"; the
    probe now finds the ranks it refuses, and --canonical gives it (B, H, L, D) and full masks."""
    proc, out = runs["four_d"]
    (results,) = results_in(out).values()
    refused = {c["need"]: c for c in results["capabilities"] if c["status"] == "refused"}
    assert {"rank2", "rank3", "rank5", "mask_broadcast"} <= set(refused), refused
    assert "probe: rank5 refused: " in proc.stderr and "too many values to unpack" in proc.stderr
    assert not [f for f in results["failures"] if "too many values to unpack" in f["message"]]
    proc, out = runs["four_d_canonical"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = results_in(out).values()
    assert {c["status"] for c in results["capabilities"] if c["need"].startswith("rank")} == {"ok"}
    assert all(
        results["coverage"]["needs"][n]["cases"] for n in ("rank2", "rank3", "rank5", "mask_broadcast")
    )


@pytest.mark.proof
def test_a_convention_defined_in_the_users_module_carries_softcap(runs):
    """Problem 7: softcap through torch_sdpa needed a private-looking subclass, and a convention
    of the user's could not be named with --convention."""
    proc, out = runs["user_convention"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = results_in(out).values()
    assert any(r["feature"] == "softcap" and r["passed"] for r in results["rows"]), results["rows"]
    assert results["implementation"]["convention"] == "capped_sdpa"
