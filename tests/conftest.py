import subprocess
import sys
from pathlib import Path

import pytest

# tests/mutants.py is imported by name, both here and by the suite subprocesses it starts
sys.path.insert(0, str(Path(__file__).parent))

import tiers
from check_runs import check_all  # this folder, on the path above
from tutorial_seeds import TUTORIAL_SEEDS

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before the fixtures a proof's runs happen in are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    tiers.starting(item)


@pytest.fixture(scope="session")
def tutorial_seed_checks(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """``attnspec check SEED --convention tutorial -k matches_golden`` (float32 and float16) for each tutorial seed, run
    once for the session (tests/test_check.py and tests/test_new_users.py both read them): name ->
    (the finished process, its --out folder)."""
    # float32 and float16: the empty-row rule shows in float32 (its mask-only corner) and -1e9
    # overflows float16 (a cause that comes first there); each dtype costs about a minute
    args = ("--convention", "tutorial", "--dtype", "float32", "--dtype", "float16", "-k", "matches_golden")
    runs = {name: (seed, *args) for name, seed in TUTORIAL_SEEDS.items()}
    return check_all(tmp_path_factory.mktemp("tutorial-seeds"), runs)
