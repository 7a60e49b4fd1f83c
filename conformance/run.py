"""Crash-isolating runner: ``python -m attnspec.conformance.run --backend NAME``.

Runs the suite in a child pytest process that journals every case before calling the backend.
If the child dies (segfault, abort) or stops making progress for ``--case-timeout`` seconds, the
case it was on is recorded as crashed / timed out and the child is restarted, skipping that case
and every test that already finished. The results JSON is rebuilt from the journal, so nothing
that ran is lost. Prints progress (tests done, cases run, what is running) to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnspec.conformance.pytest_helpers import resolve_backend
from attnspec.conformance.recorder import Recorder
from attnspec.reports._io import write_json_atomic

MAX_RESTARTS = 20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnspec.conformance.run", description=__doc__.splitlines()[0])
    ap.add_argument("--backend", required=True, help="registered backend name or module:attribute")
    ap.add_argument("--device", default=None, help="device (default: the backend's first)")
    ap.add_argument("--profile", default=os.environ.get("ATTNSPEC_PROFILE", "ci"), choices=("dev", "ci", "thorough"))
    ap.add_argument("--out", default=None, help="results JSON (default reports/results/conformance-<backend>-<device>.json)")
    ap.add_argument("--case-timeout", type=float, default=300.0, help="seconds without progress before a case counts as hung")
    ap.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    args = ap.parse_args(argv)

    backend = resolve_backend(args.backend)
    device = args.device or backend.devices()[0]
    out = Path(args.out or f"reports/results/conformance-{_slug(args.backend)}-{_slug(device)}.json")
    work = Path(tempfile.mkdtemp(prefix="attnspec-run-"))
    journal, skipfile = work / "journal.jsonl", work / "skip.json"
    skips: dict[str, str] = {}
    finished: set[str] = set()
    started = time.time()
    for attempt in range(MAX_RESTARTS + 1):
        skipfile.write_text(json.dumps(skips))
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "attnspec.conformance", "--attn-backend", args.backend,
               "--attn-profile", args.profile, "--attn-journal", str(journal), "-q", "-p", "no:cacheprovider",
               "-W", "ignore::RuntimeWarning", "-W", "ignore::DeprecationWarning", *args.pytest_args]
        if args.device:
            cmd += ["--attn-device", args.device]
        for node in sorted(finished):
            cmd += ["--deselect", node]
        env = {**os.environ, "ATTNSPEC_SKIP_CASES": str(skipfile)}
        log = open(work / f"pytest-{attempt}.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        status = _watch(proc, journal, args.case_timeout, f"{args.backend} {device}")
        log.close()
        events = _read(journal)
        finished = {e["node"] for e in events if e["event"] == "test_done"}
        if status is None:
            break
        key = _last_started(events)
        print(f"\n[{args.backend}] child {status} (attempt {attempt}); case {key} recorded as {status}",
              file=sys.stderr)
        if key is None or key in skips:
            print(f"[{args.backend}] cannot isolate the failing case; see {work}", file=sys.stderr)
            break
        skips[key] = status
        # drop the unfinished test's partial cases: it reruns from its start
        events = [e for e in events if e["event"] == "start" or e["node"] in finished]
        journal.write_text("".join(json.dumps(e) + "\n" for e in events))
    rec = Recorder(args.profile)
    rec.backend, rec.backend_name, rec.device, rec.started = backend, args.backend, device, started
    rec.replay(_read(journal))
    results = rec.results()
    write_json_atomic(out, results)
    summary = _summary(results)
    print(f"\n[{args.backend} {device}] {summary['text']}\nresults: {out}\nlogs: {work}", file=sys.stderr)
    if summary["bad"]:
        tail = (work / f"pytest-{attempt}.log").read_text()[-4000:]
        print(tail, file=sys.stderr)
    return 1 if summary["bad"] else 0


def _watch(proc: subprocess.Popen, journal: Path, timeout: float, label: str) -> str | None:
    """Wait for the child; None if it exited by itself, else "crashed" or "timeout"."""
    last_size, last_change, last_print = -1, time.time(), 0.0
    while True:
        code = proc.poll()
        size = journal.stat().st_size if journal.exists() else 0
        now = time.time()
        if size != last_size:
            last_size, last_change = size, now
        if now - last_print > 5 or code is not None:
            _progress(journal, label)
            last_print = now
        if code is not None:
            return "crashed" if code < 0 or code not in (0, 1, 2, 5) else None
        if now - last_change > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout"
        time.sleep(0.5)


def _progress(journal: Path, label: str) -> None:
    events = _read(journal)
    cases = sum(e["event"] == "case" for e in events)
    done = sum(e["event"] == "test_done" for e in events)
    current = next((e["node"] for e in reversed(events) if e["event"] in ("start", "case")), "starting")
    line = f"[{label}] {done} tests done, {cases} cases; running {current.split('::')[-1]}"
    end = "\r" if sys.stderr.isatty() else "\n"
    print(line[:150].ljust(150) if end == "\r" else line, end=end, file=sys.stderr, flush=True)


def _read(journal: Path) -> list[dict]:
    if not journal.exists():
        return []
    events = []
    for line in journal.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by the crash
    return events


def _last_started(events: list[dict]) -> str | None:
    """The key of the last case started without a result after it."""
    for e in reversed(events):
        if e["event"] == "case":
            return None
        if e["event"] == "start":
            return e["key"]
    return None


def _summary(results: dict) -> dict:
    rows = results["rows"]
    tot = {s: sum(r[s] for r in rows) for s in ("run", "passed", "failed", "unsupported", "deviation", "crashed", "timeout")}
    stale = [d["id"] for d in results["deviations"] if d["status"] == "stale"]
    text = (f"{tot['run']} cases: {tot['passed']} passed, {tot['failed']} failed, {tot['unsupported']} unsupported, "
            f"{tot['deviation']} declared deviations, {tot['crashed']} crashed, {tot['timeout']} timed out")
    if stale:
        text += f"; STALE deviations (declared, no longer reproduced): {', '.join(stale)}"
    return {"text": text, "bad": bool(tot["failed"] or tot["crashed"] or tot["timeout"] or stale)}


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in s)


if __name__ == "__main__":
    sys.exit(main())
