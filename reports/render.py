"""Render the results JSON of every machine into ``reports/``: Markdown pages and PNG plots.

    python -m attnspec.reports.render [--results DIR] [--out DIR] [--no-plots]

Reads ``conformance-*.json``, ``bench-*.json``, ``lsh-quality*.json``, ``copy_task.json`` and
``mutation.json`` from ``--results`` (default ``reports/results``) and writes ``index.md``,
``accuracy.md``, ``deviations.md``, ``performance.md``, ``mutation.md`` and ``plots/*.png``
under ``--out`` (default ``reports``), both relative to the current directory. Everything is
rendered into a temporary directory inside ``--out`` first and moved into place file by file, so
an interrupted render leaves the previous report intact. The same JSON always gives the same
bytes. Exit status 2 (with every problem listed, file by file) when a results file is malformed.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnspec.reports._io import Results, ResultsError, StagedOutput, load_results

__all__ = ["main", "render"]

PROG = "python -m attnspec.reports.render"
COMMANDS = """\
nox -s conformance   # Hypothesis suite -> reports/results/conformance-<backend>-<device>.json
nox -s bench         # benchmark grid   -> reports/results/bench-<backend>-<device>.json
nox -s report        # this report: python -m attnspec.reports.render"""
_ENV_LABELS = (
    ("attnspec", "attnspec"),
    ("git_commit", "git commit"),
    ("python", "python"),
    ("platform", "platform"),
    ("frameworks", "frameworks"),
    ("numerics_policy", "numerics policy"),
    ("hypothesis_profile", "Hypothesis profile"),
    ("hypothesis_seed", "Hypothesis seed"),
    ("date", "date"),
    ("elapsed_s", "elapsed (s)"),
)


def _value(x: Any) -> str:
    if isinstance(x, dict):
        return ", ".join(f"{k}={_value(x[k])}" for k in sorted(x)) or "—"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (list, tuple)):
        return ", ".join(_value(v) for v in x) or "—"
    return "—" if x is None else str(x)


def _environment(env: dict[str, Any]) -> list[list[str]]:
    rows = []
    for key, label in _ENV_LABELS:
        if key not in env:
            continue
        value = env[key]
        if key == "git_commit" and env.get("git_dirty"):
            value = f"{value} (with uncommitted changes)"
        elif key == "frameworks" and isinstance(value, dict):
            value = ", ".join(f"{k} {value[k]}" for k in sorted(value))
        rows.append([label, _value(value)])
    known = {k for k, _ in _ENV_LABELS} | {"git_dirty"}
    rows += [[k, _value(env[k])] for k in sorted(env) if k not in known]
    return rows


def _relpath(target: Path, start: Path) -> str:
    try:
        return Path(os.path.relpath(target, start)).as_posix()
    except ValueError:  # another drive on Windows
        return target.resolve().as_posix()


