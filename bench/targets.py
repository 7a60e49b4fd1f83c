"""Performance targets, evaluated from the rows of the same benchmark run.

Each target names the backends it applies to and the cases it needs; the runner times those
cases (a tuple of several is timed interleaved, so machine drift hits both alike) and then
`evaluate` reads the rows back. ``met`` is True or False when the rows were measured, and None
when they could not be (skipped, failed, or the implementation does not exist); ``detail`` then
says why, and otherwise gives the shape, the numbers behind ``value``, and by how much a
missed target was missed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnspec.bench.grid import Case, human_bytes, human_seconds

__all__ = ["TARGETS", "Target", "evaluate", "target_jobs"]

Rows = dict[tuple, dict[str, Any]]


@dataclass(frozen=True)
class Target:
    name: str
    backends: tuple[str, ...]
    jobs: tuple[tuple[Case, ...], ...]  # each job is timed on its own; cases in a job interleaved
    goal: float
    check: Callable[[Rows, dict[tuple, str], float], dict[str, Any]]


def _missing(rows: Rows, skipped: dict[tuple, str], *cases: Case) -> str | None:
    for case in cases:
        if case.key not in rows:
            return f"not measured: {case}: {skipped.get(case.key, 'not run in this invocation')}"
    return None


def _unmeasured(why: str) -> dict[str, Any]:
    return {"value": None, "met": None, "detail": why}


def _measured(*cases: Case) -> Callable[[Callable], Callable]:
    """A target's check, run only when every one of ``cases`` was measured (else its value is
    None, and the detail says why)."""

    def wrap(check: Callable) -> Callable:
        def checked(rows: Rows, skipped, target: float) -> dict[str, Any]:
            why = _missing(rows, skipped, *cases)
            return _unmeasured(why) if why else check(rows, skipped, target)

        return checked

    return wrap


def _verdict(value: float, target: float, higher_is_better: bool, unit: str = "") -> tuple[bool, str]:
    met = value >= target if higher_is_better else value <= target
    if met:
        return True, f"met ({value:.3g}{unit} {'>=' if higher_is_better else '<='} {target:.3g}{unit})"
    gap = target - value if higher_is_better else value - target
    return False, f"missed by {gap:.3g}{unit} ({value:.3g}{unit} vs {target:.3g}{unit})"


def _share_target(case: Case) -> Callable:
    @_measured(case)
    def check(rows: Rows, skipped, target: float) -> dict[str, Any]:
        row = rows[case.key]
        share = row["share_of_matmul"]
        if share is None:
            return _unmeasured(f"no {case.dtype} matmul rate was measured")
        met, verdict = _verdict(share, target, True)
        detail = (
            f"{verdict}; B={case.B} H={case.H} n={case.n} d={case.d} {case.dtype}: "
            f"{human_seconds(row['median_s'])}, {row['tflops']:.3g} TFLOP/s of "
            f"{row['tflops'] / share:.3g} (matmul)"
        )
        if not met:
            detail += f"; needs {target / share:.2f}x its speed"
        return {"value": share, "met": met, "detail": detail}

    return check


def _overhead_target(adapter: Case, native: Case) -> Callable:
    @_measured(adapter, native)
    def check(rows: Rows, skipped, limit: float) -> dict[str, Any]:
        a, b = rows[adapter.key]["median_s"], rows[native.key]["median_s"]
        value = a / b - 1
        met, verdict = _verdict(100 * value, 100 * limit, False, " %")
        detail = (
            f"{verdict}; adapter {human_seconds(a)} vs native {human_seconds(b)} (medians, "
            f"interleaved), B={adapter.B} H={adapter.H} n={adapter.n} d={adapter.d} {adapter.dtype}"
        )
        return {"value": value, "met": met, "detail": detail}

    return check


def _blocked_memory_target(case: Case) -> Callable:
    @_measured(case)
    def check(rows: Rows, skipped, fraction: float) -> dict[str, Any]:
        row = rows[case.key]
        naive = case.n * case.m * 8
        if row["peak_mem_bytes"] is None:
            return _unmeasured(f"peak memory not measured: {row['mem_method']}")
        value = row["peak_mem_bytes"] / naive
        met, verdict = _verdict(value, fraction, False)
        detail = (
            f"{verdict}; peak {human_bytes(row['peak_mem_bytes'])} ({row['mem_method']}) vs the "
            f"naive n*m*8 = {human_bytes(naive)} (computed, not run); n=m={case.n} d={case.d}"
        )
        return {"value": value, "met": met, "detail": detail}

    return check


def _speedup_target(fast: Case, slow: Case) -> Callable:
    def check(rows: Rows, skipped, factor: float) -> dict[str, Any]:
        if fast.key not in rows and "does not implement" in skipped.get(fast.key, ""):
            return _unmeasured(f"not available: {skipped[fast.key]}")
        why = _missing(rows, skipped, fast, slow)
        if why:
            return _unmeasured(why)
        f, s = rows[fast.key]["median_s"], rows[slow.key]["median_s"]
        value = s / f
        met, verdict = _verdict(value, factor, True, "x")
        detail = (
            f"{verdict}; {fast.impl} {human_seconds(f)} vs {slow.impl} (fused full attention) "
            f"{human_seconds(s)}, L={fast.n} B={fast.B} H={fast.H} d={fast.d} {fast.dtype}, "
            f"lsh {fast.lsh_params()}"
        )
        return {"value": value, "met": met, "detail": detail}

    return check


_GOLDEN = Case("golden", "float64", 1, 8, 4096, 4096, 64)
_ARRAY_API = Case("adapter", "float32", 1, 8, 4096, 4096, 64)
_BLOCKED = Case("blocked", "float64", 1, 1, 32768, 32768, 64)
_LSH = Case("lsh", "float32", 1, 1, 65536, 65536, 64)
_LSH_DENSE = Case("native", "float32", 1, 1, 65536, 65536, 64)


_OVERHEAD = (
    Case("adapter", "float32", 1, 8, 1024, 1024, 64),
    Case("native", "float32", 1, 8, 1024, 1024, 64),
)

TARGETS = (
    Target(
        "golden float64 forward >= 40% of float64 matmul",
        ("numpy",),
        ((_GOLDEN,),),
        0.40,
        _share_target(_GOLDEN),
    ),
    Target(
        "array_api on NumPy float32 forward >= 50% of float32 matmul",
        ("array_api-numpy",),
        ((_ARRAY_API,),),
        0.50,
        _share_target(_ARRAY_API),
    ),
    Target(
        "torch adapter overhead over F.scaled_dot_product_attention <= 5%",
        ("torch",),
        (_OVERHEAD,),
        0.05,
        _overhead_target(*_OVERHEAD),
    ),
    Target(
        "jax adapter overhead over jax.nn.dot_product_attention <= 5%",
        ("jax",),
        (_OVERHEAD,),
        0.05,
        _overhead_target(*_OVERHEAD),
    ),
    Target(
        "blocked golden peak memory at n=32768 < 1/10 of the naive n*m*8 bytes",
        ("numpy",),
        ((_BLOCKED,),),
        0.10,
        _blocked_memory_target(_BLOCKED),
    ),
    # two jobs, not interleaved: one dense call at this L takes seconds to minutes on a CPU
    Target(
        "torch LSH at L=65536 >= 10x faster than fused full attention",
        ("torch",),
        ((_LSH,), (_LSH_DENSE,)),
        10.0,
        _speedup_target(_LSH, _LSH_DENSE),
    ),
)


def target_jobs(backend_name: str) -> list[tuple[Case, ...]]:
    jobs: list[tuple[Case, ...]] = []
    for target in TARGETS:
        if backend_name in target.backends:
            jobs += [job for job in target.jobs if job not in jobs]
    return jobs


def evaluate(backend_name: str, rows: list[dict[str, Any]], skipped: dict[tuple, str]) -> list[dict]:
    """The targets that apply to this backend, each with value, target, met and detail."""
    by_key = {row_key(row): row for row in rows}
    out = []
    for target in TARGETS:
        if backend_name not in target.backends:
            continue
        result = target.check(by_key, skipped, target.goal)
        out.append({"name": target.name, "target": target.goal, **result})
    return out


def row_key(row: dict[str, Any]) -> tuple:
    return (
        row["implementation"],
        row["dtype"],
        row["B"],
        row["H"],
        row["n"],
        row["m"],
        row["d"],
        row["causal"],
    )
