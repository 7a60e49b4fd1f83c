"""The benchmark page, ``performance.md``: timings, throughput and memory per backend, device and
dtype, the device's matmul rate they are measured against, the targets, and the LSH error table."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from attnspec.reports._io import Results, as_float
from attnspec.reports._md import DASH, nbytes, num, pct, run_label, seconds, table

__all__ = [
    "IMPLEMENTATION_ORDER",
    "impl_key",
    "lsh_quality_stats",
    "lsh_scaling",
    "performance_page",
    "share",
]

IMPLEMENTATION_ORDER = ("adapter", "native", "golden", "blocked", "lsh", "vjp")
NO_RESULTS = "No benchmark results in `{dir}`; run `nox -s bench`."
Plots = dict[tuple[str, str, str], list[tuple[str, str]]]


def impl_key(name: str) -> tuple[int, str]:
    order = IMPLEMENTATION_ORDER
    return (order.index(name), "") if name in order else (len(order), name)


def bench_key(doc: dict[str, Any]) -> tuple[str, str, str]:
    return (doc["backend"], doc["device"], doc["_file"])


def row_key(r: dict[str, Any]) -> tuple:
    return (impl_key(r["implementation"]), r["pass"], r["causal"], r["B"], r["H"], r["d"], r["n"], r["m"])


def share(doc: dict[str, Any], r: dict[str, Any]) -> float | None:
    """The row's share of the matmul rate measured in the same run (computed if not recorded)."""
    if r.get("share_of_matmul") is not None:
        return as_float(r["share_of_matmul"])
    rate = as_float((doc.get("matmul_tflops") or {}).get(r["dtype"]))
    tflops = as_float(r.get("tflops"))
    if rate and tflops is not None and math.isfinite(rate):
        return tflops / rate
    return None


def _rates(doc: dict[str, Any]) -> str:
    rates = doc.get("matmul_tflops") or {}
    return ", ".join(f"{dt} {num(rates[dt])} TFLOP/s" for dt in sorted(rates)) or "not measured"


def _met(t: dict[str, Any]) -> str:
    if t.get("met") is None:
        return "?"
    if t["met"]:
        return "✓"
    value, target = as_float(t.get("value")), as_float(t.get("target"))
    if value is None or target is None or not (math.isfinite(value) and math.isfinite(target)):
        return "✗"
    gap = value - target
    ratio = f"{value / target:.2f}× the target, " if target else ""
    return f"✗ ({ratio}{num(abs(gap))} {'below' if gap < 0 else 'above'})"


def _targets(results: Results) -> str:
    rows = []
    for doc in sorted(results.bench, key=bench_key):
        for t in sorted(doc.get("targets") or [], key=lambda t: t["name"]):
            rows.append(
                [
                    doc["backend"],
                    doc["device"],
                    t["name"],
                    num(t.get("value")),
                    num(t.get("target")),
                    _met(t),
                    f"`{doc['_file']}`",
                    t.get("detail"),
                ]
            )
    if not rows:
        return "No targets were recorded."
    # a target can be evaluated by several runs (the targets run, and a grid holding its cases)
    return table(
        ["backend", "device", "name", "value", "target", "met", "results file", "detail"], rows, "lllrrlll"
    )


def _machines(results: Results) -> str:
    rows = [
        [doc["backend"], doc["device"], doc.get("device_name"), _rates(doc), f"`{doc['_file']}`"]
        for doc in sorted(results.bench, key=bench_key)
    ]
    return table(["backend", "device", "device name", "matmul rate (same run)", "results file"], rows)


def _time(r: dict[str, Any]) -> str:
    text = seconds(r["median_s"])
    if r.get("min_s") is not None and r.get("max_s") is not None:
        text += f" ({seconds(r['min_s'])} – {seconds(r['max_s'])})"
    return text


def _params(r: dict[str, Any]) -> str:
    params = r.get("params")
    if not isinstance(params, dict):
        return ""
    return ", ".join(f"{k}={params[k]}" for k in sorted(params))