def index_page(
    results: Results,
    out: Path,
    figures: dict[str, list[tuple[str, str]]],
    notes: list[str],
    copy_task: Sequence[str] = (),
) -> str:
    """The Markdown of ``index.md``; ``copy_task`` is its "Copy task" section, if any."""
    from attnspec.reports._md import fence, table
    from attnspec.reports.accuracy import run_key, verdict

    source = _relpath(results.directory, out)
    lines = [
        "# attnspec reports",
        "",
        f"Rendered by `{PROG}` from the results JSON in `{source}`; do not edit by hand.",
        "",
        "- [Accuracy](accuracy.md): conformance to the golden specification per backend, device,",
        "  function, feature and dtype, with verdicts and every failure's reproducer.",
        "- [Deviations](deviations.md): declared deviations of the frameworks' native primitives,",
        "  the adapter fix-up covering each, and whether each run observed it.",
        "- [Performance](performance.md): time, throughput against the device's matmul rate,",
        "  peak memory, and the performance targets.",
    ]
    if any(results.directory.glob("atlas-*.json")) if results.directory.is_dir() else False:
        lines += [
            "- [The attention atlas](atlas.md): implementations nobody here wrote (MLX, tinygrad, Keras,",
            "  Flax, transformers, flex_attention, Pallas...) against the spec, one cross-table.",
        ]
    if results.conformance:
        rows = [
            [d["backend"], d["device"], d.get("device_name"), verdict(d)]
            for d in sorted(results.conformance, key=run_key)
        ]
        lines += ["", "## Verdicts", "", table(["backend", "device", "device name", "verdict"], rows)]
    lines += [
        "",
        "## How these reports are produced",
        "",
        fence(COMMANDS, "sh"),
        "",
        "Each run writes one JSON file per backend and device; results from other machines (a GPU",
        f"host, say) are merged by copying their files into `{source}` before `nox -s report`.",
        "Rendering never runs a backend: it only reads those files.",
        "",
        "## Machines and runs",
        "",
    ]
    docs = [("conformance", d) for d in results.conformance] + [("bench", d) for d in results.bench]
    docs += [("lsh quality", d) for d in results.lsh_quality]
    docs.sort(key=lambda kd: kd[1]["_file"])
    if docs:
        rows = []
        for kind, d in docs:
            env = d.get("environment") or {}
            rows.append(
                [
                    f"[`{d['_file']}`]({source}/{d['_file']})",
                    kind,
                    d.get("backend"),
                    d.get("device"),
                    d.get("device_name"),
                    env.get("date"),
                    env.get("git_commit"),
                ]
            )
        lines += [
            table(["results file", "kind", "backend", "device", "device name", "date", "git commit"], rows)
        ]
        for _, d in docs:
            env = d.get("environment") or {}
            if env:
                lines += [
                    "",
                    f"### Environment of `{d['_file']}`",
                    "",
                    table(["setting", "value"], _environment(env)),
                ]
    else:
        lines += ["No results yet: run `nox -s conformance` and `nox -s bench`."]
    lines += list(copy_task)
    if any(figures.values()):
        lines += ["", "## Plots"]
        for section, items in figures.items():
            if items:
                lines += ["", f"### {section}", "", "\n\n".join(f"![{t}]({p})" for t, p in items)]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _make_plots(results: Results, staged: StagedOutput, notes: list[str]):
    try:
        from attnspec.reports import plots
    except ImportError as exc:
        notes.append(f"Plots skipped: matplotlib is not importable ({exc}); install `attnspec[report]`.")
        return [], {}, None, []
    heat = plots.weight_heatmaps(staged)
    lsh = plots.lsh_heatmap(staged)
    if isinstance(lsh, str):
        notes.append(lsh)
        lsh_figs = []
    else:
        heat = [*heat, lsh]
        lsh_figs = [lsh]
    perf = plots.perf_plots(results, staged)
    quality = plots.lsh_quality_plot(results, staged)
    return heat, perf, quality, lsh_figs


def render(
    results_dir: str | os.PathLike = "reports/results",
    out_dir: str | os.PathLike = "reports",
    *,
    plots: bool = True,
) -> list[str]:
    """Render every results file of ``results_dir`` into ``out_dir``; return the files written.

    Raises `ResultsError` (before touching ``out_dir``) if a results file is malformed.
    """
    from attnspec.reports.accuracy import accuracy_page
    from attnspec.reports.atlas import atlas_page, load_atlas
    from attnspec.reports.deviations import deviations_page
    from attnspec.reports.performance import performance_page

    results = load_results(results_dir)
    copy_doc = _copy_task_doc(results.directory)
    out = Path(out_dir)
    notes: list[str] = []
    if not results.directory.is_dir():
        notes.append(f"The results directory `{_relpath(results.directory, out)}` does not exist.")
    if not results.conformance:
        notes.append("No conformance results: run `nox -s conformance`.")
    if not results.bench:
        notes.append("No benchmark results: run `nox -s bench`.")
    if not plots:
        notes.append("Plots were not rendered (`--no-plots`).")
    with StagedOutput(out) as staged:
        heat, perf, quality, _ = _make_plots(results, staged, notes) if plots else ([], {}, None, [])
        details: dict[str, str] = {}
        staged.write_text("accuracy.md", accuracy_page(results, heat, details))
        for rel, text in details.items():
            staged.write_text(rel, text)
        staged.write_text("deviations.md", deviations_page(results))
        staged.write_text("performance.md", performance_page(results, perf, quality))
        atlas = load_atlas(results.directory) if results.directory.is_dir() else []
        if atlas:
            staged.write_text(
                "atlas.md", atlas_page(atlas, results.conformance, _relpath(results.directory, out))
            )
        figures = {
            "Attention weights of the golden specification": heat,
            "Time and memory against sequence length": [f for fs in perf.values() for f in fs],
            "LSH approximation error": [quality] if quality else [],
        }
        copy_lines = _copy_task_section(copy_doc, staged, _relpath(results.directory, out), plots)
        mutation = results.directory / "mutation.json"
        if mutation.is_file():  # nox -s mutation (#28)
            from attnspec.reports.mutation import load as load_mutation
            from attnspec.reports.mutation import mutation_page

            staged.write_text(
                "mutation.md",
                mutation_page(load_mutation(mutation), f"{_relpath(results.directory, out)}/mutation.json"),
            )
        staged.write_text("index.md", index_page(results, out, figures, notes, copy_lines))
        written = list(staged.written)
    return sorted(written)


