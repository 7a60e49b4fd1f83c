"""Crash-isolating runner: ``python -m attnspec.conformance.run --backend NAME``.

Runs the suite in child pytest processes (``--jobs``, default one per core up to 2, each on a
round-robin share of the tests) that journal every case before calling the backend. If a child
dies (segfault, abort) or stops making progress for ``--case-timeout`` seconds, the case it was on
is recorded as crashed / timed out and that child is restarted, skipping that case and every test
that already finished. The results JSON is rebuilt from the journal, so nothing
that ran is lost. Prints progress (tests done, cases run, what is running, elapsed) to stderr.

Ctrl-C (SIGINT) or SIGTERM stops every child's whole process group, writes the results of the
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
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from attnspec.conformance.profiles import DEFAULT_PROFILE, PROFILES
from attnspec.conformance.pytest_helpers import resolve_backend
from attnspec.conformance.recorder import Recorder
from attnspec.journal import read_journal as _read
from attnspec.results import write_json_atomic

MAX_RESTARTS = 20
#: seconds a child may take to journal its first event (imports, collection) before it counts as hung
STARTUP_TIMEOUT = 180.0


class ChildSetupError(Exception):
    """The suite's child processes cannot run at all (attnspec does not import in them, pytest
    refuses its arguments): one line naming the cause, the children's logs kept."""


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: the suite's children run quiet, with no cache, and without the numerics' own warnings
QUIET = ["-q", "-p", "no:cacheprovider", "-W", "ignore::RuntimeWarning", "-W", "ignore::DeprecationWarning"]


def suite_arguments(target: str, profile: str, pytest_args: Sequence[str] = ()) -> list[str]:
    """pytest's arguments for one run of the suite on ``target`` in ``profile`` (`QUIET`),
    ``pytest_args`` (-k, -x, ...) after them."""
    chosen = ["--attn-backend", target, "--attn-profile", profile]
    return ["--pyargs", "attnspec.conformance", *chosen, *QUIET, *pytest_args]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnspec.conformance.run", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--backend", required=True, help="registered backend name, module:Class or module:function@convention"
    )
    ap.add_argument("--device", default=None, help="device (default: the backend's first)")
    ap.add_argument(
        "--profile", default=os.environ.get("ATTNSPEC_PROFILE", DEFAULT_PROFILE), choices=PROFILES
    )
    ap.add_argument(
        "--out",
        default=None,
        help="results JSON (default reports/results/conformance-<backend>-<device>.json)",
    )
    ap.add_argument(
        "--case-timeout",
        type=float,
        default=300.0,
        help="seconds without progress before a case counts as hung",
    )
    ap.add_argument(
        "--timings",
        default=None,
        help="directory for the run's suite_timing file (default: <results dir>/suite-timings)",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="child processes run at once, each on a round-robin share of the tests "
        "(default: ATTNSPEC_JOBS, else min(2, cores))",
    )
    ap.epilog = "Any other option (-k EXPR, -x, --maxfail N, ...) goes to pytest as it is."
    args, pytest_args = ap.parse_known_args(argv)
    pytest_args = [a for a in pytest_args if a != "--"]
    backend = resolve_backend(args.backend)
    device = args.device or backend.devices()[0]
    out = Path(args.out or f"reports/results/conformance-{slug(args.backend, 100)}-{slug(device)}.json")
    try:
        results = run_suite(
            args.backend,
            backend,
            device,
            args.profile,
            out,
            args.case_timeout,
            pytest_args,
            device_given=args.device is not None,
            jobs=args.jobs,
            timings=Path(args.timings) if args.timings else None,
        )
    except Interrupted as e:
        return 128 + e.signum
    except ChildSetupError as e:
        print(f"[{args.backend}] {e}", file=sys.stderr)
        return 2
    return 1 if summary(results)["bad"] else 0


def default_jobs() -> int:
    """Children run at once: ``ATTNSPEC_JOBS``, else one per core up to 2 (the suite's cost is one
    core per child: CPU kernels here are small, and XLA compiles on one thread)."""
    env = os.environ.get("ATTNSPEC_JOBS")
    if env:
        if not env.isdigit() or int(env) < 1:
            raise SystemExit(f"ATTNSPEC_JOBS={env!r}: expected an integer >= 1")
        return int(env)
    return max(1, min(2, os.cpu_count() or 1))


