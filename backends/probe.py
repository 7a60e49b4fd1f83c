"""Capability probing: what an implementation accepts, found by calling it on tiny cases.

`probe(backend)` calls ``backend.sdpa`` on a plain case in each dtype, then on the cases of each
need of `attnspec.backends.conventions.NEEDS` (GQA, dk != dv, each rank, full and broadcast
masks, returned weights...) in the first dtype that worked. Each need has several cases (ranks
4, 3, 5 and 2; a scattered mask and a key-padding one): a need is supported when any of them
returns, and unsupported only when every one raised (or the convention refuses it), with each
exception as the reason. Only the cases of an unsupported need are refused in the suite; a case
the function declines as it runs (raising `attnspec.backends.Unsupported`) refuses itself alone.
Whether a result is *right* is the conformance suite's business, never the probe's.

A backend that implements ``sdpa_fp8`` (a function through a convention that passes descales)
is probed on `attnspec.backends.conventions.FP8_NEEDS` too: ``fp8`` (q, k, v in its first FP8
dtype with (B, Hkv) descales) and ``fp8_kv_cache`` (a bfloat16 or float32 q over an FP8 cache),
each in bfloat16 out, then float32 out; other backends are probed as before.

``python -m attnspec.backends.probe TARGET --out FILE`` probes in a child process, one probe at
a time: a probe that crashes the interpreter or hangs is recorded as ``crashed`` / ``timeout``
and the rest still run (`probe_isolated`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnspec.backends.base import FLOAT_DTYPES, Backend, Unsupported
from attnspec.backends.conventions import FP8_NEEDS, NEEDS, Call
from attnspec.journal import read_journal

__all__ = ["PROBE_CASES", "Capabilities", "ProbeResult", "probe", "probe_isolated"]

#: the reason of every need's probe when no dtype worked
NO_DTYPE = "no dtype worked on a plain call"
#: dtypes in the order a feature probe prefers them
PREFERRED = ("float32", "float64", "bfloat16", "float16")


@dataclass(frozen=True)
class ProbeResult:
    need: str  # "dtype" for the plain dtype probes, else a name from NEEDS
    dtype: str
    status: str  # ok | refused | convention (refused by the convention itself) | crashed | timeout
    reason: str = ""


@dataclass
class Capabilities:
    """The probe's findings; `refusals` turns them into a case's unsupported reasons."""

    results: list[ProbeResult]

    def _by(self) -> dict[tuple[str, str], ProbeResult]:
        return {(r.need, r.dtype): r for r in self.results}

    def refusals(self, dtype: str | None, call: Call) -> list[str]:
        by, why = self._by(), []
        plain = by.get(("dtype", dtype)) if dtype else None
        if plain is not None and plain.status != "ok":
            why.append(f"probe: a plain {dtype} call {_said(plain)}")
        for r in self.results:
            if r.need in call.needs and r.status not in ("ok", "convention"):
                why.append(f"probe: a call with {r.need} {_said(r)}")
        return why

    def as_json(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.results]

    @classmethod
    def from_json(cls, rows: list[dict[str, Any]]) -> Capabilities:
        return cls([ProbeResult(**r) for r in rows])


def _said(r: ProbeResult) -> str:
    verb = {"refused": "raised", "crashed": "crashed the interpreter", "timeout": "hung"}[r.status]
    return f"{verb}: {r.reason}" if r.reason and r.status == "refused" else verb


def _arrays(rng, q_shape, k_shape, v_shape):
    return tuple(rng.standard_normal(s) for s in (q_shape, k_shape, v_shape))


#: q, k, v shapes of the plain probe in each rank (n = 3, m = 4): 4 first, the shape most take
RANKS = {
    4: ((1, 2, 3, 4), (1, 2, 4, 4), (1, 2, 4, 4)),
    3: ((2, 3, 4), (2, 4, 4), (2, 4, 4)),
    5: ((2, 1, 2, 3, 4), (2, 1, 2, 4, 4), (2, 1, 2, 4, 4)),
    2: ((3, 4), (4, 4), (4, 4)),
}
_SCATTERED = np.array([[1, 0, 1, 1], [0, 1, 1, 0], [1, 1, 0, 1]], bool)  # (n, m): no prefix
_PREFIX = np.array([[1, 1, 1, 0]] * 3, bool)  # (n, m): key padding, the mask every library takes


def _cases(need: str) -> list[tuple[tuple, tuple, tuple, dict[str, Any]]]:
    """The tiny cases probing ``need``, (q_shape, k_shape, v_shape, options) each: the need is
    supported when any of them returns. Several shapes are tried (ranks 4, 3, 5, 2; full-size and
    broadcast masks; a prefix mask as well as a scattered one), so a function that takes only
    4-D inputs or only key-padding masks still has the cases it can run."""
    q, k, v = RANKS[4]
    full = (1, 2, 3, 4)  # (B, H, n, m) of the rank-4 shapes
    if need in ("plain", "empty_q"):
        return [(*RANKS[r], {}) for r in (4, 3, 5, 2)]
    if need.startswith("rank"):
        return [(*RANKS[int(need[4:])], {})]
    if need == "gqa":
        return [((1, 4, 3, 4), k, v, {}), ((4, 3, 4), (2, 4, 4), (2, 4, 4), {})]
    if need == "dk_ne_dv":
        return [(q, k, (1, 2, 4, 6), {}), (q[1:], k[1:], (2, 4, 6), {})]
    if need == "batch_broadcast":
        return [((2, 2, 3, 4), k, v, {})]
    if need == "empty":  # no key at all (n = 0 is probed as "empty_q", with a mask)
        return [(q, (1, 2, 0, 4), (1, 2, 0, 4), {}), (q[1:], (2, 0, 4), (2, 0, 4), {})]
    if need == "mask":  # a full-size mask: the one every mask-taking function must accept
        return [(q, k, v, {"mask": np.broadcast_to(m, full).copy()}) for m in (_SCATTERED, _PREFIX)]
    if need == "mask_broadcast":  # a mask with fewer axes, or size-1 ones, than (B, H, n, m)
        return [(q, k, v, {"mask": m}) for m in (_SCATTERED, _PREFIX, _PREFIX[None, None, :1])]
    options: dict[str, Any]
    if need == "scale":
        options = {"scale": 0.5}
    elif need == "bias":
        options = {"bias": np.linspace(-1, 1, 12).reshape(3, 4)}
    elif need in ("causal_upper_left", "causal_lower_right"):
        options = {"causal": need.removeprefix("causal_")}
    elif need == "window":
        options = {"window": (1, 1)}
    elif need == "window_lower_right":
        options = {"window": (1, 1), "causal": "lower_right"}
    elif need in ("q_lengths", "kv_lengths"):  # per batch element: rank 4 only
        return [(q, k, v, {need: np.array([2 if need == "q_lengths" else 3])})]
    elif need == "return_weights":
        options = {"return_weights": True}
    elif need == "softcap":
        options = {"softcap": 5.0}
    elif need == "alibi":  # n = m: every anchor gives -slope * |i - j|, so no convention refuses it
        return [((1, 2, 4, 4), k, v, {"alibi_slopes": np.array([0.5, 0.25])})]  # one slope per query head
    elif need == "sinks":
        options = {"sinks": np.array([0.5, -1.0])}
    elif need == "lse":
        options = {"return_lse": True}
    elif need == "segments":
        options = {"q_segment_ids": np.array([0, 0, 1]), "kv_segment_ids": np.array([0, 0, 1, 1])}
    elif need == "causal_lower_right_lengths":
        options = {"causal": "lower_right_lengths"}
    elif need == "dropout":
        options = {
            "dropout_mask": np.array([[1, 0, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1]], bool),
            "dropout_p": 0.25,
        }
    else:
        raise ValueError(f"probe: no case for need {need!r}")  # every need gets a case that exercises it
    # the option on the plain call in rank 4, then rank 3 (a function without a batch axis)
    return [(q, k, v, options), (*RANKS[3], options)]


def _with_causal(need: str, cases: list) -> list:
    """``cases``, then each again with lower-right causal (on the lengths, when it has some) where
    it sets no causal and still exercises ``need``: a function that is always causal (vLLM's
    ``ref_paged_attn``, the ``vllm_paged`` convention) gets a case it can run. Tried last, so a
    function that returns on the plain cases is probed exactly as before."""
    from attnspec.backends.conventions import call_needs

    extra = []
    for qs, ks, vs, opts in cases:
        if "causal" in opts:
            continue
        lengths = opts.get("q_lengths") is not None or opts.get("kv_lengths") is not None
        causal = {**opts, "causal": "lower_right_lengths" if lengths else "lower_right"}
        if need == "plain" or need in call_needs(qs, ks, vs, causal).needs:
            extra.append((qs, ks, vs, causal))
    return cases + extra


#: need -> its tiny cases; "plain" is the dtype probe
PROBE_CASES = {need: _with_causal(need, _cases(need)) for need in ("plain", *NEEDS)}
_DESCALE = np.array([[0.5, 2.0]], np.float32)  # (B, Hkv) of the rank-4 shapes
PROBE_CASES["fp8"] = [
    (*RANKS[4], {"q_descale": _DESCALE, "k_descale": _DESCALE, "v_descale": _DESCALE, "out_dtype": out})
    for out in ("bfloat16", "float32")
]
PROBE_CASES["fp8_kv_cache"] = [
    (*RANKS[4], {"q_dtype": wide, "k_descale": _DESCALE, "v_descale": _DESCALE, "out_dtype": wide})
    for wide in ("bfloat16", "float32")
]
PROBE_CASES["empty_q"] = [
    ((1, 2, 0, 4), (1, 2, 4, 4), (1, 2, 4, 4), {"mask": np.ones((0, 4), bool)}),
    ((2, 0, 4), (2, 4, 4), (2, 4, 4), {"mask": np.ones((0, 4), bool)}),
]


def probe_one(backend: Backend, need: str, dtype: str, device: str | None = None) -> ProbeResult:
    """Call ``backend.sdpa`` on the tiny cases of ``need`` in ``dtype``: ok when one returns,
    else refused with every case's reason."""
    if need == "empty":  # both kinds of empty: no key, and no query (with a mask)
        first = _probe_need(backend, "empty", dtype, device)
        return (
            first if first.status != "ok" else _probe_need(backend, "empty_q", dtype, device, label="empty")
        )
    return _probe_need(backend, need, dtype, device)


