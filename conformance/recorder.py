"""Per-case results: recorded as the suite runs, aggregated into the results JSON.

Each case is journaled before the backend is called, so the crash-isolating runner
(`attnspec.conformance.run`) can tell which case took the process down. While Hypothesis shrinks
a failure it re-runs the test many times; only the first failure and the final (minimal) one are
kept, so the counts reflect distinct generated cases.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import time
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnspec.conformance.profiles import PROFILE_EXAMPLES
from attnspec.results import environment, write_json_atomic
from attnspec.spec.clauses import SPEC_VERSION, clause_label, failure_clauses, split_label

if TYPE_CHECKING:
    from attnspec.backends.base import Backend

STATUSES = ("passed", "failed", "unsupported", "deviation", "crashed", "timeout")


def case_key(nodeid: str, describe: str, seed: int) -> str:
    return hashlib.sha1(f"{nodeid}|{describe}|{seed}".encode()).hexdigest()[:16]


class Recorder:
    def __init__(self, profile: str, journal: str | None = None, skip_file: str | None = None):
        self.profile = profile
        # open for the whole run (closed when the process ends): the runner reads each line as it lands
        self.journal = open(journal, "a", buffering=1) if journal else None  # noqa: SIM115
        #: key -> {"status": "crashed" | "timeout", "message": why}: cases an earlier attempt lost
        self.skips: dict[str, dict[str, str]] = json.loads(Path(skip_file).read_text()) if skip_file else {}
        self.pending: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.records: list[dict[str, Any]] = []
        self.backend: Backend | None = None  # set by the attn_backend fixture
        self.backend_name = ""
        self.device: str | None = None
        self.started = time.time()
        self.deviation_exercised: dict[str, int] = defaultdict(int)
        self.first_result_at: float | None = None  # the first case's journal time (replayed runs)
        #: properties that raised with no failing case: the suite broke there (`test_finished`)
        self.suite_errors: list[str] = []

    def _log(self, event: dict[str, Any]) -> None:
        if self.journal:
            event = {**event, "t": round(time.time(), 3)}  # when: the runner's throughput figures
            self.journal.write(json.dumps(event, sort_keys=True, default=str) + "\n")
            self.journal.flush()  # in the OS's hands now: it survives this process crashing

    def start(self, nodeid: str, key: str) -> dict[str, str] | None:
        """Journal that a case is about to run; return its status and message if an earlier attempt
        lost it (crashed or timed out), and it must be skipped."""
        if key in self.skips:
            return self.skips[key]
        self._log({"event": "start", "node": nodeid, "key": key})
        return None

    def device_lost(self, nodeid: str, key: str, message: str) -> None:
        """Journal that this case left the device unusable (a CUDA kernel fault is sticky: every
        later call in the process fails the same way). The child then exits, the runner records the
        case as crashed with this message and restarts the child on a fresh device context."""
        self._log({"event": "device_lost", "node": nodeid, "key": key, "message": message})

    def record(self, nodeid: str, rec: dict[str, Any]) -> None:
        self.pending[nodeid].append(rec)
        self._log({"event": "case", "node": nodeid, **rec})

    def replay(self, events: list[dict[str, Any]]) -> None:
        """Rebuild the records from journal events (the runner's view across restarts)."""
        for ev in events:
            if ev["event"] == "case":
                rec = {k: v for k, v in ev.items() if k not in ("event", "node", "t")}
                t = ev.get("t")
                if t is not None and (self.first_result_at is None or t < self.first_result_at):
                    self.first_result_at = t
                self.pending[ev["node"]].append(rec)
            elif ev["event"] == "test_done":
                self.test_finished(ev["node"], ev["outcome"], log=False)

    def test_finished(self, nodeid: str, outcome: str, log: bool = True) -> None:
        recs = self.pending.pop(nodeid, [])
        if outcome == "failed" and not any(r["status"] in ("failed", "crashed", "timeout") for r in recs):
            # the property raised, yet no case of it failed: the suite itself broke there (a bug of
            # its strategies, an error outside any case), so its cases stopped: never a pass
            self.suite_errors.append(nodeid)
        # drop Hypothesis' shrinking replays but the last failing one (the minimal example), unless
        # it is a case already recorded
        shrunk = [r for r in recs if r.get("phase") == "shrink" and r["status"] == "failed"][-1:]
        recs = [r for r in recs if r.get("phase") != "shrink"]
        recs += [r for r in shrunk if r.get("key") not in {x.get("key") for x in recs}]
        self.records.extend(recs)
        for r in recs:
            for did in r.get("exercised", ()):
                self.deviation_exercised[did] += 1
        if log:
            self._log({"event": "test_done", "node": nodeid, "outcome": outcome})

    # -- aggregation ------------------------------------------------------------------------
    def results(self) -> dict[str, Any]:
        for node in list(self.pending):
            self.test_finished(node, "incomplete")
        rows: dict[tuple, dict[str, Any]] = {}
        failures = []
        # the first failure of each (function, property, feature, dtype, cause) is kept, each with its
        # reproducer: a failure of one rule never hides another's
        failed_keys: set[tuple[str, ...]] = set()
        for r in self.records:
            key = (r["function"], r["property"], r["feature"], r["dtype"])
            row = rows.setdefault(
                key,
                {
                    "function": key[0],
                    "property": key[1],
                    "feature": key[2],
                    "dtype": key[3],
                    "run": 0,
                    **{s: 0 for s in STATUSES},
                    "max_abs_err": None,
                    "max_rel_err": None,
                    "max_budget_used": None,
                    "unsupported_reasons": [],
                    "deviation_ids": [],
                },
            )
            row["run"] += 1
            row[r["status"]] += 1
            for field, src in (
                ("max_abs_err", "max_abs_err"),
                ("max_rel_err", "max_rel_err"),
                ("max_budget_used", "budget_used"),
            ):
                val = r.get(src)
                if val is not None and r["status"] in ("passed", "failed"):
                    row[field] = val if row[field] is None else max(row[field], val)
            if r["status"] == "unsupported" and r.get("reason") not in row["unsupported_reasons"]:
                row["unsupported_reasons"].append(r.get("reason"))
            for did in (r.get("deviation_id") or "").split(","):
                if did and did not in row["deviation_ids"]:
                    row["deviation_ids"].append(did)
            cause = failure_cause(r.get("message") or "") if r["status"] == "failed" else r["status"]
            failure_key = (*key, cause_kind(cause))
            if r["status"] in ("failed", "crashed", "timeout") and failure_key not in failed_keys:
                failed_keys.add(failure_key)
                clauses = record_failure_clauses(r, cause)
                if not split_label(cause)[1]:  # a crash or a hang: no message, the case's clauses
                    cause = f"{cause} {clause_label(clauses)}".strip()
                failures.append(
                    {k: r.get(k) for k in ("function", "property", "feature", "dtype", "status")}
                    | {
                        "cause": cause,
                        "clauses": list(clauses),
                        "message": r.get("message", ""),
                        "repro": r.get("repro", ""),
                    }
                )
        observed: dict[str, int] = defaultdict(int)
        for r in self.records:
            for did in (r.get("deviation_id") or "").split(","):
                if did:
                    observed[did] += 1
        deviations = []
        for dev, source in _declared_with_source(self.backend_name, self.backend):
            from attnspec.backends.deviations import BUILTIN_SOURCE, declaration

            did = dev_id(dev)
            # an atlas entry (it names the question that measures it) goes stale by its question
            # (nox -s atlas), not because the suite's cases with its tags all passed
            stale = self.deviation_exercised[did] and not getattr(dev, "question", None)
            status = "observed" if observed[did] else "stale" if stale else "not_exercised"
            entry = {
                "id": did,
                "status": status,
                "observed": observed[did],
                "exercised": self.deviation_exercised[did],
                "source": source,
            }
            if source != BUILTIN_SOURCE:  # declared outside the catalogue: the report shows it from here
                entry["declaration"] = declaration(dev)
            deviations.append(entry)
        results: dict[str, Any] = {
            "schema": "attnspec.conformance/1",
            "spec_version": SPEC_VERSION,
            "backend": self.backend_name,
            "device": self.device,
            "device_name": device_name(self.backend, self.device),
            "environment": self.environment(),
            "rows": [rows[k] for k in sorted(rows)],
            "failures": failures,
            "deviations": deviations,
        }
        if self.suite_errors:
            results["suite_errors"] = sorted(set(self.suite_errors))
        # a function checked through a convention: what was called, and what the probe found
        convention = None
        if (
            self.backend is not None
            and hasattr(self.backend, "describe")
            and hasattr(self.backend, "capabilities")
        ):
            results["implementation"] = self.backend.describe()
            results["capabilities"] = self.backend.capabilities.as_json()
            convention = getattr(self.backend, "convention", None)
        from attnspec.conformance.coverage import coverage

        results["coverage"] = coverage(results, self.records, convention)
        return results

    def environment(self) -> dict[str, Any]:
        policy: dict[str, Any] = {}
        if self.backend is not None and hasattr(self.backend, "numerics_policy"):
            policy = self.backend.numerics_policy()
        return {
            **environment(policy),
            "hypothesis_profile": self.profile,
            "hypothesis_seed": "derandomized"
            if PROFILE_EXAMPLES.get(self.profile, (0, False))[1]
            else "random",
            "max_side": int(os.environ.get("ATTNSPEC_MAX_SIDE", "24")),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "elapsed_s": round(time.time() - self.started, 1),
            "first_result_s": None
            if self.first_result_at is None
            else round(self.first_result_at - self.started, 1),
        }

    def write_results(self, path: str) -> None:
        write_json_atomic(path, self.results())


def failure_cause(message: str) -> str:
    """The cause a failure message gives on its first line (``[backend] fn prop: CAUSE`` followed by
    a ``case:`` line), else its first detail line, else its first line; with the clause label that
    ends the first line (``[clause sdpa.empty_row]``, `attnspec.spec.clauses.clause_label`) after
    it, so wherever the cause is shown the clause is named beside it."""
    head = message.partition("reproduce with:\n")[0]
    lines = [line.strip() for line in head.splitlines() if line.strip()]
    label = ""
    if lines:
        lines[0], ids = split_label(lines[0])
        label = f" {clause_label(ids)}" if ids else ""
    if len(lines) > 1 and lines[0].startswith("[") and ": " in lines[0] and lines[1].startswith("case: "):
        return lines[0].split(": ", 1)[1] + label
    return (lines[1] if len(lines) > 1 else (lines[0] if lines else "no message")) + label


def record_failure_clauses(rec: dict[str, Any], cause: str) -> tuple[str, ...]:
    """The clauses a recorded failure breaks: those its message's first line names (the judge's
    label), else, for a case that crashed or hung or a record from before the labels, the ones
    `attnspec.spec.clauses.failure_clauses` gives for its cause and the case's clauses."""
    first = (rec.get("message") or "").partition("\n")[0]
    ids = split_label(first)[1]
    if ids:
        return ids
    return failure_clauses(
        split_label(cause)[0], rec.get("function") or "", rec.get("property") or "", rec.get("clauses") or ()
    )


def cause_kind(cause: str) -> str:
    """A cause with its particulars (rows, indices, numbers, exception text) and its clause label
    taken out, so the same rule broken on other rows or values, or in cases that exercise other
    clauses, counts as one kind."""
    import re

    cause = split_label(cause)[0]
    kinds = []
    for part in cause.split("; "):
        part = re.sub(r"raised (\w+): .*", r"raised \1", part)
        part = re.sub(r" \(rows? \(.*$", "", part)  # "(rows (0, 1), (2, 3) and 5 more of (...))"
        part = re.sub(r" (visible )?rows? \(\d.*$", r" \1rows", part)  # "reached visible row (0, 0), ..."
        part = re.sub(r"\b\d+\.\d+(e[-+]?\d+)?\b|\b\d+e[-+]?\d+\b", "X", part)  # measured values
        kinds.append(" ".join(part.split()))
    return "; ".join(kinds)


def declared_deviations(backend_name: str, backend=None) -> list:
    """The deviations declared for ``backend_name``: the built-in or atlas entries of the backend
    whose deviations ``backend`` says it shares (``backend.deviations_of``, e.g. a wrapper of
    torch's SDPA), and those a plugin declares for its own backend (``backend.deviations``)."""
    return [dev for dev, _ in _declared_with_source(backend_name, backend)]


def _declared_with_source(backend_name: str, backend=None) -> list:
    try:
        from attnspec.backends.deviations import declared_for
    except ImportError:
        return []
    return declared_for(backend_name, backend)


def dev_id(dev) -> str:
    return getattr(dev, "id", None) or dev.deviation_id


def device_name(backend, device) -> str:
    if backend is not None and hasattr(backend, "device_name"):
        try:
            return backend.device_name(device)
        except Exception as exc:  # a report must not die on a cosmetic lookup
            return f"{device} ({type(exc).__name__})"
    return f"{platform.machine()} CPU ({os.cpu_count()} cores)" if device in (None, "cpu") else str(device)