def _dtype_table(doc: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    body = []
    with_params = any(_params(r) for r in rows)
    for r in sorted(rows, key=row_key):
        mem = DASH if r.get("peak_mem_bytes") is None else nbytes(r["peak_mem_bytes"])
        body.append(
            [
                r["implementation"],
                r["pass"],
                r["B"],
                r["H"],
                r["n"],
                r["m"],
                r["d"],
                "yes" if r["causal"] else "no",
                _time(r),
                num(r.get("tflops")),
                pct(share(doc, r)),
                mem,
                r.get("mem_method"),
            ]
            + ([_params(r)] if with_params else [])
        )
    headers = [
        "implementation",
        "pass",
        "B",
        "H",
        "n",
        "m",
        "d",
        "causal",
        "median (min – max)",
        "TFLOP/s",
        "share of matmul",
        "peak memory",
        "memory method",
    ]
    return table(
        headers + (["params"] if with_params else []), body, "llrrrrrlrrrrl" + ("l" if with_params else "")
    )


def _skipped(doc: dict[str, Any]) -> list[str]:
    """The cases the run skipped (an optional list of {implementation, dtype, reason, cases})."""
    groups = [g for g in doc.get("skipped") or [] if isinstance(g, dict)]
    if not groups:
        return []
    rows = sorted(
        [str(g.get("implementation")), str(g.get("dtype")), len(g.get("cases") or []), str(g.get("reason"))]
        for g in groups
    )
    return ["", "Skipped cases:", "", table(["implementation", "dtype", "cases", "reason"], rows, "llrl")]


def _definitions(doc: dict[str, Any]) -> list[str]:
    defs = doc.get("definitions")
    if not isinstance(defs, dict) or not defs:
        return []
    return ["", "Definitions recorded by the run:", ""] + [f"- *{k}*: {defs[k]}" for k in sorted(defs)]


def lsh_scaling(doc: dict[str, Any]) -> list[str]:
    """LSH against full attention at each L of one run: times, peaks, speed-up, crossover.

    Full attention is every non-LSH row of the same dtype, B, H and d with n = m = L (the
    backend's sdpa, and the framework's fused kernel where there is one); a skipped one shows
    its skip reason. The crossover is the first L from which LSH is faster at every larger L
    measured. Timings on a shared machine are noisy: read them beside the run's load average.
    """
    lsh = [r for r in doc["rows"] if r["implementation"] == "lsh" and not r["causal"]]
    if not lsh:
        return []
    skips = {
        (
            str(g.get("implementation")),
            g.get("dtype"),
            (c.get("B"), c.get("H"), c.get("d"), c.get("n")),
        ): g.get("reason")
        for g in doc.get("skipped") or []
        if isinstance(g, dict)
        for c in g.get("cases") or []
    }
    out = []
    for dtype in sorted({r["dtype"] for r in lsh}):
        rows = sorted((r for r in lsh if r["dtype"] == dtype), key=lambda r: r["n"])
        shapes = {(r["B"], r["H"], r["d"], r["n"]) for r in rows}
        # the full-attention implementations this run measured or skipped at the LSH rows' shapes
        full_impls = sorted(
            {
                f["implementation"]
                for f in doc["rows"]
                if f["implementation"] != "lsh"
                and f["dtype"] == dtype
                and (f["B"], f["H"], f["d"], f["n"]) in shapes
            }
            | {g for g, dt, shape in skips if g != "lsh" and dt == dtype and shape in shapes},
            key=impl_key,
        )
        if not full_impls:
            continue
        body = []
        crossover: dict[str, list[tuple[int, bool]]] = {}  # implementation -> (L, LSH faster) at each L
        for r in rows:
            cells = [
                r["n"],
                (r.get("params") or {}).get("n_buckets", DASH),
                seconds(r["median_s"]),
                nbytes(r.get("peak_mem_bytes")),
            ]
            for impl in full_impls:
                full = next(
                    (
                        f
                        for f in doc["rows"]
                        if f["implementation"] == impl
                        and f["dtype"] == dtype
                        and not f["causal"]
                        and (f["B"], f["H"], f["d"], f["n"], f["m"])
                        == (r["B"], r["H"], r["d"], r["n"], r["m"])
                    ),
                    None,
                )
                if full is None:
                    why = skips.get((impl, dtype, (r["B"], r["H"], r["d"], r["n"])), "not run")
                    cells += [f"skipped: {why}", DASH, DASH]
                    continue
                ratio = full["median_s"] / r["median_s"]
                cells += [seconds(full["median_s"]), nbytes(full.get("peak_mem_bytes")), f"{ratio:.3g}×"]
                crossover.setdefault(impl, []).append((r["n"], ratio > 1))
            body.append(cells)
        headers = ["L", "n_buckets", "lsh median", "lsh peak"]
        for impl in full_impls:
            headers += [f"{impl} median", f"{impl} peak", f"{impl} / lsh"]
        first = []
        for impl in full_impls:
            pts = crossover.get(impl, [])
            wins = [n for i, (n, _) in enumerate(pts) if all(w for _, w in pts[i:])]
            # one L says who is faster there, not where they cross
            found = "needs two or more L" if len(pts) == 1 else f"L = {wins[0]}" if wins else "none measured"
            first.append(f"{impl}: {found}")
        r0 = rows[0]
        out += [
            "",
            f"### LSH scaling: {doc['backend']} / {doc['device']} / {dtype}",
            "",
            f"B={r0['B']} H={r0['H']} d={r0['d']}, lsh chunk_length="
            f"{(r0.get('params') or {}).get('chunk_length')}, n_hashes="
            f"{(r0.get('params') or {}).get('n_hashes')}. Theory: full attention "
            "time and memory ∝ L², LSH ∝ L·C (the figure's dotted lines). "
            f"Crossover (first L from which LSH is faster): {'; '.join(first)}.",
            "",
            table(headers, body, "rr" + "rr" + "rrr" * len(full_impls)),
        ]
    return out


REFORMER_LIBS = ("lucidrains-lsh", "hf-lsh")


def reformer_comparison(doc: dict[str, Any]) -> list[str]:
    """attnspec's LSH against the Reformer libraries at each L of one `attnspec.bench.reformer` run (#17).

    Goal: attnspec-lsh at most as slow as the faster library and within the smaller library peak.
    """
    rows = [r for r in doc["rows"] if r["implementation"] in ("attnspec-lsh", *REFORMER_LIBS)]
    ours = {r["n"]: r for r in rows if r["implementation"] == "attnspec-lsh"}
    if not ours:
        return []
    body = []
    for L in sorted(ours):
        r = ours[L]
        libs = {x["implementation"]: x for x in rows if x["n"] == L and x["implementation"] in REFORMER_LIBS}
        cells = [
            L,
            (r.get("params") or {}).get("n_buckets", DASH),
            _time(r),
            nbytes(r["peak_mem_bytes"]) if r.get("peak_mem_bytes") is not None else DASH,
        ]
        for name in REFORMER_LIBS:
            lib = libs.get(name)
            cells += [
                _time(lib) if lib else DASH,
                nbytes(lib["peak_mem_bytes"]) if lib and lib.get("peak_mem_bytes") is not None else DASH,
            ]
        fastest = min((x["median_s"] for x in libs.values()), default=None)
        peaks = [x["peak_mem_bytes"] for x in libs.values() if x.get("peak_mem_bytes") is not None]
        speed = f"{fastest / r['median_s']:.2f}x" if fastest else DASH
        time_ok = fastest is not None and r["median_s"] <= fastest
        mem_ok = bool(peaks) and r.get("peak_mem_bytes") is not None and r["peak_mem_bytes"] <= min(peaks)
        cells += [speed, "yes" if time_ok else "no", "yes" if mem_ok else "no"]
        body.append(cells)
    nh = (next(iter(ours.values())).get("params") or {}).get("n_hashes", "?")
    headers = ["L", "n_buckets", "attnspec median (min – max)", "attnspec peak"]
    for name in REFORMER_LIBS:
        headers += [f"{name} median (min – max)", f"{name} peak"]
    headers += ["faster library / attnspec (medians)", "time goal", "memory goal"]
    return [
        "",
        f"### Reformer libraries: {doc['backend']} / {doc['device']} / float32 / {nh} hashes",
        "",
        "attnspec's torch `lsh_attention` against reformer-pytorch's `LSHAttention` and Hugging Face's "
        "`LSHSelfAttention` (its two 64 x 64 projections included), B=1, one head, d=64, chunk 64, "
        "L/64 buckets, no autograd, timed interleaved (`python -m attnspec.bench.reformer`, "
        "run by `nox -s bench-torch`). Goal (#17): time at most the faster library's, peak memory "
        "at most the smaller library peak. On a shared machine a burst of load can land on one "
        "implementation's repeats more than another's (attnspec makes more, smaller framework "
        "calls, which suffer most): read min – max beside the medians.",
        "",
        table(headers, body, "lr" + "r" * (len(headers) - 2)),
    ]


def lsh_quality_stats(results: Results) -> list[tuple[str, int, int, float, float, float]]:
    """(input, n_hashes, seeds, mean, min, max) of rel_err over seeds, from every lsh-quality file."""
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for doc in results.lsh_quality:
        for r in doc["rows"]:
            groups[(r["input"], r["n_hashes"])].append(float(r["rel_err"]))
    return [(inp, nh, len(v), sum(v) / len(v), min(v), max(v)) for (inp, nh), v in sorted(groups.items())]


def _lsh_quality(results: Results, plot: tuple[str, str] | None) -> list[str]:
    stats = lsh_quality_stats(results)
    if not stats:
        return []
    files = ", ".join(f"`{d['_file']}`" for d in results.lsh_quality)
    lines = [
        "",
        "## LSH approximation error",
        "",
        f"Relative error of LSH attention against full attention, over seeds ({files}).",
        "",
        table(
            ["input", "n_hashes", "seeds", "mean rel err", "min", "max"],
            [[i, nh, s, num(mean), num(lo), num(hi)] for i, nh, s, mean, lo, hi in stats],
            "lrrrrr",
        ),
    ]
    if plot:
        lines += ["", f"![{plot[0]}]({plot[1]})"]
    return lines


def suite_throughput(results: Results) -> list[str]:
    """The conformance suite's own speed: one row per backend, device, profile and selection."""
    if not results.suite_timing:
        return []
    rows = []
    for d in sorted(
        results.suite_timing, key=lambda d: (d["backend"], d["device"], d["profile"], d["selection"])
    ):
        rate = d["cases"] / d["seconds"] if d["seconds"] else None
        rows.append(
            [
                d["backend"],
                d["device"],
                d["profile"],
                f"`{d['selection']}`" if d["selection"] else "all",
                d["jobs"],
                d["tests"],
                d["cases"],
                num(d["seconds"]),
                num(rate),
                num(d["first_result_s"]),
                "incomplete" if d["incomplete"] else "",
                d.get("date", "")[:10],
                d.get("git_commit"),
            ]
        )
    return [
        "",
        "## Suite throughput",
        "",
        "Wall-clock seconds of `python -m attnspec.conformance.run` (what `nox -s conformance` runs per",
        "backend, environment already installed), cases per second, and seconds until the first case",
        "had a result (imports, collection, the backend's set-up). Written by every run into",
        "`reports/results/suite-timings/`; `nox -s bench` adds a `dev`-profile run per backend.",
        "JAX rows depend on the persistent compilation cache (`~/.cache/attnspec/jax`): see the",
        "guide's performance page (docs/guide/performance.md) for cold and warm figures.",
        "",
        table(
            [
                "backend",
                "device",
                "profile",
                "selection",
                "jobs",
                "tests",
                "cases",
                "seconds",
                "cases/s",
                "first result (s)",
                "",
                "date",
                "commit",
            ],
            rows,
            "lllllrrrrrlll",
        ),
    ]


def vectors_throughput(results: Results) -> list[str]:
    """The conformance vector bundles (`attnspec.bench.vectors`): one row per bench run and profile."""
    rows = []
    for doc in sorted(results.bench, key=bench_key):
        for f in (doc.get("vectors") or {}).get("figures") or []:
            rows.append(
                [
                    doc["backend"],
                    doc["device"],
                    f.get("profile"),
                    f.get("function"),
                    ", ".join(f.get("dtypes") or []),
                    f.get("cases"),
                    num(f.get("size_mb")),
                    num(f.get("export_s")),
                    num(f.get("verify_s")),
                    num(f.get("verify_cases_per_s")),
                    f"{f.get('passed')}/{f.get('cases')}",
                    f"`{doc['_file']}`",
                ]
            )
    if not rows:
        return []
    return [
        "",
        "## Conformance vectors",
        "",
        "`attnspec vectors export` of the sdpa bundles (all four dtypes) and `attnspec vectors verify` of",
        "the numpy backend's outputs for them (`python -m attnspec.bench.vectors`, run by `nox -s bench`",
        "with the numpy targets). Size: every file written, MB of 10^6 bytes. Verify: median seconds of",
        "loading the bundles (schema, hashes) and judging every output, report not included. Goals: at most",
        "25 MB, export at most 60 s, verify at least 2000 cases/s (the Targets table above).",
        "",
        table(
            [
                "backend",
                "device",
                "profile",
                "function",
                "dtypes",
                "cases",
                "MB",
                "export (s)",
                "verify (s)",
                "verify cases/s",
                "passed",
                "results file",
            ],
            rows,
            "lllllrrrrrrl",
        ),
    ]


def performance_page(
    results: Results, plots: Plots | None = None, lsh_plot: tuple[str, str] | None = None
) -> str:
    """The Markdown of ``performance.md``; ``plots`` maps a bench run's key to its figures."""
    plots = plots or {}
    lines = ["# Performance", ""]
    if not results.bench:
        lines += [NO_RESULTS.format(dir=results.directory), *suite_throughput(results)]
        return "\n".join([*lines, *_lsh_quality(results, lsh_plot), ""])
    lines += [
        f"From {len(results.bench)} benchmark run(s). *median* is over the timed repeats after",
        "warm-up (min – max beside it). *share of matmul* divides the row's TFLOP/s by the dense",
        "matmul rate of the same device and dtype, measured in the same run, so rows from different",
        "machines compare by efficiency rather than by raw speed.",
        "",
        "## Machines",
        "",
        _machines(results),
        "",
        "## Targets",
        "",
        _targets(results),
        *suite_throughput(results),
        *vectors_throughput(results),
    ]
    for doc in sorted(results.bench, key=bench_key):
        title = run_label(doc) + (f" — {doc['device_name']}" if doc.get("device_name") else "")
        grid = f" Grid: `{doc['grid']}`." if isinstance(doc.get("grid"), str) else ""
        lines += ["", f"## {title}", "", f"Matmul rate measured in this run: {_rates(doc)}.{grid}"]
        lines += _definitions(doc)
        by_dtype: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in doc["rows"]:
            by_dtype[r["dtype"]].append(r)
        for dtype in sorted(by_dtype):
            lines += [
                "",
                f"### {doc['backend']} / {doc['device']} / {dtype}",
                "",
                _dtype_table(doc, by_dtype[dtype]),
            ]
        lines += lsh_scaling(doc)
        lines += reformer_comparison(doc)
        figures = plots.get(bench_key(doc), [])
        if figures:
            lines += ["", "\n\n".join(f"![{t}]({p})" for t, p in figures)]
        if not doc["rows"]:
            lines += ["", "No rows."]
        lines += _skipped(doc)
    lines += _lsh_quality(results, lsh_plot)
    return "\n".join(lines) + "\n"