def _probe_need(
    backend: Backend, need: str, dtype: str, device: str | None, label: str | None = None
) -> ProbeResult:
    label = label or need
    label = label if label != "plain" else "dtype"
    reasons: list[str] = []
    convention_only = True
    for shapes in PROBE_CASES[need]:
        error = _probe_call(backend, shapes, dtype, device)
        if error is None:
            return ProbeResult(label, dtype, "ok")
        text = " ".join(str(error).split())
        # the convention's own refusal is known without calling: recorded, not repeated as a reason
        convention_only &= isinstance(error, Unsupported) and "convention" in text
        shown = f"q{shapes[0]}: {type(error).__name__}: {text[:200]}"
        if shown.partition(": ")[2] not in [r.partition(": ")[2] for r in reasons]:
            reasons.append(shown)
    return ProbeResult(label, dtype, "convention" if convention_only else "refused", "; ".join(reasons)[:600])


def _probe_call(backend: Backend, shapes, dtype: str, device: str | None) -> Exception | None:
    """Call ``backend.sdpa`` on one probe case (``backend.sdpa_fp8`` when ``dtype`` is FP8); the
    exception it raised, or None."""
    qs, ks, vs, opts = shapes
    rng = np.random.default_rng(0)
    if dtype in getattr(backend, "fp8_dtypes", ()):
        return _probe_fp8_call(backend, shapes, dtype, device)
    try:
        q, k, v = (backend.asarray(x, dtype, device) for x in _arrays(rng, qs, ks, vs))
        conv = {}
        for name, value in opts.items():
            if isinstance(value, np.ndarray):
                value = value.astype(dtype) if value.dtype.kind == "f" else value
                value = backend.asarray(value, None if value.dtype.kind != "f" else dtype, device)
            conv[name] = value
        backend.sdpa(q, k, v, **conv)
    except Exception as e:  # any refusal is a finding
        return e
    return None


