"""pytest plugin (entry point ``pytest11``) for the attnspec conformance suite.

Installed with attnspec, so a backend author can run, from their own project:

    pytest --pyargs attnspec.conformance --attn-backend NAME

NAME is a registered backend (``attnspec.backends.names()``) or ``module:attribute`` naming a
Backend class or factory. The plugin is inert unless ``--attn-backend`` is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest
from hypothesis import HealthCheck, Phase, settings

from attnspec.conformance.profiles import DEFAULT_PROFILE, PROFILE_EXAMPLES, PROFILES

# `judge` is a function-scoped fixture on purpose: it is a stateless closure over the test's node id.
_SLOW_OK = [
    HealthCheck.too_slow,
    HealthCheck.data_too_large,
    HealthCheck.filter_too_much,
    HealthCheck.function_scoped_fixture,
]
#: ``ATTNSPEC_FAIL_FAST=1``: a property stops at its first failing example, unshrunk, and no sweep
#: follows (conftest.py). For runs that ask only "does anything fail?", one per mutant
#: (`nox -s mutation`); never for a verdict, which names every distinct failure.
FAIL_FAST = os.environ.get("ATTNSPEC_FAIL_FAST") == "1"
_FAIL_FAST_ORDER = {
    name: i
    for i, name in enumerate(
        ("test_sdpa.py", "test_variants.py", "test_serving.py", "test_dropout.py", "test_signatures.py")
    )
}
#: ``ATTNSPEC_SHRINK=0``: every failure is still judged and swept, but reported as drawn, not shrunk
#: (the kit's own tests of which features a mutant fails: shrinking picks the example shown, not
#: which properties and features fail, and cost most of a failing run)
SHRINK = os.environ.get("ATTNSPEC_SHRINK", "1") != "0"
_PHASES = (Phase.explicit, Phase.reuse, Phase.generate) if FAIL_FAST or not SHRINK else tuple(Phase)
for _name, (_examples, _derandomize) in PROFILE_EXAMPLES.items():
    settings.register_profile(
        _name,
        max_examples=_examples,
        deadline=None,
        derandomize=_derandomize,
        suppress_health_check=_SLOW_OK,
        print_blob=True,
        phases=_PHASES,
    )


def pytest_addoption(parser) -> None:
    group = parser.getgroup("attnspec", "attnspec conformance")
    group.addoption(
        "--attn-backend",
        action="append",
        default=None,
        metavar="NAME",
        help="backend to run the conformance suite against (repeatable); a registered "
        "name or module:attribute",
    )
    group.addoption(
        "--attn-device",
        default=None,
        metavar="DEVICE",
        help="device to run on (default: the backend's first device)",
    )
    group.addoption(
        "--attn-profile",
        default=None,
        choices=PROFILES,
        help="Hypothesis profile: dev (12 examples a property), default (25), ci (100), "
        "thorough (1000, random); see attnspec.conformance.profiles",
    )
    group.addoption(
        "--attn-dtype",
        action="append",
        default=None,
        metavar="DTYPE",
        help="run only the cases of these dtypes (repeatable; default every dtype)",
    )
    group.addoption(
        "--attn-shard",
        default=None,
        metavar="I/N",
        help="run only share I of N (0 <= I < N) of the tests, dealt round-robin in collection "
        "order (the runner's --jobs)",
    )
    group.addoption(
        "--attn-results",
        default=None,
        metavar="PATH",
        help="write the aggregated results JSON here (one backend per run)",
    )
    group.addoption(
        "--attn-journal",
        default=None,
        metavar="PATH",
        help="append one JSON line per case event here (used by the crash-isolating runner)",
    )


def pytest_configure(config) -> None:
    if not config.getoption("--attn-backend"):
        return
    profile = config.getoption("--attn-profile") or os.environ.get("ATTNSPEC_PROFILE", DEFAULT_PROFILE)
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


@pytest.hookimpl(tryfirst=True)  # before --deselect and -k, so every restart sees the same share
def pytest_collection_modifyitems(config, items) -> None:
    if config.getoption("--attn-backend"):
        dtypes = config.getoption("--attn-dtype")
        if dtypes:
            keep: list[pytest.Item] = []
            drop: list[pytest.Item] = []
            for item in items:
                params = getattr(getattr(item, "callspec", None), "params", {})
                (drop if params.get("dtype", dtypes[0]) not in dtypes else keep).append(item)
            if drop:
                config.hook.pytest_deselected(items=drop)
                items[:] = keep
        if FAIL_FAST:  # the properties that catch most bugs first: the run ends at the first failure
            items.sort(key=lambda item: _FAIL_FAST_ORDER.get(item.path.name, len(_FAIL_FAST_ORDER)))
        shard = config.getoption("--attn-shard")
        if shard:
            index, count = _shard(shard)
            drop = [item for i, item in enumerate(items) if i % count != index]
            if drop:
                config.hook.pytest_deselected(items=drop)
                items[:] = [item for i, item in enumerate(items) if i % count == index]
        return
    skip = pytest.mark.skip(reason="the conformance suite needs --attn-backend NAME")
    for item in items:
        if "attn_backend_name" in getattr(item, "fixturenames", ()):
            item.add_marker(skip)


def _shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    if not (sep and index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise pytest.UsageError(f"--attn-shard={text!r}: expected I/N with 0 <= I < N, e.g. 0/2")
    return int(index), int(count)


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own wrapper draws the property's first case
def pytest_runtest_call(item) -> None:
    """Seed a property's derandomized draws by its name and parameters alone (`case_seed`).

    Hypothesis seeds a derandomized test from a digest of its source text and its pytest node id.
    The node id holds the path the suite was collected from (a checkout, an editable install, a
    venv's site-packages) and the backend's name, and the source text changes with every edit that
    leaves the property as it was (a formatter's reflow, a renamed import). So the "same cases on
    every run" of the profiles were the same only for one backend, one install and one spelling:
    CI's installed suite drew other cases than a checkout did. Seeded by `stable_case_key`, every
    backend, wherever attnspec is installed and however its source is laid out, meets the same
    cases, and results compare across backends, machines and commits. A property whose strategy
    changes still draws new cases: the seed fixes the random stream, not what is drawn from it.
    """
    if not item.config.getoption("--attn-backend"):
        return
    seed = case_seed(stable_case_key(item))
    fn = getattr(item, "obj", None)
    while fn is not None:  # the test, and the Hypothesis test inside a wrapper (`with_corners`)
        if getattr(fn, "is_hypothesis_test", False):
            chosen = getattr(fn, "_hypothesis_internal_use_settings", None) or settings()
            if chosen.derandomize:
                fn._hypothesis_internal_use_seed = seed
        fn = getattr(fn, "__wrapped__", None)


#: part of every property's seed: raising it changes every case every profile draws, on purpose
CASES_EDITION = 1


def case_seed(key: str) -> int:
    """The Hypothesis seed of the property run `key` names (`stable_case_key`), in `CASES_EDITION`."""
    digest = hashlib.sha256(f"attnspec cases {CASES_EDITION}|{key}".encode()).digest()
    return int.from_bytes(digest[:16], "big")


def stable_case_key(item) -> str:
    """``test_sdpa.py::test_name[dtype=float32]``: the module's file name, the test's name and its
    parameters other than the backend, not the path or the backend's name."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    shown = ",".join(f"{k}={_param_text(v)}" for k, v in sorted(params.items()) if k != "attn_backend_name")
    return f"{item.path.name}::{getattr(item, 'originalname', item.name)}[{shown}]"


def _param_text(value) -> str:
    """A parameter as text that is the same in every process (no object addresses)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return str(value)
    return str(getattr(value, "id", type(value).__name__))


def pytest_runtest_logreport(report) -> None:
    rec = _recorder_of(report)
    if rec is not None and (report.when == "call" or (report.when == "setup" and report.failed)):
        rec.test_finished(report.nodeid, report.outcome)  # a setup error is the suite's own failure


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
