"""attnspec's sessions. ``nox -l`` lists them; every session passes ``session.posargs`` on."""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
# torch is pinned here (an unpinned torch pulls several GB of CUDA packages); override the file
# with ATTNSPEC_CONSTRAINTS=/path/to/constraints.txt, e.g. to test a CUDA build.
CONSTRAINTS = os.environ.get("ATTNSPEC_CONSTRAINTS", str(ROOT / "constraints.txt"))
PLUGIN = ROOT / "examples" / "attnspec-example-plugin"

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


def install(session: nox.Session, *args: str) -> None:
    session.install("-c", CONSTRAINTS, *args)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the kit's own tests (spec, backends, mutants, plugin) with every framework installed."""
    install(session, ".[all]")
    if PLUGIN.exists():
        install(session, str(PLUGIN))
    session.run("pytest", *session.posargs)