def _probe_fp8_call(backend: Backend, shapes, dtype: str, device: str | None) -> Exception | None:
    """Call ``backend.sdpa_fp8`` on one FP8 probe case: k, v (and q, unless the case names a wide
    ``q_dtype``) stored in ``dtype``, halved so nothing saturates."""
    qs, ks, vs, opts = shapes
    opts = dict(opts)
    q_dtype = opts.pop("q_dtype", dtype)
    rng = np.random.default_rng(0)
    try:
        q, k, v = (
            backend.asarray(x / 2, d, device)
            for x, d in zip(_arrays(rng, qs, ks, vs), (q_dtype, dtype, dtype))
        )
        conv = {
            n: backend.asarray(x, None, device) if isinstance(x, np.ndarray) else x for n, x in opts.items()
        }
        backend.sdpa_fp8(q, k, v, **conv)
    except Exception as e:  # any refusal is a finding
        return e
    return None


def fp8_needs(backend: Backend) -> tuple[str, ...]:
    """The FP8 needs to probe: `FP8_NEEDS` for a backend with sdpa_fp8, none otherwise."""
    return FP8_NEEDS if "sdpa_fp8" in getattr(backend, "implements", ()) else ()


def plan(dtypes: tuple[str, ...], fp8: tuple[str, ...] = ()) -> list[tuple[str, str | None]]:
    """The probes to run, in order: (need, dtype); dtype None = the first dtype that worked (an
    FP8 need's: the backend's first FP8 dtype)."""
    return [("plain", d) for d in dtypes] + [(need, None) for need in (*NEEDS, *fp8)]


