"""Running one case on a backend, judging it against the golden, and explaining failures.

A failure message names backend, function, feature, dtype and shapes, the largest error and
where it is, the share of elements out of tolerance, the budget used, and a Python snippet that
reproduces the call; its first line ends with the clauses of the spec it breaks (`label_clauses`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from attnspec.backends.compare import Golden, sdpa_golden
from attnspec.conformance.hypothesis_helpers import SDPACase, array_source
from attnspec.errors import SpecError
from attnspec.spec.tolerance import Comparison

__all__ = [
    "Golden",
    "Verdict",
    "bad_input_verdict",
    "call_sdpa",
    "check_metadata",
    "failure_message",
    "golden_for",
    "label_clauses",
    "repro",
    "resolve_backend",
    "to_backend",
]


@dataclass
class Verdict:
    """The outcome of one case: what the results JSON records."""

    status: str  # passed | failed | unsupported | deviation
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    message: str = ""
    reason: str = ""
    deviation_id: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    @property
    def worst(self) -> Comparison | None:
        return max(self.comparisons.values(), key=lambda c: c.budget_used, default=None)


def resolve_backend(name: str):
    """A registered backend name, ``module:attribute`` naming a Backend class or factory, or
    ``module:function@convention`` (see `attnspec.backends.load`).

    The reproducers call it. Run from the folder ``attnspec check`` ran in, a module of that
    folder resolves as it did for check: the current folder is searched after the installed
    packages, so it can never hide one.
    """
    import os

    import attnspec.backends

    attnspec.backends.search_after_installed([os.getcwd()])
    return attnspec.backends.load(name)


def to_backend(backend, case: Any, device: str | None, options: dict[str, Any] | None = None):
    """q, k, v and options converted to the backend's arrays (lengths and masks included)."""
    opts = dict(case.options if options is None else options)
    conv = {}
    for name, value in opts.items():
        conv[name] = backend.asarray(value, device=device) if isinstance(value, np.ndarray) else value
    return (
        backend.asarray(case.q, device=device),
        backend.asarray(case.k, device=device),
        backend.asarray(case.v, device=device),
    ), conv


def call_sdpa(backend, case: SDPACase, device: str | None, **extra: Any):
    (q, k, v), opts = to_backend(backend, case, device)
    result = backend.sdpa(q, k, v, **opts, **extra)
    return result


def golden_for(case: SDPACase) -> Golden:
    """The float64 golden (before the final rounding) and the tolerance for this case: the kit's
    one rule (`attnspec.backends.compare.sdpa_golden`, which applies `attnspec.spec.tolerance`).

    Large cases (batch * Hq * n * m >= `BLOCKED_MIN_LOGITS`) get weights only when they ask for
    them. With ``return_lse`` the log-sum-exp is judged too, under `attnspec.spec.tolerance.lse_allowed`.
    """
    return sdpa_golden(case.q, case.k, case.v, **case.options)


def bad_input_verdict(
    backend_name: str,
    fn: str,
    bad_id: str,
    match: str,
    call: Callable[[], Any],
    named: str | None = None,
    named_first: bool = False,
) -> Verdict:
    """Judge one entry of a bad-input catalogue: ``call()`` must raise `SpecError` whose message
    matches ``match`` (a regex) and, when ``named`` is given, contains it (at the start with
    ``named_first``): the function's name. Any other outcome fails, saying what happened."""
    head = f"[{backend_name}] {fn} bad_input {bad_id}"
    name_rule = "" if named is None else f" and {'start with' if named_first else 'name'} {named!r}"
    try:
        call()
    except SpecError as exc:
        text = str(exc)
        named_ok = named is None or (text.startswith(named) if named_first else named in text)
        if re.search(match, text) and named_ok:
            return Verdict("passed")
        return Verdict(
            "failed", message=f"{head}: SpecError message {text!r} should match {match!r}{name_rule}"
        )
    except Exception as exc:
        return Verdict(
            "failed",
            message=(
                f"{head}: raised {type(exc).__name__}: {exc}, but should raise SpecError matching {match!r}"
            ),
        )
    return Verdict(
        "failed", message=f"{head}: returned a result, but should raise SpecError matching {match!r}"
    )


def check_metadata(
    backend, result, expected_shape, dtype: str, device: str | None, what: str = "out"
) -> list[str]:
    """Shape, dtype and device of one result array (``what`` names it in the problems).

    The device is the backend's own name for it (`Backend.device_of`), compared with the device
    the case ran on: a result that comes back elsewhere fails, naming both.
    """
    problems = []
    got_shape = tuple(result.shape)
    if got_shape != tuple(expected_shape):
        problems.append(f"{what}.shape={got_shape}, but should be {tuple(expected_shape)}")
    got_dtype = backend.dtype_name(result)
    if got_dtype != dtype:
        problems.append(f"{what}.dtype={got_dtype}, but should be {dtype}")
    if device is not None:
        got_device = backend.device_of(result)
        if got_device != device:
            problems.append(f"{what}.device={got_device}, but should be {device}")
    return problems


