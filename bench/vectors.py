"""Conformance vector bundles as a benchmark (#26): their size, export time and verify throughput.

    python -m attnspec.bench.vectors [--profiles dev,default] [--repeats 5]

For each profile, in one run and one temporary folder: `vectors.export` of the sdpa bundles for
all four dtypes (wall time; size = every file written, index and schemas included, in MB of 10^6
bytes); the numpy backend's outputs for them (`vectors.run`); then, after one warm-up, verify
timed ``repeats`` times: `vectors.load` (the manifest's schema and content hash, every case file's
size and SHA-256) and `vectors.verify` (each output read and judged), which is what ``attnspec
vectors verify`` does before it writes and renders its report. Throughput is cases over the
median of those times. `TARGETS` states the goals; ``python -m attnspec.bench.run --backend numpy
--targets-only`` (part of a plain ``nox -s bench``) runs this and records the figures under
``"vectors"`` and the targets beside the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnspec.bench.targets import _verdict

__all__ = ["BACKEND", "PROFILES", "TARGETS", "measure", "run_vectors", "targets"]

#: the backend whose outputs are verified (and whose --targets-only run includes this benchmark)
BACKEND = "numpy"
FUNCTION = "sdpa"
PROFILES = ("dev", "default")
#: figure -> (goal, higher is better, unit, what)
TARGETS: dict[str, tuple[float, bool, str, str]] = {
    "size_mb": (25.0, False, " MB", "sdpa bundles, 4 dtypes, at most 25 MB"),
    "export_s": (60.0, False, " s", "export of the 4 sdpa bundles in at most 60 s"),
    "verify_cases_per_s": (2000.0, True, " cases/s", "verify of numpy's outputs at least 2000 cases/s"),
}
DEFINITIONS = {
    "size_mb": "every file export writes (cases, manifests, schemas, index), in 10^6 bytes",
    "export_s": "wall time of attnspec.conformance.vectors.export for the profile, 4 dtypes",
    "verify_s": "median wall time of vectors.load (schema, hashes) + vectors.verify (read and judge "
    "every output), after one warm-up; the report rendering is not included",
    "verify_cases_per_s": "cases / verify_s",
}


def measure(
    profile: str, root: Path, repeats: int = 5, say: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """The figures of one profile's bundles, written under ``root``."""
    import attnspec.backends as ab
    from attnspec.conformance import vectors
    from attnspec.spec.dtypes import FLOAT_DTYPES

    bundles, outputs = root / f"{profile}-bundles", root / f"{profile}-outputs"
    t0 = time.perf_counter()
    paths = vectors.export(bundles, profile, [FUNCTION], FLOAT_DTYPES)
    export_s = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in bundles.rglob("*") if p.is_file())
    loaded = vectors.load(bundles)
    cases = sum(len(b.cases) for b in loaded)
    say(f"vectors {profile}: {len(paths)} bundles, {cases} cases, {size / 1e6:.2f} MB in {export_s:.2f} s")
    t0 = time.perf_counter()
    counts = vectors.run(ab.load(BACKEND), loaded, outputs)
    run_s = time.perf_counter() - t0
    times, results = [], {}
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        results = vectors.verify(vectors.load(bundles), outputs, BACKEND)
        if i:  # the first is the warm-up (imports, caches)
            times.append(time.perf_counter() - t0)
    verify_s = statistics.median(times)
    judged = {k: sum(b[k] for b in results["vectors"]["bundles"]) for k in ("passed", "failed", "not_run")}
    say(
        f"  verify of {BACKEND}'s outputs: {verify_s:.3f} s (median of {repeats}, "
        f"{min(times):.3f} - {max(times):.3f}), {cases / verify_s:.0f} cases/s; "
        f"{judged['passed']} passed, {judged['failed']} failed"
    )
    return {
        "profile": profile,
        "function": FUNCTION,
        "dtypes": list(FLOAT_DTYPES),
        "bundles": len(paths),
        "cases": cases,
        "size_bytes": size,
        "size_mb": size / 1e6,
        "export_s": export_s,
        "run_s": run_s,
        "outputs_written": counts["written"],
        "verify_s": verify_s,
        "verify_min_s": min(times),
        "verify_max_s": max(times),
        "verify_repeats": repeats,
        "verify_cases_per_s": cases / verify_s,
        **judged,
    }


def targets(figures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets of each profile measured: name, value, target, met, detail."""
    out = []
    for f in figures:
        for key, (goal, higher, unit, what) in TARGETS.items():
            met, verdict = _verdict(f[key], goal, higher, unit)
            detail = (
                f"{verdict}; {f['bundles']} bundles, {f['cases']} cases; {f['size_mb']:.2f} MB, export "
                f"{f['export_s']:.2f} s, verify {f['verify_s']:.3f} s ({f['verify_cases_per_s']:.0f} cases/s)"
            )
            out.append(
                {
                    "name": f"vectors {f['profile']}: {what}",
                    "value": f[key],
                    "target": goal,
                    "met": met,
                    "detail": detail,
                }
            )
    return out


def run_vectors(
    profiles: tuple[str, ...] = PROFILES, repeats: int = 5, log: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """{"figures": one per profile, "definitions", "targets"}; a profile that cannot be measured
    (the conformance extra missing, an error) gives its targets ``met: None`` with the reason."""
    say = log or (lambda _: None)
    figures, failed = [], []
    with tempfile.TemporaryDirectory(prefix="attnspec-bench-vectors-") as tmp:
        for profile in profiles:
            try:
                figures.append(measure(profile, Path(tmp), repeats, say))
            except Exception as exc:  # e.g. hypothesis not installed: the bench run goes on
                why = f"not measured: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                say(f"vectors {profile}: {why}")
                failed += [
                    {
                        "name": f"vectors {profile}: {what}",
                        "value": None,
                        "target": goal,
                        "met": None,
                        "detail": why,
                    }
                    for goal, _, _, what in TARGETS.values()
                ]
    return {"definitions": DEFINITIONS, "figures": figures, "targets": targets(figures) + failed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnspec.bench.vectors", description=__doc__.split("\n")[0])
    ap.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated (default dev,default)")
    ap.add_argument("--repeats", type=int, default=5, help="timed verify runs after the warm-up")
    args = ap.parse_args(argv)
    doc = run_vectors(tuple(args.profiles.split(",")), args.repeats, log=lambda m: print(m, file=sys.stderr))
    for t in doc["targets"]:
        print(f"target {t['name']}: {t['detail']}", file=sys.stderr)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
