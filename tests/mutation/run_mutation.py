"""`nox -s mutation`: cosmic-ray over the reference sdpa and the conventions, on every core.

    python tests/mutation/run_mutation.py [--target reference|conventions|all] [--sample ci]
                                          [--fresh] [--workers N]

Steps, each in build/mutation/:
1. ``pristine/``: a copy of the tree as it is now (tracked and untracked files, no ignored ones).
2. ``w0``, ``w1``, ...: one copy per worker, each with its own install of attnspec in ``site/``
   (``pip install --no-deps --target``) and the unmutated modules in ``pristine/``. cosmic-ray
   mutates files in place, so workers never share a file and never touch the checkout.
3. ``<target>.sqlite``: ``cosmic-ray init`` (kept when it exists, so an interrupted run resumes),
   then the filters: operators we exclude, mutants inside annotations and definitions out of
   scope (filters.py), and with ``--sample ci`` every mutant not in ci_sample.toml.
4. Each worker gets a shard of the session (the same database, the other shards' items marked
   skipped) and runs ``cosmic-ray exec`` with its local distributor, in parallel; the test command
   is check_mutant.py, with cosmic-ray's timeout around it.
5. The shards' results and the workers' logs become reports/results/mutation.json (or
   build/mutation/sample.json for a sample), rendered to reports/mutation.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from filters import CONVENTION_MODULES, TARGETS, apply_filters  # noqa: E402

WORK = REPO / "build" / "mutation"
#: seconds cosmic-ray lets one mutant run before it kills the driver's process group
TIMEOUT = 900.0
COSMIC_RAY = "cosmic-ray"


def tree_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True
    ).stdout.decode()
    return [f for f in out.split("\0") if f and (REPO / f).is_file()]


def copy_tree(dest: Path, files: list[str]) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)


def prepare_worker(w: Path, files: list[str]) -> None:
    """A fresh copy of the tree with its own attnspec in site/, and the pristine modules."""
    copy_tree(w, files)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(w / "site"),
            str(w),
        ],
        check=True,
        cwd=w,
    )
    shutil.rmtree(w / "build", ignore_errors=True)
    (w / "pristine").mkdir()
    shutil.copy2(w / "tests" / "mutation" / "reference_sdpa.py", w / "pristine")
    for m in CONVENTION_MODULES:  # pristine/conventions/__init__.py ...: the worker's paths, unmutated
        (w / "pristine" / m).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(w / "site" / "attnspec" / "backends" / m, w / "pristine" / m)


def config_text(target: str, workdir: Path) -> str:
    paths = ", ".join(f'"{p}"' for p in TARGETS[target]["paths"])
    return (
        "[cosmic-ray]\n"
        f"module-path = [{paths}]\n"
        f"timeout = {TIMEOUT}\n"
        "excluded-modules = []\n"
        f'test-command = "{sys.executable} tests/mutation/check_mutant.py --target {target}"\n'
        'distributor.name = "local"\n'
    )


def shard(db: Path, dest: Path, index: int, count: int) -> None:
    """``dest``: ``db`` with every pending item not of shard ``index`` marked skipped (a result
    already there is kept: it resumes)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    if not dest.exists():
        shutil.copy2(db, dest)
    with use_db(str(dest), WorkDB.Mode.open) as wdb:
        items = sorted(wdb.work_items, key=lambda item: item.job_id)
        done = {job_id for job_id, _ in wdb.results}
        for n, item in enumerate(items):
            if n % count != index and item.job_id not in done:
                wdb.set_result(
                    item.job_id, WorkResult(output="another shard", worker_outcome=WorkerOutcome.SKIPPED)
                )


def rerun_survivors(name: str, count: int) -> int:
    """Forget the results of the surviving mutants of session ``name`` that are listed neither as
    equivalent (it computes the same function whatever the suite is) nor as an open gap (analysed,
    its fix still to come), so the next exec
    judges them again with the suite as it is now; the first time, keep the survivors and the
    totals as the run's "before" (build/mutation/<name>-before.json). Returns how many were reset."""
    import sqlite3

    from results import collect  # type: ignore[import-not-found]

    data = collect({name: WORK / f"{name}.sqlite"}, WORK, None)
    before = WORK / f"{name}-before.json"
    if not before.exists():
        survivors = {m["id"]: m for m in data["mutants"] if m["outcome"].startswith("survived")}
        before.write_text(json.dumps({"totals": data["totals"], "survivors": survivors}, indent=1) + "\n")
    gaps = [(m["id"],) for m in data["mutants"] if m["outcome"] == "survived_gap" and not m.get("open")]
    for i in range(count):
        with sqlite3.connect(WORK / f"{name}-shard{i}.sqlite") as db:
            db.executemany("DELETE FROM work_results WHERE job_id = ? AND test_outcome = 'SURVIVED'", gaps)
    return len(gaps)