def probe(
    backend: Backend,
    dtypes: tuple[str, ...] | None = None,
    device: str | None = None,
    skip: dict[str, str] | None = None,
    on_event: Callable[[dict], None] | None = None,
) -> Capabilities:
    """Probe ``backend`` in-process. ``skip`` ("need/dtype" -> status) marks probes as crashed/timeout
    without running them."""
    dtypes = tuple(dtypes) if dtypes else tuple(getattr(backend, "dtypes", FLOAT_DTYPES))
    results: list[ProbeResult] = []
    feature_dtype: str | None = None
    fp8 = fp8_needs(backend)
    for need, dtype in plan(dtypes, fp8):
        if dtype is None and need in fp8:
            dtype = backend.fp8_dtypes[0]
        if dtype is None:
            if feature_dtype is None:
                ok = [r.dtype for r in results if r.need == "dtype" and r.status == "ok"]
                feature_dtype = next((d for d in PREFERRED if d in ok), "")
            if not feature_dtype:
                results.append(ProbeResult(need, "", "refused", NO_DTYPE))
                if on_event:
                    on_event({"event": "done", **asdict(results[-1]), "probe": f"{need}/"})
                continue
            dtype = feature_dtype
        if on_event:
            on_event({"event": "start", "need": need, "dtype": dtype})
        if skip and f"{need}/{dtype}" in skip:
            r = ProbeResult(need if need != "plain" else "dtype", dtype, skip[f"{need}/{dtype}"])
        else:
            r = probe_one(backend, need, dtype, device)
        results.append(r)
        if on_event:
            on_event({"event": "done", **asdict(r), "probe": f"{need}/{dtype}"})
    return Capabilities(results)


