"""The serving property catches the bugs serving kernels ship, and only it does.

Each mutant of tests/mutants_serving.py runs through the real suite (``dev`` profile, a
subprocess, as a backend author would run it) twice: the serving property alone must fail it
with a serving feature named, and the base sdpa property (``test_matches_golden``), whose tiny
shapes cannot show the bug, passes it (`BASE_CATCHES` excepted): the gap the serving cases close. The control (`Naive`
without a bug) passes the serving property.
"""

from __future__ import annotations

import json

import pytest
from mutants_serving import SERVING_MUTANTS
from suite_runs import caught, passed, run_all

from attnspec.conformance.serving_cases import SERVING_FEATURES

# every test here runs the suite in a subprocess on a mutant or its control: `nox -s proofs`
pytestmark = pytest.mark.proof

SERVING_RUN = "test_serving"
#: bugs the base property catches too: its corner and no_visible_rows cases hold empty caches, and
#: since its kv_lengths draws take n != m (n = 1, m = 2, kv_lengths = 1 among them) a decode kernel
#: that reads whole tiles shows the key past the length even in its tiny shapes
BASE_CATCHES = {"empty_cache_nan", "decode_reads_whole_tiles"}
BASE_RUN = "test_sdpa and test_matches_golden"


@pytest.fixture(scope="module")
def suite_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serving_mutants")
    targets = {"control": ("mutants:control", SERVING_RUN)}
    for bug in SERVING_MUTANTS:
        targets[bug] = (f"mutants_serving:mutant_{bug}", SERVING_RUN)
        if bug not in BASE_CATCHES:
            targets[f"{bug}-base"] = (f"mutants_serving:mutant_{bug}", BASE_RUN)
    return run_all(tmp, targets, shrink=False)


def test_control_passes_the_serving_property(suite_runs):
    rows = passed(suite_runs["control"])
    features = {r["feature"] for r in rows if r["passed"]}
    missing = set(SERVING_FEATURES) - features  # every serving feature ran and passed
    assert not missing, sorted(missing)
    assert sum(r["passed"] for r in rows) >= 60  # 6 fixed + 12 drawn per dtype, 4 dtypes


@pytest.mark.parametrize("bug", sorted(SERVING_MUTANTS))
def test_serving_mutant_is_caught_with_its_feature(suite_runs, bug):
    proc = suite_runs[bug][0]
    results = caught(suite_runs[bug], bug)
    failed = {r["feature"] for r in results["rows"] if r["failed"]}
    assert failed & set(SERVING_MUTANTS[bug]), f"{bug}: failures {sorted(failed)}"
    assert "reproduce with:" in proc.stdout


@pytest.mark.parametrize("bug", sorted(set(SERVING_MUTANTS) - BASE_CATCHES))
def test_base_property_cannot_see_serving_bug(suite_runs, bug):
    """Why the serving cases exist: the base property's shapes pass every one of these bugs."""
    proc, path = suite_runs[f"{bug}-base"]
    rows = json.loads(path.read_text())["rows"]
    assert sum(r["passed"] for r in rows) > 40, proc.stdout[-2000:]
    assert proc.returncode == 0, f"{bug}: the base property already fails it:\n{proc.stdout[-2000:]}"