def draw_sample(results: Path, size: int = 20, seed: int = 28) -> str:
    """The CI sample: ``size`` killed mutants of a full run, drawn with a fixed seed, spread over
    both targets, their definitions and operator kinds; as ci_sample.toml's text."""
    import random
    from collections import Counter

    from filters import sample_key  # type: ignore[import-not-found]

    data = json.loads(results.read_text())

    def line_of(m: dict) -> str:
        path = "tests/mutation/reference_sdpa.py" if m["target"] == "reference" else m["file"]
        return (WORK / "pristine" / path).read_text().splitlines()[m["line"] - 1]

    def key(m: dict) -> str:
        return sample_key(m["file"], f"core/{m['operator']}", line_of(m), m["col"])

    # a key that names several mutants (the same line in two places) would bring its twins into the
    # sample, equivalent ones included: only mutants their key names alone are drawn
    counts = Counter(key(m) for m in data["mutants"] if m["outcome"] != "skipped")
    killed = [m for m in data["mutants"] if m["outcome"] == "killed" and counts[key(m)] == 1]
    rng = random.Random(seed)
    rng.shuffle(killed)
    picked: list[dict] = []
    want = {"reference": size * 2 // 5, "conventions": size - size * 2 // 5}
    for target, n in want.items():
        seen: set[tuple[str, str]] = set()
        for m in (m for m in killed if m["target"] == target):
            key = (m["definition"], m["operator"].split("_")[0])
            if key not in seen and sum(p["target"] == target for p in picked) < n:
                seen.add(key)
                picked.append(m)
    lines = [
        "# The 20 mutants CI runs (nox -s mutation -- --sample ci): each must be killed. Drawn by",
        "# tests/mutation/run_mutation.py --draw-sample from a full run, then frozen. A mutant is named",
        "# by its file, operator, the source line it changes and the column on that line.",
        "",
    ]
    for m in sorted(picked, key=lambda m: (m["file"], m["line"], m["col"])):
        source = (
            (
                WORK
                / "pristine"
                / ("tests/mutation/reference_sdpa.py" if m["target"] == "reference" else m["file"])
            )
            .read_text()
            .splitlines()[m["line"] - 1]
        )
        lines += [
            "[[mutant]]",
            f'file = "{m["file"]}"',
            f'operator = "core/{m["operator"]}"',
            f"line = {json.dumps(source)}",
            f"col = {m['col']}",
            f"# {m['definition']}: {m['why'][:100]}",
            "",
        ]
    return "\n".join(lines)


def run_target(
    target: str, workers: list[Path], sample: str | None, fresh: bool, rerun: bool = False
) -> Path:
    """Run one target's session on the workers; return the merged results' path."""
    name = target if sample is None else f"{target}-sample-{sample}"
    db = WORK / f"{name}.sqlite"
    if rerun and db.exists():
        print(
            f"mutation: {name}: {rerun_survivors(name, len(workers))} survivors to judge again",
            file=sys.stderr,
        )
    if fresh:
        db.unlink(missing_ok=True)
        for w in workers:
            (WORK / f"{name}-shard{workers.index(w)}.sqlite").unlink(missing_ok=True)
    cfg = WORK / f"{name}.toml"
    cfg.write_text(config_text(target, workers[0]))
    if not db.exists():
        subprocess.run([COSMIC_RAY, "init", str(cfg), str(db)], cwd=workers[0], check=True)
        apply_filters(db, target, workers[0], sample)
    if target == "conventions":
        baseline = WORK / "baseline.json"
        if not baseline.exists():
            print("mutation: checking the unmutated conventions (baseline) ...", file=sys.stderr)
            rc = subprocess.run(
                [sys.executable, "tests/mutation/check_mutant.py", "--target", "conventions", "--baseline"],
                cwd=workers[0],
            ).returncode
            if rc:
                raise SystemExit(
                    "mutation: the unmutated conventions do not give the expected verdicts "
                    "(see above); no mutant can be judged"
                )
            shutil.copy2(workers[0] / "baseline.json", baseline)
        for w in workers:
            shutil.copy2(baseline, w / "baseline.json")
    shards = [WORK / f"{name}-shard{i}.sqlite" for i in range(len(workers))]
    for i, s in enumerate(shards):
        shard(db, s, i, len(workers))
    t0 = time.time()
    procs = [subprocess.Popen([COSMIC_RAY, "exec", str(cfg), str(s)], cwd=w) for s, w in zip(shards, workers)]
    codes = [p.wait() for p in procs]
    elapsed = time.time() - t0
    if any(codes):
        raise SystemExit(f"mutation: cosmic-ray exec exited with {codes}")
    log = WORK / f"{name}-log.jsonl"
    with open(log, "a") as out:
        for w in workers:
            wlog = w / "mutation-log.jsonl"
            if wlog.exists():
                out.write(wlog.read_text())
                wlog.unlink()
    elapsed_file = WORK / f"{name}-elapsed.json"
    before = json.loads(elapsed_file.read_text())["elapsed_s"] if elapsed_file.exists() and not fresh else 0.0
    elapsed_file.write_text(json.dumps({"elapsed_s": before + elapsed}))
    return db


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="cosmic-ray over the reference sdpa and the conventions")
    ap.add_argument("--target", choices=("reference", "conventions", "all"), default="all")
    ap.add_argument(
        "--sample",
        choices=("ci",),
        default=None,
        help="only the mutants of tests/mutation/ci_sample.toml; each must be killed",
    )
    ap.add_argument("--fresh", action="store_true", help="start over instead of resuming")
    ap.add_argument(
        "--rerun-survivors",
        action="store_true",
        help="judge the surviving mutants listed neither as equivalent nor as open gaps again, with the "
        "suite as it is now (after closing gaps)",
    )
    ap.add_argument(
        "--draw-sample",
        action="store_true",
        help="write tests/mutation/ci_sample.toml from reports/results/mutation.json and stop",
    )
    ap.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    args = ap.parse_args(argv)
    from results import collect, write_results  # type: ignore[import-not-found]

    if args.draw_sample:
        (HERE / "ci_sample.toml").write_text(draw_sample(REPO / "reports" / "results" / "mutation.json"))
        return 0
    WORK.mkdir(parents=True, exist_ok=True)
    files = tree_files()
    copy_tree(WORK / "pristine", files)
    workers = [WORK / f"w{i}" for i in range(args.workers)]
    for w in workers:  # always fresh: a worker killed mid-mutant leaves its mutant in its copy
        prepare_worker(w, files)
    targets = ["reference", "conventions"] if args.target == "all" else [args.target]
    sessions = {
        t: run_target(t, workers, args.sample, args.fresh or bool(args.sample), args.rerun_survivors)
        for t in targets
    }
    if not args.sample:  # the report covers every target run so far, not only this call's
        sessions = {
            t: WORK / f"{t}.sqlite" for t in ("reference", "conventions") if (WORK / f"{t}.sqlite").exists()
        }
    data = collect(sessions, WORK, args.sample)
    data["workers"] = len(workers)
    path = write_results(data, REPO, args.sample)
    if not args.sample:  # the page, whatever the verdict: the gaps are what it is for
        subprocess.run(
            [
                sys.executable,
                "-m",
                "attnspec.reports.mutation",
                str(path),
                str(REPO / "reports" / "mutation.md"),
            ],
            check=True,
        )
    t = data["totals"]
    print(
        f"mutation: {t['generated']} mutants, {t['run']} run: {t['killed']} killed, {t['timed_out']} timed out, "
        f"{t['survived_equivalent']} equivalent, {t['survived_gap']} gaps; score {t['score']:.4f}; "
        f"results {path}",
        file=sys.stderr,
    )
    if args.sample and (t["survived_gap"] or t["survived_equivalent"]):
        print(
            "mutation: a mutant of the CI sample survived: the suite or the machinery has rotted",
            file=sys.stderr,
        )
        return 1
    return 1 if t["survived_gap"] else 0


if __name__ == "__main__":
    sys.exit(main())
