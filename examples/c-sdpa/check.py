"""Build attnspec_sdpa and its -1e9 twin, export sdpa vectors, run both, verify both.

    python examples/c-sdpa/check.py --work build/c-sdpa --dtype float32 --dtype float64

The one copy of the check that ``nox -s vectors_c`` and ``tests/test_vectors_c.py`` run:

1. build both binaries from this folder with the C compiler ($CC, else ``cc``) and
   ``-std=c99 -O2 -Wall -Wextra -pedantic -Werror`` into WORK/bin;
2. ``attnspec vectors export`` (profile, the sdpa, sdpa_serving and sdpa_paged families, the
   dtypes) into WORK/vectors: the C computes sdpa's and the serving cases and declares the paged
   layout's unsupported from the manifest;
3. run each binary on every exported bundle, into WORK/outputs and WORK/outputs-fill;
4. ``attnspec vectors verify``: the correct build must exit 0 and print CONFORMS; the twin must
   exit 1 and name the clause ``sdpa.empty_row``.

Prints each step's time and the verdicts' last lines; exits 0 when all of that holds, 1 otherwise.
Needs only the standard library and an installed attnspec (run as ``python -m attnspec``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("sdpa.c", "safetensors.c", "json.c")
CFLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-pedantic", "-Werror")
BINARIES = {"attnspec_sdpa": (), "attnspec_sdpa_fill_minus_1e9": ("-DATTNSPEC_FILL_MINUS_1E9",)}
#: the bundle families exported: all of function sdpa
FAMILIES = ("sdpa", "sdpa_serving", "sdpa_paged")


def _run(cmd: list[str], timings: dict[str, float], step: str) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``, adding its wall time to ``timings[step]``; output captured, never raising."""
    print("$", shlex.join(cmd), flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    timings[step] = timings.get(step, 0.0) + time.perf_counter() - start
    return proc


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def check(
    work: Path, dtypes: list[str], profile: str = "dev", cc: str | None = None
) -> tuple[bool, dict[str, float]]:
    """Steps 1-4 in ``work`` (emptied first); (everything held, seconds per step)."""
    cc = cc or os.environ.get("CC", "cc")
    attnspec = [sys.executable, "-m", "attnspec"]
    timings: dict[str, float] = {}
    problems: list[str] = []
    shutil.rmtree(work, ignore_errors=True)
    (work / "bin").mkdir(parents=True)

    for name, defines in BINARIES.items():
        proc = _run(
            [cc, *CFLAGS, *defines, "-o", str(work / "bin" / name), *(str(HERE / s) for s in SOURCES), "-lm"],
            timings,
            "build",
        )
        if proc.returncode:
            print(proc.stdout + proc.stderr)
            return False, timings

    vectors = work / "vectors"
    proc = _run(
        [
            *attnspec,
            "vectors",
            "export",
            "--out",
            str(vectors),
            "--profile",
            profile,
            *(a for f in FAMILIES for a in ("--function", f)),
            *(a for d in dtypes for a in ("--dtype", d)),
        ],
        timings,
        "export",
    )
    print(_tail(proc.stdout + proc.stderr, 2 + len(FAMILIES) * len(dtypes)))
    if proc.returncode:
        return False, timings
    bundles = [
        vectors / b["path"]
        for b in json.loads((vectors / "index.json").read_text())["bundles"]
        if b["function"] == "sdpa"
    ]
    if len(bundles) != len(FAMILIES) * len(dtypes):
        print(f"expected {len(FAMILIES) * len(dtypes)} sdpa bundles, the export wrote {len(bundles)}")
        return False, timings

    verdicts = {}
    for name, outputs, step in (
        ("attnspec_sdpa", "outputs", "c run"),
        ("attnspec_sdpa_fill_minus_1e9", "outputs-fill", "c run (twin)"),
    ):
        (work / outputs).mkdir()
        for bundle in bundles:
            proc = _run([str(work / "bin" / name), str(bundle), str(work / outputs)], timings, step)
            print(_tail(proc.stdout, 1))
            if proc.returncode:
                print(_tail(proc.stderr, 20))
                problems.append(f"{name} exited {proc.returncode} on {bundle.name}")
        verify_step = "verify" if outputs == "outputs" else "verify (twin)"
        proc = _run(
            [
                *attnspec,
                "vectors",
                "verify",
                str(vectors),
                str(work / outputs),
                "--name",
                name.replace("_", "-"),
                "--out",
                str(work / f"report-{outputs}"),
            ],
            timings,
            verify_step,
        )
        verdicts[name] = proc
        print(_tail(proc.stdout + proc.stderr, 4 + len(FAMILIES) * len(dtypes)))

    good, twin = verdicts["attnspec_sdpa"], verdicts["attnspec_sdpa_fill_minus_1e9"]
    good_text, twin_text = good.stdout + good.stderr, twin.stdout + twin.stderr
    if good.returncode != 0 or "CONFORMS" not in good_text:
        problems.append(f"attnspec_sdpa: verify exited {good.returncode} without CONFORMS")
    if twin.returncode != 1:
        problems.append(f"the -1e9 twin: verify exited {twin.returncode}, expected 1 (FAILS)")
    named = [line for line in twin_text.splitlines() if "sdpa.empty_row" in line]
    if named:
        print("the twin's first failure naming sdpa.empty_row:\n" + named[0])
    else:
        problems.append("the -1e9 twin: verify's output does not name sdpa.empty_row")

    print("timings: " + ", ".join(f"{step} {seconds:.2f} s" for step, seconds in timings.items()))
    for p in problems:
        print("PROBLEM:", p)
    print("vectors_c: OK" if not problems else "vectors_c: FAILED")
    return not problems, timings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("build/c-sdpa"), help="build folder (emptied first)")
    ap.add_argument(
        "--dtype",
        action="append",
        choices=("float16", "bfloat16", "float32", "float64"),
        help="repeatable; default all four",
    )
    ap.add_argument("--profile", default="dev")
    ap.add_argument("--cc", default=None, help="the C compiler (default $CC, else cc)")
    args = ap.parse_args(argv)
    ok, _ = check(
        args.work, args.dtype or ["float16", "bfloat16", "float32", "float64"], args.profile, args.cc
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
