"""Crash-isolating runner: ``python -m attnspec.conformance.run --backend NAME``.

Runs the suite in a child pytest process that journals every case before calling the backend.
If the child dies (segfault, abort) or stops making progress for ``--case-timeout`` seconds, the
case it was on is recorded as crashed / timed out and the child is restarted, skipping that case
and every test that already finished. The results JSON is rebuilt from the journal, so nothing
that ran is lost. Prints progress (tests done, cases run, what is running, elapsed) to stderr.

Ctrl-C (SIGINT) or SIGTERM stops the child's whole process group, writes the results of the
cases that finished (marked ``"incomplete": true``) and exits 130 / 143. The child's logs are
removed when the run is clean, and kept beside the results file (``<results>.logs/``) otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnspec._journal import read_journal as _read
from attnspec.conformance.pytest_helpers import resolve_backend
from attnspec.conformance.recorder import Recorder
from attnspec.reports._io import write_json_atomic

MAX_RESTARTS = 20
PROFILES = ("dev", "ci", "thorough")


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnspec.conformance.run", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", required=True, help="registered backend name, module:Class or module:function@convention")
    ap.add_argument("--device", default=None, help="device (default: the backend's first)")
    ap.add_argument("--profile", default=os.environ.get("ATTNSPEC_PROFILE", "ci"), choices=PROFILES)
    ap.add_argument("--out", default=None, help="results JSON (default reports/results/conformance-<backend>-<device>.json)")
    ap.add_argument("--case-timeout", type=float, default=300.0, help="seconds without progress before a case counts as hung")
    ap.epilog = "Any other option (-k EXPR, -x, --maxfail N, ...) goes to pytest as it is."
    args, pytest_args = ap.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    backend = resolve_backend(args.backend)
    device = args.device or backend.devices()[0]
    out = Path(args.out or f"reports/results/conformance-{slug(args.backend)}-{slug(device)}.json")
    try:
        results = run_suite(args.backend, backend, device, args.profile, out, args.case_timeout,
                            pytest_args, device_given=args.device is not None)
    except Interrupted as e:
        return 128 + e.signum
    return 1 if summary(results)["bad"] else 0


def run_suite(target: str, backend, device: str, profile: str, out: Path, case_timeout: float = 300.0,
              pytest_args: list[str] | None = None, *, device_given: bool = True,
              env: dict[str, str] | None = None, quiet: bool = False, log_tail: bool = True) -> dict:
    """Run the suite on ``target`` with crash isolation; write and return the results.

    Raises:
        Interrupted: after SIGINT/SIGTERM, once the child is stopped and the partial results
            (``"incomplete": true``) are written.
    """
    work = Path(tempfile.mkdtemp(prefix="attnspec-run-"))
    journal, skipfile = work / "journal.jsonl", work / "skip.json"
    skips: dict[str, str] = {}
    finished: set[str] = set()
    started = time.time()
    interrupted: list[int] = []
    proc: subprocess.Popen | None = None

    def stop(signum, _frame):
        interrupted.append(signum)
        if proc is not None and proc.poll() is None:
            _kill_group(proc)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    attempt = 0
    try:
        for attempt in range(MAX_RESTARTS + 1):
            skipfile.write_text(json.dumps(skips))
            cmd = [sys.executable, "-m", "pytest", "--pyargs", "attnspec.conformance", "--attn-backend", target,
                   "--attn-profile", profile, "--attn-journal", str(journal), "-q", "-p", "no:cacheprovider",
                   "-W", "ignore::RuntimeWarning", "-W", "ignore::DeprecationWarning", *(pytest_args or [])]
            if device_given:
                cmd += ["--attn-device", device]
            for node in sorted(finished):
                cmd += ["--deselect", node]
            child_env = {**os.environ, **(env or {}), "ATTNSPEC_SKIP_CASES": str(skipfile)}
            with open(work / f"pytest-{attempt}.log", "w") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                                        start_new_session=True)
                status = _watch(proc, journal, case_timeout, f"{target} {device}", started, interrupted, quiet)
            events = _read(journal)
            finished = {e["node"] for e in events if e["event"] == "test_done"}
            if status is None or interrupted:
                break
            key = _last_started(events)
            print(f"\n[{target}] child {status} (attempt {attempt}); case {key} recorded as {status}",
                  file=sys.stderr)
            if key is None or key in skips:
                print(f"[{target}] cannot isolate the failing case", file=sys.stderr)
                break
            skips[key] = status
            # drop the unfinished test's partial cases: it reruns from its start
            events = [e for e in events if e["event"] == "start" or e["node"] in finished]
            journal.write_text("".join(json.dumps(e) + "\n" for e in events))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    rec = Recorder(profile)
    rec.backend, rec.backend_name, rec.device, rec.started = backend, target, device, started
    rec.replay(_read(journal))
    results = rec.results()
    if interrupted:
        results["incomplete"] = True
        results["environment"]["interrupted_by"] = signal.Signals(interrupted[0]).name
    write_json_atomic(out, results)
    s = summary(results)
    logs = out.parent / f"{out.stem}.logs"
    shutil.rmtree(logs, ignore_errors=True)  # an earlier run's logs describe that run, not this one
    if s["bad"] or interrupted:
        shutil.move(str(work), logs)
    else:
        shutil.rmtree(work, ignore_errors=True)
    if not quiet:
        where = f"\nlogs: {logs}" if logs.exists() else ""
        print(f"\n[{target} {device}] {s['text']}\nresults: {out}{where}", file=sys.stderr)
        if s["bad"] and logs.exists() and log_tail:
            print((logs / f"pytest-{attempt}.log").read_text()[-4000:], file=sys.stderr)
    if interrupted:
        print(f"[{target}] stopped by {signal.Signals(interrupted[0]).name}; the finished cases are in {out}",
              file=sys.stderr)
        raise Interrupted(interrupted[0])
    return results


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _watch(proc: subprocess.Popen, journal: Path, timeout: float, label: str, started: float,
           interrupted: list[int], quiet: bool) -> str | None:
    """Wait for the child; None if it exited by itself (or was stopped), else "crashed" or "timeout"."""
    last_size, last_change, last_print = -1, time.time(), 0.0
    while True:
        code = proc.poll()
        if interrupted:
            _kill_group(proc)
            proc.wait()
            return None
        size = journal.stat().st_size if journal.exists() else 0
        now = time.time()
        if size != last_size:
            last_size, last_change = size, now
        if not quiet and (now - last_print > 5 or code is not None):
            _progress(journal, label, now - started)
            last_print = now
        if code is not None:
            return "crashed" if code < 0 or code not in (0, 1, 2, 5) else None
        if now - last_change > timeout:
            _kill_group(proc)
            proc.wait()
            return "timeout"
        time.sleep(0.2)


def _progress(journal: Path, label: str, elapsed: float) -> None:
    events = _read(journal)
    cases = sum(e["event"] == "case" for e in events)
    done = sum(e["event"] == "test_done" for e in events)
    current = next((e["node"] for e in reversed(events) if e["event"] in ("start", "case")), "starting")
    line = f"[{label}] {elapsed:5.0f} s: {done} tests done, {cases} cases; running {current.split('::')[-1]}"
    end = "\r" if sys.stderr.isatty() else "\n"
    print(line[:150].ljust(150) if end == "\r" else line, end=end, file=sys.stderr, flush=True)


def _last_started(events: list[dict]) -> str | None:
    """The key of the last case started without a result after it."""
    for e in reversed(events):
        if e["event"] == "case":
            return None
        if e["event"] == "start":
            return e["key"]
    return None


def summary(results: dict) -> dict:
    """{"text": one line of totals, "bad": whether anything failed, crashed, hung or went stale}."""
    rows = results["rows"]
    tot = {s: sum(r.get(s, 0) for r in rows) for s in ("run", "passed", "failed", "unsupported", "deviation",
                                                        "crashed", "timeout")}
    stale = [d["id"] for d in results["deviations"] if d["status"] == "stale"]
    text = (f"{tot['run']} cases: {tot['passed']} passed, {tot['failed']} failed, {tot['unsupported']} unsupported, "
            f"{tot['deviation']} declared deviations, {tot['crashed']} crashed, {tot['timeout']} timed out")
    if stale:
        text += f"; STALE deviations (declared, no longer reproduced): {', '.join(stale)}"
    if results.get("incomplete"):
        text += " (incomplete: interrupted)"
    bad = bool(tot["failed"] or tot["crashed"] or tot["timeout"] or stale or results.get("incomplete"))
    return {"text": text, "bad": bad, "totals": tot}


def slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


if __name__ == "__main__":
    sys.exit(main())
