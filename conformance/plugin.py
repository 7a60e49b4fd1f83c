"""pytest plugin (entry point ``pytest11``) for the attnspec conformance suite.

Installed with attnspec, so a backend author can run, from their own project:

    pytest --pyargs attnspec.conformance --attn-backend NAME

NAME is a registered backend (``attnspec.backends.names()``) or ``module:attribute`` naming a
Backend class or factory. The plugin is inert unless ``--attn-backend`` is given.
"""

from __future__ import annotations

import json
import os
import time

from hypothesis import HealthCheck, settings

# `judge` is a function-scoped fixture on purpose: it is a stateless closure over the test's node id.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture]
settings.register_profile("dev", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("ci", max_examples=100, deadline=None, derandomize=True,
                          suppress_health_check=_SLOW_OK, print_blob=True)
settings.register_profile("thorough", max_examples=1000, deadline=None, derandomize=False,
                          suppress_health_check=_SLOW_OK, print_blob=True)
PROFILES = ("dev", "ci", "thorough")


def pytest_addoption(parser) -> None:
    group = parser.getgroup("attnspec", "attnspec conformance")
    group.addoption("--attn-backend", action="append", default=None, metavar="NAME",
                    help="backend to run the conformance suite against (repeatable); a registered "
                         "name or module:attribute")
    group.addoption("--attn-device", default=None, metavar="DEVICE",
                    help="device to run on (default: the backend's first device)")
    group.addoption("--attn-profile", default=None, choices=PROFILES,
                    help="Hypothesis profile: dev (fast), ci (default: derandomized, 100 examples "
                         "a property), thorough")
    group.addoption("--attn-dtype", action="append", default=None, metavar="DTYPE",
                    help="run only the cases of these dtypes (repeatable; default every dtype)")
    group.addoption("--attn-results", default=None, metavar="PATH",
                    help="write the aggregated results JSON here (one backend per run)")
    group.addoption("--attn-journal", default=None, metavar="PATH",
                    help="append one JSON line per case event here (used by the crash-isolating runner)")


def pytest_configure(config) -> None:
    if not config.getoption("--attn-backend"):
        return
    profile = config.getoption("--attn-profile") or os.environ.get("ATTNSPEC_PROFILE", "ci")
    settings.load_profile(profile)
    from attnspec.conformance.recorder import Recorder

    config._attn_recorder = Recorder(
        profile=profile,
        journal=config.getoption("--attn-journal"),
        skip_file=os.environ.get("ATTNSPEC_SKIP_CASES"),
    )


def pytest_generate_tests(metafunc) -> None:
    if "attn_backend_name" in metafunc.fixturenames:
        names = metafunc.config.getoption("--attn-backend") or []
        metafunc.parametrize("attn_backend_name", names, scope="session")


def pytest_collection_modifyitems(config, items) -> None:
    import pytest

    if config.getoption("--attn-backend"):
        dtypes = config.getoption("--attn-dtype")
        if dtypes:
            keep, drop = [], []
            for item in items:
                params = getattr(getattr(item, "callspec", None), "params", {})
                (drop if params.get("dtype", dtypes[0]) not in dtypes else keep).append(item)
            if drop:
                config.hook.pytest_deselected(items=drop)
                items[:] = keep
        return
    skip = pytest.mark.skip(reason="the conformance suite needs --attn-backend NAME")
    for item in items:
        if "attn_backend_name" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


def pytest_runtest_logreport(report) -> None:
    rec = _recorder_of(report)
    if rec is not None and report.when == "call":
        rec.test_finished(report.nodeid, report.outcome)


def pytest_sessionfinish(session, exitstatus) -> None:
    rec = getattr(session.config, "_attn_recorder", None)
    path = session.config.getoption("--attn-results") if rec is not None else None
    if rec is not None and path:
        rec.write_results(path)


_CONFIG = None


def _recorder_of(report):
    return getattr(_CONFIG, "_attn_recorder", None) if _CONFIG is not None else None


def pytest_sessionstart(session) -> None:
    global _CONFIG
    _CONFIG = session.config
    rec = getattr(session.config, "_attn_recorder", None)
    if rec is not None:
        rec.started = time.time()


def _dump(obj) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
