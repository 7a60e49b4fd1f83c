"""Measuring for `attnspec.bench.run`: wall-clock timing, the matmul reference rate, and
peak memory measured in a fresh subprocess.

Timing: every clock read (``time.perf_counter``) comes right after the device is synchronized
(the backend's ``synchronize()``, plus ``block_until_ready()`` on a JAX result), so a time
covers the queued work and not just its dispatch.

Peak memory: each measurement runs in a new Python process (``python -m
attnspec.bench.measure '<json>'``) that imports the framework, creates the inputs, then
measures one call. What is measured, by where the arrays live:

    rss-subprocess   CPU. Peak resident set size during one call minus the resident set size
                     just before it (imports done, inputs created; for a framework other than
                     NumPy, after one warm-up call, so JIT compilation is not counted): the
                     call's workspace plus its output. The peak is /proc/self/status VmHWM,
                     reset to the current RSS right before the call by writing 5 to
                     /proc/self/clear_refs. The child runs with MALLOC_MMAP_THRESHOLD_=131072,
                     so glibc hands large blocks back on free and the warm-up call's freed
                     memory cannot hide the measured call's (the default threshold drifts up
                     to 32 MiB after the first frees).
    rss-subprocess-noreset   as above where clear_refs is not writable: no warm-up call, and the
                     peak is the process's lifetime peak (imports included) minus the RSS
                     after input creation.
    torch-cuda       torch.cuda.max_memory_allocated() after reset_peak_memory_stats(), minus
                     memory_allocated() before the call (after a warm-up call): tensors of
                     PyTorch's caching allocator only, not its cached free blocks nor memory
                     that libraries allocate outside it.
    jax-device       device.memory_stats() peak_bytes_in_use after a warm-up call and the
                     measured call, minus bytes_in_use after input creation (JAX cannot reset
                     the peak; both calls run the same program).
    cupy-pool        growth of the default memory pool's total_bytes() over the call, from a
                     pool emptied by free_all_blocks(): an upper bound (block rounding).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "Timing",
    "allocation",
    "available_bytes",
    "block",
    "is_cpu",
    "jax_device",
    "matmul_tflops",
    "measure_peak",
    "probe_peak",
    "time_calls",
]

K = TypeVar("K")  # what the timed callables are keyed by (a name, a bench case)
#: calls slower than this get a single timed repeat (after the warm-up)
LONG_CALL_S = 10.0
PROBE_PREFIX = "ATTNSPEC-PROBE "


@dataclass(frozen=True)
class Timing:
    median_s: float
    min_s: float
    max_s: float
    repeats: int


def block(out: Any) -> None:
    """Wait for an asynchronously computed result (JAX dispatch returns before the work ends)."""
    for x in out if isinstance(out, tuple) else (out,):
        if hasattr(x, "block_until_ready"):
            x.block_until_ready()


def _timed(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    out = fn()
    block(out)
    sync()
    t1 = time.perf_counter()
    del out
    return t1 - t0


def time_calls(
    fns: dict[K, Callable[[], Any]],
    sync: Callable[[], None],
    *,
    budget_s: float = 0.75,
    min_repeats: int = 3,
    max_repeats: int = 50,
    warmup: int = 2,
) -> dict[K, Timing]:
    """Time each zero-argument callable: warm-up calls, then timed repeats, interleaved.

    With several callables the repeats alternate between them (rounds AB, BA, AB...), so a
    slow drift of the machine (another process, thermal state) lands on all of them alike:
    the way to compare two implementations on a busy machine. Repeats stop once each callable
    has ``min_repeats`` and ``budget_s`` per callable is used, or at ``max_repeats``. A
    callable whose first call takes longer than the budget gets one warm-up call, and one
    taking over LONG_CALL_S gets a single timed repeat.
    """
    slowest = 0.0
    for fn in fns.values():
        first = _timed(fn, sync)  # compilation, caches, first-touch page faults
        if first < budget_s:
            for _ in range(warmup - 1):
                _timed(fn, sync)
        slowest = max(slowest, first)
    if slowest > LONG_CALL_S:
        min_repeats = 1
    names = list(fns)
    times: dict[K, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < max_repeats and (
        rounds < min_repeats or time.perf_counter() - start < budget_s * len(names)
    ):
        for name in names if rounds % 2 == 0 else reversed(names):
            times[name].append(_timed(fns[name], sync))
        rounds += 1
    return {name: Timing(statistics.median(ts), min(ts), max(ts), len(ts)) for name, ts in times.items()}


def matmul_tflops(backend: Any, dtype: str, device: str, size: int, budget_s: float) -> float:
    """The rate of a (size, size) @ (size, size) matmul on the backend's arrays, in TFLOP/s.

    2 * size**3 FLOPs, timed like the attention calls. This is the reference that
    ``share_of_matmul`` divides by: the framework's own dense-matmul rate on this device.
    """
    import numpy as np

    rng = np.random.default_rng(1)
    a = backend.asarray(rng.standard_normal((size, size), dtype=np.float32), dtype=dtype, device=device)
    b = backend.asarray(rng.standard_normal((size, size), dtype=np.float32), dtype=dtype, device=device)
    t = time_calls({"mm": lambda: a @ b}, backend.synchronize, budget_s=budget_s)["mm"]
    return 2 * size**3 / t.median_s / 1e12


def is_cpu(device: str) -> bool:
    """Whether a backend's device name is the host CPU ("cpu", array_api_strict's "CPU_DEVICE")."""
    return "cpu" in str(device).lower()


# -- available memory ---------------------------------------------------------------------------


def available_bytes(framework: str, device: str) -> int | None:
    """Memory free for a benchmark on ``device`` now (host RAM for "cpu"), or None if unknown."""
    try:
        return _available_bytes(framework, device)
    except Exception:  # an accelerator without a free-memory query: no cap, not a failed run
        return None


def _available_bytes(framework: str, device: str) -> int | None:
    if is_cpu(device):
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    if framework == "torch":
        import torch

        return int(torch.cuda.mem_get_info(device)[0])
    if framework == "jax":
        stats = jax_device(device).memory_stats()
        return None if not stats else int(stats["bytes_limit"] - stats["bytes_in_use"])
    if framework == "cupy":
        import cupy

        return int(cupy.cuda.runtime.memGetInfo()[0])
    return None


def jax_device(device: str):
    """The JAX device the jax backends call ``device``: "cpu", or "<platform>:<id>" ("gpu:0")."""
    import jax

    if device in (None, "cpu"):
        return jax.devices("cpu")[0]
    for d in jax.devices():
        if device in (f"{d.platform}:{d.id}", d.platform):
            return d
    raise ValueError(f"no JAX device {device!r} among {jax.devices()}")


# -- peak memory: the parent side -------------------------------------------------------------


def probe_peak(target: str, kwargs: dict[str, Any], timeout_s: float = 900) -> tuple[int | None, str]:
    """Run ``target(**kwargs)`` in a fresh Python process and measure one call's peak memory.

    ``target`` is "module:function"; the function creates the inputs and returns a `Prepared`
    (``call``, ``sync``, ``framework``, ``device``). Returns (peak bytes, method), or (None,
    "failed: ...") when the child dies (an out-of-memory kill included) or times out.
    """
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    spec = json.dumps({"target": target, "kwargs": kwargs})
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "attnspec.bench.measure", spec],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None, f"failed: probe timed out after {timeout_s:.0f} s"
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(PROBE_PREFIX):
            result = json.loads(line[len(PROBE_PREFIX) :])
            return result["peak_bytes"], result["method"]
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return None, f"failed: probe exit code {proc.returncode}: {tail[:300]}"


# -- peak memory: the child side --------------------------------------------------------------


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise OSError(f"/proc/self/status has no {key}")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux >= 4.0: reset VmHWM to the current RSS
        return True
    except OSError:
        return False


def _release_free_heap() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _run(prep: Any) -> None:
    out = prep.call()
    block(out)
    prep.sync()
    del out


def measure_peak(prep: Any) -> tuple[int, str]:
    """Peak memory of one ``prep.call()`` in this process (see the module docstring)."""
    fw, device = prep.framework, prep.device
    if fw == "torch" and not is_cpu(device):
        import torch

        _run(prep)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        _run(prep)
        return torch.cuda.max_memory_allocated(device) - base, "torch-cuda"
    if fw == "jax" and not is_cpu(device):
        dev = jax_device(device)
        stats = dev.memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            base = stats["bytes_in_use"]
            _run(prep)
            _run(prep)
            return dev.memory_stats()["peak_bytes_in_use"] - base, "jax-device"
    if fw == "cupy":
        import cupy

        _run(prep)
        pool = cupy.get_default_memory_pool()
        pool.free_all_blocks()
        base = pool.total_bytes()
        _run(prep)
        return pool.total_bytes() - base, "cupy-pool"
    if not is_cpu(device):
        raise RuntimeError(f"no peak-memory counter for {fw} on {device}")
    if not _reset_hwm():
        base = _status_bytes("VmRSS")
        _run(prep)
        return _status_bytes("VmHWM") - base, "rss-subprocess-noreset"
    if fw != "numpy":
        _run(prep)  # JIT compilation and one-time caches: not the call's own memory
    _release_free_heap()
    _reset_hwm()
    base = _status_bytes("VmRSS")
    _run(prep)
    return _status_bytes("VmHWM") - base, "rss-subprocess"


@dataclass
class Allocation:
    """A `Prepared` stand-in whose call allocates and touches ``nbytes``: checks the probe."""

    nbytes: int
    framework: str = "numpy"
    device: str = "cpu"

    def call(self):
        import numpy as np

        return np.ones(self.nbytes // 8)  # ones, not empty: every page is written, so resident

    def sync(self) -> None:
        pass


def allocation(nbytes: int) -> Allocation:
    return Allocation(int(nbytes))


def _child(spec_json: str) -> None:
    spec = json.loads(spec_json)
    module, _, name = spec["target"].partition(":")
    prep = getattr(importlib.import_module(module), name)(**spec["kwargs"])
    peak, method = measure_peak(prep)
    print(PROBE_PREFIX + json.dumps({"peak_bytes": int(peak), "method": method}), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1])
