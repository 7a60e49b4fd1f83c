"""The figures: golden attention weights, time and memory against sequence length, LSH error.

Figures are built with matplotlib's object API on the Agg canvas (no pyplot, so no global state
and no display), at a modest dpi so each PNG stays well under 200 KB. Every function writes into
a `StagedOutput` and returns ``(title, path)`` pairs, paths relative to the report directory.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from attnspec.reports._io import Results, StagedOutput, as_float
from attnspec.reports._md import nbytes, seconds
from attnspec.reports.performance import bench_key, impl_key

__all__ = ["lsh_heatmap", "lsh_quality_plot", "perf_plots", "weight_heatmaps"]

DPI = 90
Plot = tuple[str, str]


def _save(fig: Figure, staged: StagedOutput, name: str) -> str:
    rel = f"plots/{name}"
    fig.tight_layout()
    fig.savefig(staged.path(rel), dpi=DPI, metadata={"Software": None})  # no version: stable bytes
    return rel


def _heat(ax, w: np.ndarray, title: str, fig: Figure, xlabel: str = "key j", ylabel: str = "query i"):
    im = ax.imshow(w, cmap="Blues", vmin=0.0, vmax=max(float(w.max()), 1e-12), interpolation="nearest")
    fig.colorbar(im, ax=ax, shrink=0.85, label="weight")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.tick_params(labelsize=7)


def _inputs(rng: np.random.Generator, n: int, m: int, d: int = 8):
    q = rng.standard_normal((1, n, d))  # (H=1, n, d)
    k = rng.standard_normal((1, m, d))  # (H=1, m, d)
    v = rng.standard_normal((1, m, d))  # (H=1, m, d)
    return q, k, v


def _staircase(ax, n: int, shift: int, **style) -> None:
    """The right edge of the visible keys, j <= i + shift, drawn between cells."""
    xs, ys = [], []
    for i in range(n):
        x = i + shift + 0.5
        xs += [x, x]
        ys += [i - 0.5, i + 0.5]
    ax.plot(xs, ys, **style)


def weight_heatmaps(staged: StagedOutput) -> list[Plot]:
    """Weights of the golden `sdpa` for a causal (lower_right, n != m), a padded and a windowed call."""
    from attnspec.spec import sdpa

    rng = np.random.default_rng(0)
    out = []
    n, m = 6, 10
    q, k, v = _inputs(rng, n, m)
    _, w = sdpa(q, k, v, causal="lower_right", return_weights=True)  # w: (1, n, m)
    fig = Figure(figsize=(4.6, 3.0))
    ax = fig.add_subplot()
    _heat(ax, w[0], f'causal="lower_right", n={n}, m={m}', fig)
    _staircase(ax, n, m - n, color="crimson", lw=1.5, label="lower_right: j ≤ i + m − n")
    _staircase(ax, n, 0, color="orange", lw=1.2, ls="--", label="upper_left would be: j ≤ i")
    ax.legend(fontsize=6, loc="lower left")
    out.append(
        (
            "Golden weights, causal lower_right with n != m",
            _save(fig, staged, "weights-causal-lower-right.png"),
        )
    )

    n = m = 8
    q, k, v = _inputs(rng, n, m)
    _, w = sdpa(q, k, v, kv_lengths=5, q_lengths=6, return_weights=True)
    fig = Figure(figsize=(4.0, 3.2))
    _heat(fig.add_subplot(), w[0], "kv_lengths=5, q_lengths=6: padded keys\nabsent, padded query rows 0", fig)
    out.append(("Golden weights, padded (kv_lengths, q_lengths)", _save(fig, staged, "weights-padded.png")))

    n = m = 12
    q, k, v = _inputs(rng, n, m)
    _, w = sdpa(q, k, v, window=(3, 1), return_weights=True)
    fig = Figure(figsize=(4.0, 3.2))
    _heat(fig.add_subplot(), w[0], "window=(3, 1): i − 3 ≤ j ≤ i + 1", fig)
    out.append(("Golden weights, sliding window (3, 1)", _save(fig, staged, "weights-window.png")))
    return out


def lsh_heatmap(staged: StagedOutput) -> Plot | str:
    """Effective weights of the golden LSH attention, or a note saying why there is no figure.

    With v = identity, out[i] = sum_j w[i, j] e_j is row i of the weights (all hash rounds
    combined), so the figure needs nothing beyond the public function.
    """
    try:
        from attnspec.spec.lsh import lsh_attention, lsh_rotations
    except ImportError as exc:
        return f"LSH heatmap skipped: `attnspec.spec.lsh` is not importable ({exc})."
    rng = np.random.default_rng(1)
    L, d, n_hashes, n_buckets, C = 24, 8, 2, 4, 4
    centers = rng.standard_normal((3, d))
    x = centers[np.arange(L) % 3] + 0.15 * rng.standard_normal((L, d))  # (L, d): 3 interleaved clusters
    rotations = lsh_rotations(0, d, n_hashes, n_buckets)
    w, buckets = lsh_attention(
        x, np.eye(L), rotations=rotations, chunk_length=C, return_buckets=True
    )  # w: (L, L), buckets: (n_hashes, L)
    order = np.lexsort((np.arange(L), buckets[0]))  # round 0's (bucket, position) sort
    fig = Figure(figsize=(7.6, 3.3))
    title = f"L={L}, n_hashes={n_hashes}, n_buckets={n_buckets}, chunk_length={C}"
    _heat(fig.add_subplot(1, 2, 1), w, f"LSH weights\n{title}", fig)
    _heat(
        fig.add_subplot(1, 2, 2),
        w[np.ix_(order, order)],
        "same, positions sorted by round-0 bucket",
        fig,
        "key (sorted)",
        "query (sorted)",
    )
    return ("Golden LSH attention weights (3 clustered inputs)", _save(fig, staged, "weights-lsh.png"))


def _kind(implementation: str) -> str:
    name = implementation.lower()
    return "lsh" if "lsh" in name else "blocked" if "block" in name or "flash" in name else "full"


# exponent of n in time and in memory, per kind: blocked keeps O(n^2) work but O(n * C) memory
_THEORY = {"full": (2, 2), "blocked": (2, 1), "lsh": (1, 1)}
_THEORY_LABEL = {1: "∝ n (n·C)", 2: "∝ n²"}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def _series(rows: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Rows of one figure grouped into lines: (implementation order, name, B, H, d, causal)."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[
            (impl_key(r["implementation"]), r["implementation"], r["B"], r["H"], r["d"], r["causal"])
        ].append(r)
    return {k: sorted(v, key=lambda r: (r["n"], r["m"])) for k, v in sorted(groups.items())}


def _label(key: tuple, shapes: dict[str, set]) -> str:
    _, impl, B, H, d, causal = key
    text = impl + (" causal" if causal else "")
    if len(shapes[impl]) > 1:  # this implementation ran more than one (B, H, d): say which
        text += f" B={B} H={H} d={d}"
    return text


def _ticks(ax, fmt) -> None:
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: fmt(v)))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _panel(
    ax, series: dict[tuple, list[dict]], field: str, which: int, ylabel: str, fmt, ybase: int = 10
) -> None:
    impls = sorted({k[:2] for k in series})
    colors = {name: f"C{i % 10}" for i, (_, name) in enumerate(impls)}
    shapes: dict[str, set] = defaultdict(set)
    for key in series:
        shapes[key[1]].add(key[2:5])
    used: set[int] = set()  # the theory powers drawn (_THEORY)
    ns: set[int] = set()
    for key, rows in series.items():
        pts = [(r["n"], as_float(r.get(field))) for r in rows]
        pts = [(n, y) for n, y in pts if y is not None and y > 0 and n > 0]
        if not pts:
            continue
        color, causal = colors[key[1]], key[5]
        xs, ys = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
        ns.update(int(x) for x in xs)
        ax.plot(xs, ys, "s--" if causal else "o-", color=color, ms=3, lw=1.2, label=_label(key, shapes))
        if len(xs) > 1 and not causal:  # causal does about half the work: its own slope, no line
            power = _THEORY[_kind(key[1])][which]
            ax.plot(xs, ys[0] * (xs / xs[0]) ** power, ":", color=color, lw=1.0)
            used.add(power)
    for power in sorted(used):  # legend entries for the dotted theory lines
        ax.plot([], [], ":", color="gray", label=f"theory {_THEORY_LABEL[power]}")
    ax.set_xscale("log")
    ax.set_yscale("log", base=ybase)  # memory in powers of 2 reads as whole KiB/MiB/GiB
    if ns:
        ax.set_xticks(sorted(ns))
    _ticks(ax, fmt)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=6)


def perf_plots(results: Results, staged: StagedOutput) -> dict[tuple[str, str, str], list[Plot]]:
    """Median time and peak memory against n (log-log), one figure per bench run, pass and dtype.

    Theory lines (dotted, same colour) start at each non-causal series' first point: time ∝ n²
    for full and blocked attention and ∝ n for LSH; memory ∝ n² for full and ∝ n (n·C, C fixed)
    for blocked and LSH.
    """
    out: dict[tuple[str, str, str], list[Plot]] = {}
    for doc in sorted(results.bench, key=bench_key):
        stem = _safe(doc["_file"].removesuffix(".json").removeprefix("bench-"))
        for pass_, dtype in sorted({(r["pass"], r["dtype"]) for r in doc["rows"]}):
            series = _series([r for r in doc["rows"] if (r["pass"], r["dtype"]) == (pass_, dtype)])
            fig = Figure(figsize=(8.4, 3.4))
            _panel(fig.add_subplot(1, 2, 1), series, "median_s", 0, "median time", seconds)
            _panel(fig.add_subplot(1, 2, 2), series, "peak_mem_bytes", 1, "peak memory", nbytes, ybase=2)
            where = f"{doc['backend']} / {doc['device']}, {dtype}, {pass_}"
            fig.suptitle(where, fontsize=10)
            out.setdefault(bench_key(doc), []).append(
                (
                    f"Time and peak memory against n: {where}",
                    _save(fig, staged, f"perf-{stem}-{_safe(pass_)}-{_safe(dtype)}.png"),
                )
            )
    return out


def lsh_quality_plot(results: Results, staged: StagedOutput) -> Plot | None:
    """LSH relative error against n_hashes: mean over seeds, min-max band, one line per input kind."""
    from attnspec.reports.performance import lsh_quality_stats

    stats = lsh_quality_stats(results)
    if not stats:
        return None
    fig = Figure(figsize=(4.8, 3.4))
    ax = fig.add_subplot()
    for idx, inp in enumerate(sorted({s[0] for s in stats})):
        rows = [s for s in stats if s[0] == inp]
        nh = np.array([s[1] for s in rows], float)
        mean, lo, hi = (np.array([s[i] for s in rows], float) for i in (3, 4, 5))
        ax.plot(nh, mean, "o-", color=f"C{idx}", ms=3, label=f"{inp} (mean over seeds)")
        ax.fill_between(nh, lo, hi, color=f"C{idx}", alpha=0.2, lw=0)
    ax.set_xscale("log", base=2)
    if all(s[4] > 0 for s in stats):
        ax.set_yscale("log")
    ax.set_xlabel("n_hashes")
    ax.set_ylabel("relative error vs full attention")
    ax.set_title("LSH error (band: min – max over seeds)", fontsize=9)
    ax.grid(True, which="both", lw=0.3, alpha=0.5)
    ax.legend(fontsize=7)
    return ("LSH relative error against n_hashes", _save(fig, staged, "lsh-quality.png"))
