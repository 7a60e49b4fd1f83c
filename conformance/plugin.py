"""pytest plugin (entry point ``pytest11``): the ``--attn-backend`` option for the conformance suite.

Installed with attnspec, so a backend author can run, from their own project:

    pytest --pyargs attnspec.conformance --attn-backend NAME
"""

from __future__ import annotations


def pytest_addoption(parser) -> None:
    group = parser.getgroup("attnspec", "attnspec conformance")
    group.addoption("--attn-backend", action="append", default=None, metavar="NAME",
                    help="backend(s) to run the attnspec conformance suite against (repeatable)")
    group.addoption("--attn-device", default=None, metavar="DEVICE",
                    help="device to run on (default: the backend's first device)")
    group.addoption("--attn-results", default=None, metavar="PATH",
                    help="write the per-case results JSON here")
