import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# tests/mutants.py is imported by name, both here and by the suite subprocesses it starts
sys.path.insert(0, str(Path(__file__).parent))

from tutorial_seeds import TUTORIAL_SEEDS  # this folder, on the path above

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def tutorial_seed_checks(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """``attnspec check SEED --convention tutorial -k matches_golden`` (float32 and float16) for each tutorial seed, run
    once for the session (tests/test_check.py and tests/test_new_users.py both read them): name ->
    (the finished process, its --out folder)."""
    tmp = tmp_path_factory.mktemp("tutorial-seeds")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}

    def check(name: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "attnspec", "check", TUTORIAL_SEEDS[name], "--convention", "tutorial"]
        # float32 and float16: the empty-row rule shows in float32 (its mask-only corner) and
        # -1e9 overflows float16 (a cause that comes first there); each dtype costs about a minute
        cmd += ["--dtype", "float32", "--dtype", "float16", "-k", "matches_golden", "--out", str(tmp / name)]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=HERE)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(check, name) for name in TUTORIAL_SEEDS}
        return {name: (f.result(), tmp / name) for name, f in futures.items()}
