"""The two tiers of the kit's tests (tests/tiers.py): a test that starts a suite run must carry the
proof mark, and the nox sessions split the tests by it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import tiers

ROOT = Path(__file__).parent.parent


class _Item:
    def __init__(self, marked: bool) -> None:
        self.nodeid = "tests/test_x.py::test_y"
        self._marked = marked

    def get_closest_marker(self, name: str):
        return object() if self._marked and name == tiers.MARK else None


@pytest.fixture
def restored():
    saved = dict(tiers._running)
    yield
    tiers._running.update(saved)


def test_an_unmarked_test_that_starts_a_suite_run_fails_naming_itself(restored):
    tiers.starting(_Item(marked=False))
    with pytest.raises(
        pytest.fail.Exception, match=r"tests/test_x.py::test_y starts a run .* @pytest.mark.proof"
    ):
        tiers.require_proof("a run")
    tiers.starting(_Item(marked=True))
    tiers.require_proof("a run")  # marked: allowed


def test_the_sessions_split_the_tests_by_the_mark():
    """`nox -s tests` deselects the proofs and `nox -s proofs` selects them, so together they run
    every test once; CI runs both."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    selection = {
        fn.name: call.args[1].value
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef)
        for call in ast.walk(fn)
        if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "_kit_tests"
    }
    assert selection == {"tests": f"not {tiers.MARK}", "proofs": tiers.MARK}
    ci = (ROOT / ".ci" / "run").read_text()
    assert "nox -s tests" in ci and "nox -s proofs" in ci
