"""The kit's tests in two tiers, so that a contributor's run is quick and no proof is dropped.

- ``nox -s tests`` (``pytest -m "not proof"``): the spec, the backends, the reports, the docs, the
  runner's and the vectors' own machinery, all in this process or in short subprocesses.
- ``nox -s proofs`` (``pytest -m proof``): every test marked ``@pytest.mark.proof``, the evidence
  that the suite and its verdicts work, each a run of the conformance suite (or ``attnspec check``)
  in a subprocess, as a backend author would run it: every mutant caught, every control passing,
  every verdict on a real function read.

CI runs both. A plain ``pytest`` runs both too.

A test (or a fixture it uses) that starts such a run must carry the mark: `suite_runs.run_suite`
and `check_runs.check_all` call `require_proof`, which fails a test that does not, naming it. So
the quick tier cannot grow slow by accident. (A single ``check_runs.check`` is not guarded: a usage
error or ``attnspec backends`` returns in a second; the slow single runs are marked by hand.)
"""

from __future__ import annotations

import pytest

MARK = "proof"

#: the test whose setup or call is running now: its node id, and whether it carries the mark
_running: dict[str, object] = {"nodeid": None, "proof": True}


def starting(item: pytest.Item) -> None:
    """Called by ``tests/conftest.py`` before a test's fixtures are set up."""
    _running["nodeid"] = item.nodeid
    _running["proof"] = item.get_closest_marker(MARK) is not None


def require_proof(what: str) -> None:
    """Fail the running test unless it is marked ``@pytest.mark.proof``: ``what`` is the run it
    started (``attnspec check ...``, a suite run on ``mutants:...``)."""
    if not _running["proof"]:
        pytest.fail(
            f"{_running['nodeid']} starts {what} in a subprocess but is not marked "
            f"@pytest.mark.{MARK}: mark it (or its module), so that `nox -s proofs` runs it and "
            "`nox -s tests` stays quick",
            pytrace=False,
        )