def _copy_task_doc(directory: Path) -> dict[str, Any] | None:
    """The copy-task results (`attnspec.bench.copy_task`), checked, or None if there are none."""
    from attnspec.reports import copy_task_report

    path = directory / "copy_task.json"
    return copy_task_report.load(path) if path.is_file() else None


def _copy_task_section(
    doc: dict[str, Any] | None, staged: StagedOutput, source: str, plots: bool
) -> list[str]:
    from attnspec.reports import copy_task_report

    if doc is None:
        return []
    figure = None
    if plots and importlib.util.find_spec("matplotlib") is not None:  # else _make_plots said so
        figure = "plots/copy_task.png"
        copy_task_report.plot(doc, staged.path(figure))
    return copy_task_report.index_section(doc, source, figure)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (0 ok, 2 malformed results)."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", default="reports/results", help="directory of results JSON")
    parser.add_argument("--out", default="reports", help="directory to write the report into")
    parser.add_argument("--no-plots", action="store_true", help="skip the matplotlib figures")
    args = parser.parse_args(argv)
    try:
        written = render(args.results, args.out, plots=not args.no_plots)
    except ResultsError as exc:
        print(f"{PROG}: cannot render: malformed results (nothing was written):\n{exc}", file=sys.stderr)
        return 2
    except ImportError as exc:
        if exc.name != "tabulate":
            raise
        print(f"{PROG}: {exc}; install the report extra: pip install 'attnspec[report]'", file=sys.stderr)
        return 2
    print(f"{PROG}: wrote {len(written)} files under {args.out}: {', '.join(written)}")
    print(verdict_table(load_results(args.results)))
    print(f"read it: {Path(args.out) / 'index.md'}")
    return 0


def verdict_table(results: Results) -> str:
    """One line per conformance run: backend, device, cases by status, seconds, and when and at which
    commit it ran (the main job's end). The table reads every results file, so a run of one backend
    also lists the others' earlier results: their date and commit tell them apart."""
    rows = [
        [
            "backend",
            "device",
            "passed",
            "failed",
            "unsupported",
            "deviations",
            "crashed/hung",
            "seconds",
            "finished",
            "commit",
        ]
    ]
    for d in sorted(results.conformance, key=lambda d: (d["backend"], d["device"])):
        tot = {
            s: sum(r.get(s, 0) for r in d["rows"])
            for s in ("passed", "failed", "unsupported", "deviation", "crashed", "timeout")
        }
        env = d.get("environment") or {}
        seconds = env.get("elapsed_s")
        rows.append(
            [
                d["backend"] + (" (incomplete)" if d.get("incomplete") else ""),
                d["device"],
                *(str(tot[s]) for s in ("passed", "failed", "unsupported", "deviation")),
                str(tot["crashed"] + tot["timeout"]),
                "—" if seconds is None else f"{seconds:.0f}",
                str(env.get("date") or "—").replace("T", " ").removesuffix("Z")[:16],
                str(env.get("git_commit") or "—"),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows)


if __name__ == "__main__":
    sys.exit(main())
