"""Where the suite's time goes: ``python -m attnspec.conformance.timing --backend NAME``.

Runs the conformance suite in this process (no crash isolation: a measuring run, not a verdict)
while a sampling thread looks at the main thread's stack every few milliseconds and files each
sample under one category:

* ``start-up and collection``: before the first test starts (imports, pytest collection);
* ``XLA compilation``: inside JAX's compiler (wins over every other category);
* ``backend calls``: the backend under test and its framework;
* ``golden``: `attnspec.spec` computing the expected answer;
* ``tolerance reference``: the same-precision reference the tolerance rule measures against;
* ``judging``: comparing, classifying causes, writing messages;
* ``journaling``: the per-case journal the crash-isolating runner reads;
* ``case generation``: Hypothesis drawing inputs, and the suite's strategies;
* ``other``: whatever is left (pytest's own bookkeeping, fixtures).

The shares are statistical (one sample per interval), so a category's seconds are accurate to
about the interval times the square root of its sample count. Any other argument goes to pytest.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter

from attnspec.conformance.profiles import PROFILES
from attnspec.conformance.run import suite_arguments

CATEGORIES = (
    "start-up and collection",
    "XLA compilation",
    "backend calls",
    "golden",
    "tolerance reference",
    "judging",
    "journaling",
    "case generation",
    "other",
)


def classify(frames: list[tuple[str, str]], tests_started: bool) -> str:
    """The category of one stack sample, given as (module, function) from outermost to innermost."""
    if not tests_started:
        return "start-up and collection"
    if any(mod.startswith("jax._src") and "compile" in fn for mod, fn in frames):
        return "XLA compilation"
    in_test, fallback = False, ""
    for mod, fn in frames:
        if mod.startswith("conformance."):  # the suite's files as pytest imports them (rootdir-relative)
            mod = "attnspec." + mod
        if "conformance" in mod and mod.rpartition(".")[2].startswith("test_"):
            in_test = True  # the property's body: what it calls next decides
            continue
        if not in_test:
            continue
        if mod == "attnspec.conformance.recorder" and fn in ("_log", "record", "start"):
            return "journaling"
        if mod.startswith("attnspec.spec.tolerance"):
            return "tolerance reference"
        if mod.startswith("attnspec.spec."):
            return "golden"
        if mod == "attnspec.conformance.pytest_helpers" and fn == "golden_for":
            continue  # its callees (golden, reference) decide
        if mod.startswith(
            (
                "attnspec.backends",
                "torch",
                "jax",
                "jaxlib",
                "array_api",
                "mlx",
                "tinygrad",
                "keras",
                "flax",
                "transformers",
            )
        ) or not mod.startswith(("attnspec", "hypothesis", "numpy", "_pytest", "pluggy")):
            return "backend calls"  # the backend, its framework, or a plugin's own module
        if mod.startswith("hypothesis") or mod.endswith(("_cases", "hypothesis_helpers")):
            return "case generation"
        if mod.startswith("attnspec.conformance"):
            fallback = "judging"  # unless something it calls is more specific
    if fallback:
        return fallback
    if any(
        mod.startswith("hypothesis") or mod.endswith(("_cases", "hypothesis_helpers")) for mod, _ in frames
    ):
        return "case generation"
    return "other"


class Sampler:
    """Samples one thread's stack every ``interval`` seconds and counts the categories."""

    def __init__(self, thread_id: int, interval: float = 0.005) -> None:
        self.thread_id, self.interval = thread_id, interval
        self.counts: Counter[str] = Counter()
        self.tests_started = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self.thread_id)
            stack = []
            while frame is not None:
                stack.append((frame.f_globals.get("__name__", ""), frame.f_code.co_name))
                frame = frame.f_back
            self.counts[classify(stack[::-1], self.tests_started)] += 1

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class _StartMarker:
    """A pytest plugin object: tells the sampler when the first test begins."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def pytest_runtest_setup(self, item) -> None:
        self.sampler.tests_started = True


def breakdown(counts: Counter[str], wall: float) -> list[tuple[str, float, float]]:
    """(category, seconds, share) with the samples scaled to the measured wall time."""
    total = sum(counts.values()) or 1
    return [(c, wall * counts[c] / total, counts[c] / total) for c in CATEGORIES]


def main(argv: list[str] | None = None) -> int:
    import pytest

    ap = argparse.ArgumentParser(
        prog="python -m attnspec.conformance.timing", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--backend", required=True)
    ap.add_argument("--profile", default="dev", choices=PROFILES)
    ap.add_argument("--interval", type=float, default=0.005, help="seconds between stack samples")
    args, pytest_args = ap.parse_known_args(argv)
    sampler = Sampler(threading.get_ident(), args.interval)
    t0 = time.perf_counter()
    with sampler:
        extra = [a for a in pytest_args if a != "--"]
        code = pytest.main(
            suite_arguments(args.backend, args.profile, extra), plugins=[_StartMarker(sampler)]
        )
    wall = time.perf_counter() - t0
    print(
        f"\n{args.backend}, profile {args.profile}: {wall:.0f} s wall, {sum(sampler.counts.values())} samples"
    )
    for category, seconds, share in breakdown(sampler.counts, wall):
        print(f"  {category:<24} {seconds:7.1f} s  {share:6.1%}")
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