def probe_isolated(
    target: str,
    out: Path,
    dtypes: tuple[str, ...] | None = None,
    device: str | None = None,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> Capabilities:
    """Probe ``target`` (anything `attnspec.backends.load` takes) in a child process.

    A probe that kills the child or runs past ``timeout`` seconds is recorded as crashed /
    timeout, and the child restarts after it. The findings are written to ``out`` as JSON.
    """
    out = out.resolve()
    journal, log = out.with_suffix(".jsonl"), out.with_suffix(".log")
    journal.unlink(missing_ok=True)
    (out.parent / "probe-cwd").mkdir(parents=True, exist_ok=True)
    skip: dict[str, str] = {}
    for _ in range(len(plan(tuple(dtypes or FLOAT_DTYPES), FP8_NEEDS)) + 1):
        cmd = [
            sys.executable,
            "-W",
            "ignore::RuntimeWarning",
            "-m",
            "attnspec.backends.probe",
            target,
            "--journal",
            str(journal),
            "--skip",
            json.dumps(skip),
        ]
        if dtypes:
            cmd += ["--dtypes", ",".join(dtypes)]
        if device:
            cmd += ["--device", device]
        with open(log, "w") as err:  # run in an empty folder: nothing of the caller's shadows a package
            proc = subprocess.Popen(
                cmd,
                env={**os.environ, **(env or {})},
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                cwd=out.parent.resolve() / "probe-cwd",
            )
            status = _wait(proc, journal, timeout)
        events = read_journal(journal)
        if status is None:
            if proc.returncode != 0:  # it could not even load the target
                lines = log.read_text(errors="replace").strip().splitlines()
                raise RuntimeError(lines[-1] if lines else f"probe child exited with {proc.returncode}")
            break
        started = [e for e in events if e["event"] == "start"]
        if not started:
            raise RuntimeError(f"the probe child {status} before its first probe")
        last = started[-1]
        skip[f"{last['need']}/{last['dtype']}"] = status
        journal.unlink(missing_ok=True)
    done = [e for e in read_journal(journal) if e["event"] == "done"]
    caps = Capabilities([ProbeResult(e["need"], e["dtype"], e["status"], e["reason"]) for e in done])
    out.write_text(json.dumps(caps.as_json(), indent=1))
    journal.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    (out.parent / "probe-cwd").rmdir()
    return caps


def _wait(proc: subprocess.Popen, journal: Path, timeout: float) -> str | None:
    last, size = time.time(), -1
    while True:
        code = proc.poll()
        if code is not None:
            return "crashed" if code < 0 else None
        now_size = journal.stat().st_size if journal.exists() else 0
        if now_size != size:
            size, last = now_size, time.time()
        if time.time() - last > timeout:
            import signal

            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "timeout"
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnspec.backends.probe", description=__doc__.splitlines()[0]
    )
    ap.add_argument("target", help="backend name, module:Class, or module:function@convention[/arrays]")
    ap.add_argument("--dtypes", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--journal", default=None)
    ap.add_argument("--skip", default="{}")
    ap.add_argument("--out", default=None, help="write the findings here (JSON); isolated in a child")
    args = ap.parse_args(argv)
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else None
    if args.out:
        caps = probe_isolated(args.target, Path(args.out), dtypes, args.device)
        for r in caps.results:
            print(f"{r.need:20} {r.dtype:9} {r.status:8} {r.reason}")
        return 0
    import attnspec.backends

    backend = attnspec.backends.load(args.target)
    with open(args.journal, "a", buffering=1) if args.journal else contextlib.nullcontext() as journal:

        def log(event: dict) -> None:
            if journal:
                journal.write(json.dumps(event) + "\n")
                journal.flush()
                os.fsync(journal.fileno())

        probe(backend, dtypes, args.device, skip=json.loads(args.skip), on_event=log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
