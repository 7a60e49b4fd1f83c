"""Fixtures of the conformance suite: the backend under test, its device, and the case judge."""

from __future__ import annotations

import functools
import os
import re
import traceback

import pytest

from attnspec import SpecError
from attnspec.backends import Unsupported
from attnspec.conformance.judge import judge_call
from attnspec.conformance.pytest_helpers import label_clauses, resolve_backend
from attnspec.conformance.recorder import case_key, declared_deviations, dev_id
from attnspec.spec.clauses import case_clauses, property_clauses

#: the exit status of a child whose device context a case broke (the runner restarts it)
DEVICE_LOST_EXIT = 75
#: errors after which a CUDA context is unusable: a kernel's fault is sticky, so every later call in
#: the process raises it again, and blaming those cases would hide what they would have done
_STICKY = re.compile(
    r"CUDA error: (misaligned address|an illegal memory access|unspecified launch failure|"
    r"device-side assert|an illegal instruction)"
    r"|CUDA_ERROR_(ILLEGAL_ADDRESS|MISALIGNED_ADDRESS|LAUNCH_FAILED|ILLEGAL_INSTRUCTION)"
)


def device_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the accelerator context is lost for this process (torch's
    AcceleratorError, CuPy's and JAX's CUDA errors), as opposed to one call failing."""
    return bool(_STICKY.search(f"{type(exc).__name__}: {exc}"))


@pytest.fixture(scope="session")
def attn_backend(attn_backend_name, pytestconfig):
    try:
        backend = resolve_backend(attn_backend_name)
    except Exception as exc:  # an unusable backend is the user's first question: say why
        pytest.fail(
            f"backend {attn_backend_name!r} is not usable: {type(exc).__name__}: {exc}", pytrace=False
        )
    if ":" in attn_backend_name and "@" not in attn_backend_name:
        # a path-loaded class: failures and reproducers name it as the user did
        backend.name = attn_backend_name
    if hasattr(backend, "numerics_policy"):
        backend.numerics_policy()  # sets TF32 off / highest matmul precision, and reports it
    rec = pytestconfig._attn_recorder
    rec.backend, rec.backend_name = backend, attn_backend_name
    rec.device = pytestconfig.getoption("--attn-device") or backend.devices()[0]
    return backend


@pytest.fixture(scope="session")
def attn_device(attn_backend, pytestconfig):
    return pytestconfig._attn_recorder.device


@pytest.fixture
def judge(attn_backend, attn_device, pytestconfig, request):
    """Run one case through ``body`` and record its verdict; undeclared failures raise.

    Every record names the clauses of the spec its case exercises (the property's and those of
    the case's options and tags), and every failure message names, at the end of its first line,
    the clauses it breaks (`label_clauses`): here, once, whichever test wrote the message."""
    rec = pytestconfig._attn_recorder
    nodeid = request.node.nodeid
    name = rec.backend_name
    deviations = declared_deviations(name, attn_backend)

    state = JudgeState()

    def run(function: str, prop: str, case, body, feature_case: dict | None = None) -> None:
        base = {
            "function": function,
            "property": prop,
            "feature": case.feature,
            "dtype": case.dtype,
            "tags": sorted(case.tags),
            "shapes": {k: list(v) for k, v in case.shapes.items()},
            "phase": state.phase,
        }
        # the clauses the case exercises: what the property checks on every case, and what its
        # options (a mask, an alignment, a variant) and tags (an empty row, a hidden NaN) add
        case_ids = case_clauses(getattr(case, "options", None) or {}, getattr(case, "tags", ()), function)
        base["clauses"] = list(dict.fromkeys((*property_clauses(function, prop), *case_ids)))
        # whether the implementation itself is called (bad input stops at validation, the signature
        # test inspects), and what the call asks of it: the verdict's coverage
        base["called"] = not (feature_case or {}).get("no_call") and not (feature_case or {}).get("bad_input")
        base["needs"] = case_needs(case) if function in ("sdpa", "sdpa_fp8") and base["called"] else []
        key = base["key"] = case_key(nodeid, case.describe(), case.seed)
        if state.phase == "sweep" and key in state.judged:
            return  # judged before the first failure: the sweep only adds the cases after it
        if state.phase in ("corner", "drawn"):
            state.judged.add(key)
        skipped = rec.start(nodeid, key)
        if skipped:
            rec.record(nodeid, {**base, **skipped})
            return
        reasons = attn_backend.supports(
            function,
            dtype=case.dtype,
            device=attn_device,
            q_shape=case.q.shape,
            k_shape=case.k.shape,
            v_shape=case.v.shape,
            **case.options,
            **(feature_case or {}),
        )
        if reasons:
            _refused(rec, nodeid, base, "; ".join(reasons))
            return
        applicable = [d for d in deviations if _applies(d, case.tags)]
        try:
            verdict = body()
        except Unsupported as exc:  # the backend declines this case as it runs: a declaration, not a failure
            _refused(rec, nodeid, base, str(exc))
            return
        except SpecError as exc:
            verdict = _raised(
                name, function, prop, case, attn_device, f"raised SpecError on a valid input: {exc}"
            )
        except Exception as exc:
            if device_lost(exc):  # every later call would fail alike: start again on a fresh device
                rec.device_lost(nodeid, key, f"raised {type(exc).__name__}: {str(exc).strip()}")
                os._exit(DEVICE_LOST_EXIT)
            # the innermost frames: where inside the implementation it failed
            verdict = _raised(
                name,
                function,
                prop,
                case,
                attn_device,
                f"raised {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-6)}",
            )
        if verdict.status == "failed" and applicable:
            # every declared deviation whose conditions the case meets is credited with it
            verdict.status, verdict.deviation_id = "deviation", ",".join(dev_id(d) for d in applicable)
        if verdict.status == "failed":
            verdict.message = label_clauses(verdict.message, function, prop, case_ids)[0]
        worst = verdict.worst
        rec.record(
            nodeid,
            {
                **base,
                "status": verdict.status,
                "reason": verdict.reason,
                "deviation_id": verdict.deviation_id,
                "max_abs_err": worst.max_abs_err if worst else None,
                "max_rel_err": worst.max_rel_err if worst else None,
                "budget_used": worst.budget_used if worst else None,
                "message": verdict.message if verdict.status == "failed" else "",
                "exercised": [dev_id(d) for d in applicable],
            },
        )
        if verdict.status == "failed" and state.phase != "sweep":
            if state.phase == "drawn":
                state.phase = "shrink"  # what Hypothesis runs from here on shrinks this failure
            raise AssertionError(verdict.message)

    return Judge(run, attn_backend, attn_device, state)


class Judge:
    """The ``judge`` fixture. ``judge(function, prop, case, body)`` runs one case through ``body``
    and records its verdict; ``judge.sdpa(prop, case)`` is that for a call of the backend's sdpa
    judged against the golden (`judge_call`); ``judge.state`` is where the property's run is."""

    def __init__(self, run, backend, device, state: JudgeState) -> None:
        self._run, self.backend, self.device, self.state = run, backend, device, state

    def __call__(self, function: str, prop: str, case, body, *rest, **kw) -> None:
        self._run(function, prop, case, body, *rest, **kw)

    def sdpa(self, prop: str, case, golden_case=None) -> None:
        backend, device = self.backend, self.device
        self("sdpa", prop, case, lambda: judge_call(backend, device, prop, case, golden_case))

    def through(self, run) -> Judge:
        """The same judge with its runs made by ``run`` (``run(judge, function, prop, case, body)``
        calls ``judge(...)`` itself: the corners' watch for refusals)."""
        return Judge(functools.partial(run, self._run), self.backend, self.device, self.state)


class JudgeState:
    """Where a property's run is, for the judge: ``corner`` (the fixed cases), ``drawn``
    (Hypothesis' examples), ``shrink`` (after the first failure, Hypothesis shrinking it: those
    records are dropped but the last failing one), ``sweep`` (the examples after the first
    failure, judged without raising so every distinct failure is recorded)."""

    def __init__(self) -> None:
        self.phase = "drawn"
        #: the case keys judged in the corner and drawn phases, which the sweep does not repeat
        self.judged: set[str] = set()


def case_needs(case) -> list[str]:
    """The needs (`attnspec.backends.conventions.NEEDS`) of an sdpa-shaped case, for coverage."""
    from attnspec.backends.conventions import call_needs

    try:
        return sorted(call_needs(case.q.shape, case.k.shape, case.v.shape, case.options).needs)
    except Exception:  # not an sdpa call (mha, lsh): its function and feature say enough
        return []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """After a property's first failure (raised, shrunk and recorded), run it once more in the
    ``sweep`` phase: every drawn example after that failure is judged and recorded, none raises,
    so one failure cannot hide another in the same property and dtype."""
    outcome = yield
    judge = getattr(item, "funcargs", {}).get("judge")
    state = getattr(judge, "state", None)
    excinfo = outcome.excinfo
    if (
        state is None
        or excinfo is None
        or not issubclass(excinfo[0], AssertionError)
        or state.phase == "drawn"
    ):
        return
    from attnspec.conformance.plugin import FAIL_FAST

    if FAIL_FAST:  # the run asks only whether anything fails
        return
    state.phase = "sweep"
    _REDRAWN.pop(item.nodeid, None)  # the sweep may redraw refused cases as the first run did
    try:
        item.runtest()
    except BaseException as exc:  # the sweep records; the verdict of the test is the first run's
        if isinstance(exc, KeyboardInterrupt):
            raise
    finally:
        state.phase = "drawn"


def _refused(rec, nodeid: str, base: dict, reason: str) -> None:
    """Record a case the backend refuses; a drawn one need not count as one of the profile's
    examples: Hypothesis draws another in its place (``reject``), up to the profile's count of
    redraws per test. So a function that expresses a few features (a FlashAttention-style
    convention, a native primitive) meets up to twice as many cases it can run, while a test of a
    function it lacks altogether (mha for an sdpa-only function) costs at most twice its count of
    quick refusals. Corner cases run outside Hypothesis (`attnspec.conformance.corners`) and are
    only recorded."""
    from hypothesis import currently_in_test_context, reject, settings

    rec.record(nodeid, {**base, "status": "unsupported", "reason": reason})
    if not currently_in_test_context():
        return
    default = settings.default
    assert default is not None  # Hypothesis loads its "default" profile when it is imported
    if _REDRAWN.get(nodeid, 0) >= default.max_examples:
        return
    _REDRAWN[nodeid] = _REDRAWN.get(nodeid, 0) + 1
    reject()


#: node id -> refused draws replaced so far (`_refused`)
_REDRAWN: dict[str, int] = {}


def _applies(deviation, tags) -> bool:
    needed = getattr(deviation, "tags", None)
    if not needed:
        return False
    return set(needed) <= set(tags)


def _raised(name, function, prop, case, device, text: str):
    from attnspec.conformance.pytest_helpers import Verdict, repro

    snippet = "\n".join("    " + line for line in repro(name, case, device).splitlines())
    first, _, rest = text.partition("\n")
    return Verdict(
        "failed",
        message=f"[{name}] {function} {prop}: {first}\n  case: {case.describe()} "
        f"device={device}\n  {rest}\n  reproduce with:\n{snippet}",
    )