def repro(backend_name: str, case: SDPACase, device: str | None, fn: str = "sdpa", **extra: Any) -> str:
    """A self-contained snippet that rebuilds the case's inputs and calls backend and golden
    (``fn``: sdpa, or sdpa_blocked, which both the spec and the backends define)."""
    if hasattr(case, "repro"):  # cases of other functions (mha) write their own
        return case.repro(backend_name, device, **extra)
    lines = [
        "import numpy as np, ml_dtypes",
        "import attnspec.spec",
        "from attnspec.conformance.pytest_helpers import resolve_backend",
        f"b = resolve_backend({backend_name!r})",
    ]
    dt = "ml_dtypes.bfloat16" if case.dtype == "bfloat16" else f"np.{case.dtype}"

    def arr(x: np.ndarray) -> str:
        return array_source(x, dt)

    for name in ("q", "k", "v"):
        lines.append(f"{name} = {arr(getattr(case, name))}")
    opts = []
    for name, value in sorted({**case.options, **extra}.items()):
        opts.append(f"{name}={arr(value) if isinstance(value, np.ndarray) else repr(value)}")
    call = ", ".join(["q", "k", "v", *opts])
    dev = f", device={device!r}" if device else ""
    lines += [
        f"golden = attnspec.spec.{fn}({call})",
        f"to = lambda x: b.asarray(x{dev}) if isinstance(x, np.ndarray) else x",
        "args = {" + ", ".join(f"{o.split('=')[0]!r}: to({o.split('=', 1)[1]})" for o in opts) + "}",
        f"out = b.{fn}(to(q), to(k), to(v), **args)",
        "print(np.abs(b.to_numpy(out if not isinstance(out, tuple) else out[0]).astype(float) - "
        "(golden if not isinstance(golden, tuple) else golden[0]).astype(float)).max())",
    ]
    return "\n".join(lines)


def failure_message(
    backend_name: str,
    prop: str,
    case: Any,
    device: str | None,
    comparisons: dict[str, Comparison],
    problems: list[str],
    fn: str = "sdpa",
    causes: list[str] | None = None,
    **extra: Any,
) -> str:
    """The failure, its cause first: ``[backend] fn prop: CAUSE`` (when one is known), then the
    case, the problems and comparisons, and the reproducer."""
    cause = "; ".join(causes or [])
    head = f"[{backend_name}] {fn} {prop}: " + (f"{cause}\n  case: " if cause else "")
    lines = [f"{head}{case.describe()} device={device}"]
    lines += [f"  {p}" for p in problems]
    lines += comparison_lines(comparisons)
    lines.append("  reproduce with:")
    lines += ["    " + line for line in repro(backend_name, case, device, fn, **extra).splitlines()]
    return "\n".join(lines)


def label_clauses(message: str, function: str, prop: str, case_clause_ids=()) -> tuple[str, tuple[str, ...]]:
    """The failure message with the clauses its failure breaks named at the end of its first line,
    beside its cause (``... expected 0, got NaN [clause sdpa.empty_row]``), and those clauses.

    The suite's judge labels every failure once, whatever wrote its message: the clauses are the
    one the cause names when it is rule-specific, else the property's and the case's
    (`attnspec.spec.clauses.failure_clauses`). A message already labelled keeps its label."""
    from attnspec.conformance.recorder import failure_cause
    from attnspec.spec.clauses import clause_label, failure_clauses, split_label

    first, nl, rest = message.partition("\n")
    _, ids = split_label(first)
    if ids:
        return message, ids
    ids = failure_clauses(failure_cause(message), function, prop, case_clause_ids)
    if not ids:
        return message, ids
    return with_spec_line(f"{first} {clause_label(ids)}{nl}{rest}", ids), ids


def with_spec_line(message: str, ids) -> str:
    """``message`` with a line naming the spec version and what its clauses say, before its
    reproducer: ``spec 1.0.0: sdpa.empty_row: a query row with no visible key outputs 0 ...``."""
    from attnspec.spec.clauses import CLAUSES, SPEC_VERSION

    said = (
        "; ".join(f"{c}: {CLAUSES[c].title}" for c in ids if c in CLAUSES)
        if len(ids) <= 2
        else ", ".join(ids)
    )
    line = f"  spec {SPEC_VERSION}: {said}"
    head, marker, tail = message.partition("  reproduce with:\n")
    return f"{head.rstrip(chr(10))}\n{line}\n{marker}{tail}" if marker else f"{message}\n{line}"


def comparison_lines(comparisons: dict) -> list[str]:
    """One message line per failed comparison: its worst error, where, and the budget used."""
    lines = []
    for name, c in comparisons.items():
        if c.ok:
            continue
        where = f" at index {c.worst_index}" if c.worst_index is not None else ""
        lines.append(
            f"  {name}: max abs err {c.max_abs_err:.3e}{where} > allowed {c.allowed:.3e} "
            f"(budget used {c.budget_used:.3g}); {100 * c.out_of_tolerance:.1f}% of elements out of "
            f"tolerance; max rel err {c.max_rel_err:.3e}; {c.nonfinite_mismatch} NaN/inf mismatches"
        )
    return lines
