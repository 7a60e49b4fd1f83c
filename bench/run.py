"""Benchmark one backend on one device and write ``attnspec.bench/1`` JSON (reports/SCHEMA.md).

    python -m attnspec.bench.run --backend torch [--device cpu] [--grid quick|full|lsh]
        [--targets-only] [--out reports/results/bench-torch-cpu.json] [--list]

For every implementation (adapter, native, golden, blocked, lsh: see `grid`), dtype and
shape of the grid: the median, min and max wall time of one forward call over repeats after
warm-up (`measure.time_calls`); the achieved rate; that rate as a share of the same
framework's matmul rate on the same dtype and device, measured in the same run; and the call's
peak memory, measured in a fresh subprocess (`measure`, whose docstring says exactly what
each ``mem_method`` counts).

``tflops`` is dense-equivalent: 4 * B * H * n * m * d forward FLOPs over the median time, for
causal and LSH rows too (which do less work), so it reads as "the rate dense attention would
need to match this time"; ``share_of_matmul`` is that over the matmul TFLOP/s.

Cases are skipped, with the reason recorded under "skipped", when the backend cannot run them,
when their (n, m) logits would not fit in half the memory available at the start of the run,
or when one call is predicted to exceed ``--max-call-s`` (its FLOPs at the efficiency a smaller
case of the same implementation reached in this run; at the matmul rate before there is one).
The "full" grid and ``--targets-only`` also time the target shapes (never skipped for time) and
evaluate `targets.TARGETS`; they appear in no other grid, except that the "lsh" grid (LSH
against full attention as L doubles, B=1 H=1 d=64) holds the LSH target's cases and evaluates it.
``--targets-only`` on numpy also measures the conformance vector bundles (`attnspec.bench.vectors`:
size, export time, verify throughput), recorded under "vectors" and with their targets.

Timings on a machine shared with other work are noise: read ``min_s``/``max_s`` beside the median.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import os
import platform
import re
import sys
import time
from typing import Any, TextIO

from attnspec.bench import targets as bench_targets
from attnspec.bench import vectors as bench_vectors
from attnspec.bench.grid import (
    GRIDS,
    IMPLEMENTATIONS,
    Case,
    default_dtypes,
    estimated_seconds,
    framework_of,
    grid_cases,
    human_bytes,
    human_seconds,
    prepare,
    resolve_backend,
    static_skip,
    workspace_bytes,
)
from attnspec.bench.measure import (
    available_bytes,
    is_cpu,
    jax_device,
    matmul_tflops,
    probe_peak,
    time_calls,
)
from attnspec.errors import SpecError
from attnspec.results import environment, write_json_atomic

__all__ = ["achieved", "main", "run_bench"]

SCHEMA = "attnspec.bench/1"
#: share of the memory available at the start that one materializing call may plan to use
MEMORY_FRACTION = 0.5
#: timed seconds per implementation for a target's cases (at least; --budget-s may raise it)
TARGET_BUDGET_S = 3.0
SETTINGS = {  # per grid: timing budget per case (s), max repeats, max estimated seconds per call
    "quick": {"budget_s": 0.2, "max_repeats": 20, "max_call_s": 10.0},
    "full": {"budget_s": 0.75, "max_repeats": 50, "max_call_s": 30.0},
    "lsh": {"budget_s": 0.5, "max_repeats": 20, "max_call_s": 30.0},
}


def run_bench(
    backend: str,
    device: str | None = None,
    grid: str = "quick",
    *,
    targets_only: bool = False,
    dtypes: tuple[str, ...] | None = None,
    impls: tuple[str, ...] = IMPLEMENTATIONS,
    memory: bool = True,
    budget_s: float | None = None,
    max_repeats: int | None = None,
    max_call_s: float | None = None,
    log: TextIO | None = sys.stderr,
) -> dict[str, Any]:
    """Run the benchmark and return the results document (not written anywhere)."""
    started, load_start = time.time(), _load()
    be = resolve_backend(backend)
    # applied before anything is timed (it may switch TF32 off), and recorded as applied
    policy = be.numerics_policy() if hasattr(be, "numerics_policy") else {}
    device = device or be.devices()[0]
    fw = framework_of(be, device)
    settings = dict(SETTINGS[grid])
    settings.update(
        {
            k: v
            for k, v in (("budget_s", budget_s), ("max_repeats", max_repeats), ("max_call_s", max_call_s))
            if v is not None
        }
    )
    dtypes = tuple(dtypes or default_dtypes(device))
    jobs, target_keys = _jobs(be.name, grid, targets_only, dtypes, impls)
    available = available_bytes(fw, device)
    cap = None if available is None else int(MEMORY_FRACTION * available)
    say = (lambda msg: print(msg, file=log, flush=True)) if log else (lambda msg: None)

    matmul_size = GRIDS["full" if targets_only else grid].matmul_size
    rates: dict[str, float | None] = {}
    for dtype in sorted({c.dtype for job in jobs for c in job}):
        say(f"matmul {dtype} {matmul_size}x{matmul_size} ...")
        try:
            rates[dtype] = matmul_tflops(
                be,
                dtype,
                device,
                matmul_size,
                max(settings["budget_s"], TARGET_BUDGET_S if target_keys else 0),
            )
            say(f"  {rates[dtype]:.3g} TFLOP/s")
        except Exception as exc:  # an unsupported dtype; its rows then have no share
            rates[dtype] = None
            say(f"  failed: {type(exc).__name__}: {exc}")

    rows: list[dict[str, Any]] = []
    skipped: dict[tuple, tuple[Case, str]] = {}
    efficiency: dict[tuple, float] = {}  # (impl, dtype, causal) -> latest share_of_matmul
    interrupted = False
    for i, job in enumerate(jobs, 1):
        if interrupted:
            skipped.update({c.key: (c, "interrupted (Ctrl-C) before it ran") for c in job})
            continue
        say(f"[{i}/{len(jobs)}] {' | '.join(map(str, job))}")
        runnable = []
        for case in job:
            reason = _skip_reason(
                be,
                fw,
                device,
                case,
                cap,
                available,
                rates,
                efficiency,
                settings,
                is_target=case.key in target_keys,
            )
            if reason:
                skipped[case.key] = (case, reason)
                say(f"  skip {case.impl} {case.dtype}: {reason}")
            else:
                runnable.append(case)
        try:
            new = _run_job(
                be,
                backend,
                fw,
                device,
                runnable,
                rates,
                settings,
                memory,
                skipped,
                say,
                is_target=any(c.key in target_keys for c in job),
            )
        except KeyboardInterrupt:  # keep what a long run has measured so far
            say("interrupted: the rows measured so far are kept")
            interrupted = True
            skipped.update({c.key: (c, "interrupted (Ctrl-C) while it ran") for c in runnable})
            continue
        for row in new:
            if row["share_of_matmul"]:
                efficiency[(row["implementation"], row["dtype"], row["causal"])] = row["share_of_matmul"]
        rows += new

    skip_reasons = {key: reason for key, (_, reason) in skipped.items()}
    targets = (
        bench_targets.evaluate(be.name, rows, skip_reasons) if grid in ("full", "lsh") or targets_only else []
    )
    if grid == "lsh" and not targets_only:  # only the targets whose cases this grid holds
        targets = [t for t in targets if "not run in this invocation" not in str(t.get("detail"))]
    # conformance vectors (#26): bundle size, export time and verify throughput, with the numpy targets
    vectors = (
        bench_vectors.run_vectors(log=say) if targets_only and be.name == bench_vectors.BACKEND else None
    )
    targets += vectors["targets"] if vectors else []
    for t in targets:
        say(f"target {t['name']}: {t['detail']}")
    return {
        "schema": SCHEMA,
        "backend": be.name,
        "device": device,
        "device_name": _device_name(be, fw, device),
        "environment": _environment(policy, started, load_start),
        "grid": "targets" if targets_only else grid,
        "interrupted": interrupted,
        "settings": {
            **settings,
            "matmul_size": matmul_size,
            "available_bytes": available,
            "memory_cap_bytes": cap,
            "memory": "subprocess" if memory else "none",
        },
        "definitions": {
            "tflops": "dense-equivalent: 4*B*H*n*m*d / median_s, for causal and lsh rows too",
            "share_of_matmul": "tflops / matmul_tflops[dtype], a square matmul of side "
            "settings.matmul_size in the same framework, dtype and device",
            "peak_mem_bytes": "see mem_method: attnspec.bench.measure's docstring",
        },
        "matmul_tflops": rates,
        "rows": rows,
        "skipped": _group_skips(skipped.values()),
        "targets": targets,
        **({"vectors": {k: vectors[k] for k in ("definitions", "figures")}} if vectors else {}),
    }


def _jobs(backend_name: str, grid: str, targets_only: bool, dtypes, impls):
    """The jobs to run, in order (a job of several cases is timed interleaved), and the keys of
    the target cases among them."""
    target_jobs = bench_targets.target_jobs(backend_name) if grid in ("full", "lsh") or targets_only else []
    if grid == "lsh" and not targets_only:  # the targets among the grid's own cases (never skipped for time)
        grid_keys = {c.key for c in grid_cases(GRIDS[grid], backend_name, dtypes, impls)}
        target_jobs = [job for job in target_jobs if all(c.key in grid_keys for c in job)]
    target_jobs = [kept for job in target_jobs if (kept := tuple(c for c in job if c.impl in impls))]
    in_targets = {c.key for job in target_jobs for c in job}
    cases = [] if targets_only else grid_cases(GRIDS[grid], backend_name, dtypes, impls)
    return [(c,) for c in cases if c.key not in in_targets] + target_jobs, in_targets


def _skip_reason(be, fw, device, case, cap, available, rates, efficiency, settings, is_target) -> str | None:
    reason = static_skip(be, fw, device, case)
    if reason:
        return reason
    need = workspace_bytes(case, fw, device)
    if need is not None and cap is not None and need > cap:
        return (
            f"needs ~{human_bytes(need)} for its (n, m) logits, over the cap of "
            f"{human_bytes(cap)} ({MEMORY_FRACTION:.0%} of {human_bytes(available)} available)"
        )
    share = efficiency.get((case.impl, case.dtype, case.causal))
    est = estimated_seconds(case, rates.get(case.dtype), share)
    if not is_target and est is not None and est > settings["max_call_s"]:
        basis = (
            f"at the {share:.1%} of the matmul rate a smaller case achieved"
            if share
            else "at the matmul rate"
        )
        return (
            f"estimated {est:.0f} s per call (its FLOPs {basis}), over --max-call-s "
            f"{settings['max_call_s']:g}"
        )
    return None


def _run_job(
    be, backend_spec, fw, device, cases, rates, settings, memory, skipped, say, is_target: bool
) -> list[dict]:
    preps = {}
    for case in cases:
        try:
            preps[case] = prepare(be, device, case)
        except Exception as exc:
            skipped[case.key] = (case, f"failed to prepare: {type(exc).__name__}: {exc}")
            say(f"  failed to prepare {case}: {type(exc).__name__}: {exc}")
    if not preps:
        return []
    fns = {case: prep.call for case, prep in preps.items()}
    # a target decides met / missed on these numbers: give it more repeats than a grid case
    budget = max(settings["budget_s"], TARGET_BUDGET_S) if is_target else settings["budget_s"]
    try:
        timings = time_calls(fns, be.synchronize, budget_s=budget, max_repeats=settings["max_repeats"])
    except Exception as exc:
        for case in preps:
            skipped[case.key] = (case, f"failed: {type(exc).__name__}: {exc}")
        say(f"  failed: {type(exc).__name__}: {exc}")
        return []
    params = {case: prep.params for case, prep in preps.items()}
    del preps, fns  # free the inputs before a probe process needs the memory
    gc.collect()

    rows = []
    for case, t in timings.items():
        rate = rates.get(case.dtype)
        tflops, share_of_matmul = achieved(case, t.median_s, rate)
        peak, method = (
            probe_peak(
                "attnspec.bench.grid:prepare",
                {
                    "backend": backend_spec,
                    "device": device,
                    "case": {"impl": case.impl, "dtype": case.dtype, **case.shape_dict()},
                },
            )
            if memory
            else (None, "none")
        )
        row = {
            "implementation": case.impl,
            "pass": "forward+backward" if case.impl == "vjp" else "forward",
            "dtype": case.dtype,
            **case.shape_dict(),
            "median_s": t.median_s,
            "min_s": t.min_s,
            "max_s": t.max_s,
            "repeats": t.repeats,
            "timing": "interleaved" if len(timings) > 1 else "sequential",
            "flops": case.flops,
            "tflops": tflops,
            "share_of_matmul": share_of_matmul,
            "peak_mem_bytes": peak,
            "mem_method": method,
        }
        if params[case]:
            row["params"] = params[case]
        rows.append(row)
        share = f", {row['share_of_matmul']:.0%} of matmul" if rate else ""
        say(
            f"  {case.impl} {case.dtype}: {human_seconds(t.median_s)} "
            f"[{human_seconds(t.min_s)}, {human_seconds(t.max_s)}] x{t.repeats}, "
            f"{tflops:.3g} TFLOP/s{share}, peak {human_bytes(peak)} ({method})"
        )
    return rows


def achieved(case: Case, seconds: float, matmul_tflops: float | None) -> tuple[float, float | None]:
    """(TFLOP/s, share of the matmul rate) of one forward call of ``case`` taking ``seconds``."""
    tflops = case.flops / seconds / 1e12
    return tflops, (tflops / matmul_tflops if matmul_tflops else None)


def _group_skips(skips) -> list[dict[str, Any]]:
    groups: dict[tuple, dict[str, Any]] = {}
    for case, reason in skips:
        g = groups.setdefault(
            (case.impl, case.dtype, reason),
            {"implementation": case.impl, "dtype": case.dtype, "reason": reason, "cases": []},
        )
        g["cases"].append(case.shape_dict())
    return list(groups.values())


# -- environment --------------------------------------------------------------------------------


def _device_name(be, fw: str, device: str) -> str:
    if hasattr(be, "device_name"):
        try:
            return be.device_name(device)
        except Exception as exc:  # cosmetic: never fail a run over it
            return f"{device} ({type(exc).__name__})"
    if is_cpu(device):
        model = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
        return f"{model} ({os.cpu_count()} cores)"
    try:  # cosmetic, as above
        if fw == "torch":
            import torch

            return torch.cuda.get_device_name(device)
        if fw == "jax":
            return jax_device(device).device_kind
    except Exception:
        pass
    return device


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def _environment(policy: dict[str, Any], started: float, load_start: float | None) -> dict[str, Any]:
    return {
        **environment(policy),
        "threads": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if k in os.environ},
        "cpu_count": os.cpu_count(),
        # 1-minute load average at the start and the end: above cpu_count, timings are contended
        "load_average": [load_start, _load()],
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "elapsed_s": round(time.time() - started, 1),
    }


# -- writing and the command line ---------------------------------------------------------------


def _print_grid(backend_name: str, grid: str, targets_only: bool, dtypes, impls) -> None:
    jobs, target_keys = _jobs(backend_name, grid, targets_only, dtypes, impls)
    for job in jobs:
        tag = "  [target]" if job[0].key in target_keys else ""
        print(" | ".join(map(str, job)) + tag)


def _file_part(device: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]+", "-", device).strip("-")  # "cuda:0" -> "cuda-0"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnspec.bench.run", description=__doc__.split("\n")[0])
    ap.add_argument("--backend", help="registry name, or module:attribute (required unless --list)")
    ap.add_argument("--device", help="default: the backend's first device")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="quick")
    ap.add_argument("--targets-only", action="store_true", help="only the target shapes, and the targets")
    ap.add_argument("--out", help="default: reports/results/bench-<backend>-<device>.json")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument(
        "--dtypes", help="comma-separated (default: float32,float64 on cpu, else float16,bfloat16,float32)"
    )
    ap.add_argument("--impls", default=",".join(IMPLEMENTATIONS), help="comma-separated subset")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--budget-s", type=float, help="timed seconds per case (quick 0.2, full 0.75)")
    ap.add_argument("--max-repeats", type=int)
    ap.add_argument("--max-call-s", type=float, help="skip cases estimated slower than this per call")
    args = ap.parse_args(argv)
    impls = tuple(args.impls.split(","))
    unknown = set(impls) - set(IMPLEMENTATIONS)
    if unknown:
        ap.error(f"--impls: unknown {sorted(unknown)}; expected a subset of {list(IMPLEMENTATIONS)}")
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else None
    if args.list:  # no framework is imported for a registry name
        spec = args.backend or "numpy"
        name = resolve_backend(spec).name if ":" in spec else spec
        _print_grid(name, args.grid, args.targets_only, dtypes or default_dtypes(args.device or "cpu"), impls)
        return 0
    if not args.backend:
        ap.error("--backend is required")
    try:
        resolve_backend(args.backend)
    except (SpecError, ImportError, AttributeError) as exc:  # unknown or not installed: no traceback
        ap.error(str(exc))
    doc = run_bench(
        args.backend,
        args.device,
        args.grid,
        targets_only=args.targets_only,
        dtypes=dtypes,
        impls=impls,
        memory=not args.no_memory,
        budget_s=args.budget_s,
        max_repeats=args.max_repeats,
        max_call_s=args.max_call_s,
    )
    out = args.out or f"reports/results/bench-{doc['backend']}-{_file_part(doc['device'])}.json"
    write_json_atomic(out, doc)
    print(f"wrote {out}", file=sys.stderr)
    return 130 if doc["interrupted"] else 0  # 128 + SIGINT, as a shell reports Ctrl-C


if __name__ == "__main__":
    sys.exit(main())