def run_suite(
    target: str,
    backend,
    device: str,
    profile: str,
    out: Path,
    case_timeout: float = 300.0,
    pytest_args: list[str] | None = None,
    *,
    device_given: bool = True,
    env: dict[str, str] | None = None,
    quiet: bool = False,
    log_tail: bool = True,
    jobs: int | None = None,
    timings: Path | None = None,
) -> dict:
    """Run the suite on ``target`` with crash isolation; write and return the results.

    The tests are split round-robin into ``jobs`` shards (``--attn-shard I/N``), each run by its own
    child process with its own journal and restarts, so a crash or hang in one shard costs only
    that case. The derandomized profiles (dev, default, ci) seed Hypothesis per test, so the cases
    drawn do not depend on ``jobs``.

    Raises:
        Interrupted: after SIGINT/SIGTERM, once the children are stopped and the partial results
            (``"incomplete": true``) are written.
    """
    jobs = jobs or default_jobs()
    work = Path(tempfile.mkdtemp(prefix="attnspec-run-"))
    child_env = {**os.environ, **(env or {})}
    try:
        preflight(work, child_env)
    except ChildSetupError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    started = time.time()
    interrupted: list[int] = []
    procs: dict[int, subprocess.Popen] = {}

    def stop(signum, _frame):
        interrupted.append(signum)
        for proc in list(procs.values()):
            if proc.poll() is None:
                _kill_group(proc)

    shards = [_Shard(i, jobs, work) for i in range(jobs)]
    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        # the children run in the empty work folder with a config file of their own: no folder of the
        # user's (a clone named attnspec, a module named like a library) can shadow an installed
        # package, and no pytest configuration of theirs (addopts, plugins) reaches the suite
        (work / "pytest.ini").write_text("[pytest]\n")
        base = [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(work / "pytest.ini"),
            "--import-mode=importlib",
            *suite_arguments(target, profile, pytest_args or []),
        ]
        if device_given:
            base += ["--attn-device", device]
        label = f"{target} {device}"
        threads = [
            threading.Thread(
                target=shard.run, args=(base, env, procs, case_timeout, label, interrupted), daemon=True
            )
            for shard in shards
        ]
        for t in threads:
            t.start()
        last_print = 0.0
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.2)  # short joins: the main thread must stay free to take signals
            if not quiet and (time.time() - last_print > 5 or not any(t.is_alive() for t in threads)):
                _progress([shard.journal for shard in shards], label, time.time() - started)
                last_print = time.time()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    rec = Recorder(profile)
    rec.backend, rec.backend_name, rec.device, rec.started = backend, target, device, started
    events = [e for shard in shards for e in _read(shard.journal)]
    rec.replay(events)
    results = rec.results()
    results["environment"]["jobs"] = jobs
    if interrupted:
        results["incomplete"] = True
        results["environment"]["interrupted_by"] = signal.Signals(interrupted[0]).name
    write_json_atomic(out, results)
    _write_timing(
        timings or out.parent / "suite-timings",
        target,
        device,
        profile,
        pytest_args or [],
        jobs,
        results,
        sum(e["event"] == "test_done" for e in events),
    )
    s = summary(results)
    logs = out.parent / f"{out.stem}.logs"
    shutil.rmtree(logs, ignore_errors=True)  # an earlier run's logs describe that run, not this one
    abnormal = [(shard, code) for shard in shards for code in shard.codes if code not in (0, 1)]
    ran_nothing = not any(e["event"] == "case" for e in events)
    if s["bad"] or interrupted or abnormal or ran_nothing:  # a child that failed: its logs are the evidence
        shutil.move(str(work), logs)
    else:
        shutil.rmtree(work, ignore_errors=True)
    if not quiet:
        where = f"\nlogs: {logs}" if logs.exists() else ""
        print(f"\n[{target} {device}] {s['text']}\nresults: {out}{where}", file=sys.stderr)
        if s["bad"] and logs.exists() and log_tail:
            for shard in shards:
                log = logs / shard.log_name(shard.attempt)
                if log.exists():
                    print(log.read_text()[-4000 // jobs :], file=sys.stderr)
    if interrupted:
        print(
            f"[{target}] stopped by {signal.Signals(interrupted[0]).name}; the finished cases are in {out}",
            file=sys.stderr,
        )
        raise Interrupted(interrupted[0])
    if ran_nothing and abnormal:
        shard, code = abnormal[0]
        raise ChildSetupError(
            f"the suite's pytest child exited with {code} before any case ran: "
            f"{_last_error(logs / shard.log_name(shard.attempt))} (logs: {logs})"
        )
    return results


def preflight(work: Path, env: dict[str, str]) -> None:
    """Check that a child started as the suite's children are (same interpreter, folder and
    environment) imports this attnspec, not a folder or module that shadows it.

    Raises:
        ChildSetupError: it does not, with the child's error in one line.
    """
    import attnspec

    here = str(Path(attnspec.__file__).resolve())
    code = (
        "import attnspec, pathlib; from attnspec.conformance import conftest; "
        "print(pathlib.Path(attnspec.__file__).resolve())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 0:
        raise ChildSetupError(
            "attnspec does not import in the suite's child process: "
            + (lines[-1] if lines else f"exit status {proc.returncode}")
        )
    found = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "?"
    if found != here:
        raise ChildSetupError(
            f"the suite's child process imports attnspec from {found}, not {here} "
            "(PYTHONPATH puts another copy first)"
        )


def _last_error(log: Path) -> str:
    """The line of a child's log that says why it stopped (an exception or pytest's ERROR)."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    for line in reversed(lines):
        if line.startswith(("E   ", "ERROR", "ImportError", "ModuleNotFoundError")) or "Error:" in line:
            return line.removeprefix("E   ").strip()
    return lines[-1] if lines else "empty log"


def _write_timing(
    directory: Path,
    target: str,
    device: str,
    profile: str,
    pytest_args: list[str],
    jobs: int,
    results: dict,
    tests: int,
) -> None:
    """One `attnspec.suite_timing/1` file per backend, device, profile and selection (reports/SCHEMA.md)."""
    env = results["environment"]
    selection = " ".join(pytest_args)
    name = "-".join(filter(None, [slug(target, 100), slug(device), profile, slug(selection, 60)]))
    write_json_atomic(
        directory / f"{name}.json",
        {
            "schema": "attnspec.suite_timing/1",
            "backend": target,
            "device": device,
            "profile": profile,
            "selection": selection,
            "jobs": jobs,
            "tests": tests,
            "cases": sum(r["run"] for r in results["rows"]),
            "seconds": env["elapsed_s"],
            "first_result_s": env.get("first_result_s"),
            "incomplete": bool(results.get("incomplete")),
            "date": env.get("date", ""),
            "git_commit": env.get("git_commit"),
        },
    )


class _Shard:
    """One child's share of the tests: its journal, its skip list and its restart loop."""

    def __init__(self, index: int, count: int, work: Path) -> None:
        self.index, self.count = index, count
        self.journal = work / f"journal-{index}.jsonl"
        self.skipfile = work / f"skip-{index}.json"
        self.work = work
        self.attempt = 0
        #: each child's exit status (None: killed after a crash or hang)
        self.codes: list[int | None] = []

    def log_name(self, attempt: int) -> str:
        return f"pytest-{attempt}.log" if self.count == 1 else f"pytest-shard{self.index}-{attempt}.log"

    def run(
        self, base: list[str], env, procs: dict, case_timeout: float, label: str, interrupted: list[int]
    ) -> None:
        skips: dict[str, dict[str, str]] = {}
        finished: set[str] = set()
        if self.count > 1:
            label = f"{label} [{self.index + 1}/{self.count}]"
        for self.attempt in range(MAX_RESTARTS + 1):
            self.skipfile.write_text(json.dumps(skips))
            cmd = [*base, "--attn-journal", str(self.journal)]
            if self.count > 1:
                cmd += ["--attn-shard", f"{self.index}/{self.count}"]
            for node in sorted(finished):
                cmd += ["--deselect", node]
            child_env = {**os.environ, **(env or {}), "ATTNSPEC_SKIP_CASES": str(self.skipfile)}
            if interrupted:
                return
            with open(self.work / self.log_name(self.attempt), "w") as log:
                proc = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    start_new_session=True,
                    cwd=self.work,
                )
                procs[self.index] = proc
                if interrupted:  # the signal came between the check above and Popen
                    _kill_group(proc)
                status = _watch(proc, self.journal, case_timeout, interrupted)
                self.codes.append(proc.returncode if status is None else None)
            events = _read(self.journal)
            finished = {e["node"] for e in events if e["event"] == "test_done"}
            if status is None or interrupted:
                return
            key = _last_started(events)
            print(
                f"\n[{label}] child {status} (attempt {self.attempt}); case {key} recorded as {status}",
                file=sys.stderr,
            )
            if key is None or key in skips:
                print(f"[{label}] cannot isolate the failing case", file=sys.stderr)
                return
            lost = [e for e in events if e["event"] == "device_lost" and e["key"] == key]
            message = (
                f"{lost[-1]['message']} (the device was lost; the process restarted)"
                if lost
                else f"{status} in an earlier attempt"
            )
            skips[key] = {"status": "crashed" if lost else status, "message": message}
            # drop the unfinished test's partial cases: it reruns from its start
            events = [e for e in events if e["event"] == "start" or e["node"] in finished]
            self.journal.write_text("".join(json.dumps(e) + "\n" for e in events))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _watch(proc: subprocess.Popen, journal: Path, timeout: float, interrupted: list[int]) -> str | None:
    """Wait for the child; None if it exited by itself (or was stopped), else "crashed" or "timeout"."""
    last_size, last_change = -1, time.time()
    # a restarted child finds the journal its predecessor wrote: it has started once it adds to it
    baseline = journal.stat().st_size if journal.exists() else 0
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
        if code is not None:
            return "crashed" if code < 0 or code not in (0, 1, 2, 5) else None
        # before its first journal line the child is importing and collecting, which takes longer
        # than a case may (two children importing torch on a busy machine: > 4 s); a restarted
        # child too, or its import would be taken for a hang of the case that crashed before it
        if now - last_change > (timeout if size > baseline else max(timeout, STARTUP_TIMEOUT)):
            _kill_group(proc)
            proc.wait()
            return "timeout"
        time.sleep(0.2)


def _progress(journals: list[Path], label: str, elapsed: float) -> None:
    cases = done = 0
    running = []
    for journal in journals:
        events = _read(journal)
        cases += sum(e["event"] == "case" for e in events)
        done += sum(e["event"] == "test_done" for e in events)
        running.append(
            next((e["node"] for e in reversed(events) if e["event"] in ("start", "case")), "starting")
        )
    now = ", ".join(node.split("::")[-1] for node in running)
    line = f"[{label}] {elapsed:5.0f} s: {done} tests done, {cases} cases; running {now}"
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
    tot = {
        s: sum(r.get(s, 0) for r in rows)
        for s in ("run", "passed", "failed", "unsupported", "deviation", "crashed", "timeout")
    }
    stale = [d["id"] for d in results["deviations"] if d["status"] == "stale"]
    text = (
        f"{tot['run']} cases: {tot['passed']} passed, {tot['failed']} failed, {tot['unsupported']} unsupported, "
        f"{tot['deviation']} declared deviations, {tot['crashed']} crashed, {tot['timeout']} timed out"
    )
    if stale:
        text += f"; STALE deviations (declared, no longer reproduced): {', '.join(stale)}"
    errors = results.get("suite_errors", [])
    if errors:
        text += (
            f"; {len(errors)} properties stopped on an error of the suite itself, no case of theirs "
            f"failing (a bug of attnspec: the logs have the traceback): {', '.join(errors[:3])}"
        )
    if results.get("incomplete"):
        text += " (incomplete: interrupted)"
    bad = bool(
        tot["failed"] or tot["crashed"] or tot["timeout"] or stale or errors or results.get("incomplete")
    )
    return {"text": text, "bad": bad, "totals": tot}


def slug(s: str, limit: int | None = None) -> str:
    """``s`` as a file-name part; past ``limit`` characters, its start and a hash of the whole (a
    target named by a long path would otherwise pass the file system's 255-byte name limit, and a
    plain cut would give two targets the same name)."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in s)
    if limit is None or len(name) <= limit:
        return name
    import hashlib

    return f"{name[: limit - 9]}-{hashlib.sha256(s.encode()).hexdigest()[:8]}"


if __name__ == "__main__":
    sys.exit(main())
