"""The copy task's results, read back: checked (`load`), the "Copy task" section of
``reports/index.md`` (`index_section`) and its figure (`plot`). `attnspec.bench.copy_task`
trains the model and writes the file; this module never imports torch or JAX.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from attnspec.reports._io import ResultsError, read_document

__all__ = ["SCHEMA", "index_section", "load", "plot"]

SCHEMA = "attnspec.copy_task/1"


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def load(path: str | Path) -> dict[str, Any]:
    """Read and check a copy-task results file; `ResultsError` names the file and the problem."""
    doc = read_document(path, SCHEMA)
    problems = []
    settings = doc.get("settings")
    keys = ("vocab", "n", "embed_dim", "num_heads", "batch", "eval_batch")
    if not isinstance(settings, dict) or not all(isinstance(settings.get(k), int) for k in keys):
        problems.append(f"settings: must be an object with integers {', '.join(keys)}")
        settings = {}
    n = settings.get("n")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        problems.append("runs: must be a non-empty list")
        runs = []
    for i, r in enumerate(runs):
        where = f"runs[{i}]"
        if not isinstance(r, dict):
            problems.append(f"{where}: must be an object")
            continue
        for key in ("framework", "version"):
            if not isinstance(r.get(key), str):
                problems.append(f"{where}: field {key!r} must be a string")
        losses = r.get("losses")
        if not isinstance(losses, list) or not all(_is_num(x) for x in losses):
            problems.append(f"{where}: field 'losses' must be a list of numbers")
        if not _is_num(r.get("wall_s")):
            problems.append(f"{where}: field 'wall_s' must be a number")
        for when in ("before", "after"):
            e = r.get(when)
            if not isinstance(e, dict):
                problems.append(f"{where}.{when}: must be an object")
                continue
            for key in ("loss", "accuracy", "diagonal_mass"):
                if not _is_num(e.get(key)):
                    problems.append(f"{where}.{when}: field {key!r} must be a number")
            w = e.get("weights")
            if w is None or np.shape(w) != (n, n) or not all(_is_num(x) for row in w for x in row):
                problems.append(f"{where}.{when}: field 'weights' must be (n, n) = ({n}, {n}) numbers")
    if problems:
        raise ResultsError("\n".join(f"{path}: {p}" for p in problems[:5]))
    return doc


def index_section(doc: dict[str, Any], source: str, figure: str | None) -> list[str]:
    """The "Copy task" section of ``index.md`` (Markdown lines): the setup, a table, the plot."""
    from attnspec.reports._md import num, seconds, table

    s = doc["settings"]
    rows = []
    for r in doc["runs"]:
        b, a = r["before"], r["after"]
        rows.append(
            [
                r["framework"],
                r["version"],
                f"{num(b['loss'])} → {num(a['loss'])}",
                f"{num(b['accuracy'])} → {num(a['accuracy'])}",
                f"{num(b['diagonal_mass'])} → {num(a['diagonal_mass'])}",
                len(r["losses"]),
                seconds(r["wall_s"]),
            ]
        )
    lines = [
        "",
        "## Copy task",
        "",
        "`backend.mha` in training: token embedding plus sinusoidal positions, one multi-head",
        "attention layer and a linear readout, with no residual connection, learn to output the",
        "token at each position. torch (autograd) and JAX (`jax.grad`) start from the same NumPy",
        f"parameters and see the same batches (V={s['vocab']}, n={s['n']}, E={s['embed_dim']}, "
        f"H={s['num_heads']}, batch {s['batch']},",
        f"{doc.get('dtype', 'float32')}, Adam with lr {s['lr']}). Diagonal mass: the mean weight of query i",
        f"on key i over {s['eval_batch']} held-out sequences and the heads; uniform attention gives",
        f"1/n = {num(1 / s['n'])}. Made by `python -m attnspec.bench.copy_task` (`nox -s demo`),",
        f"results in [`copy_task.json`]({source}/copy_task.json).",
        "",
        table(
            ["framework", "version", "held-out loss", "accuracy", "diagonal mass", "steps", "wall time"],
            rows,
            "llllrrr",
        ),
    ]
    if any(r.get("jit") is False for r in doc["runs"]):
        lines += [
            "",
            "JAX trained eagerly: `jax.jit` could not trace its `backend.mha` (the backend",
            "reads values back to the host to pick a code path), so its wall time is mostly",
            "per-operation dispatch and the compilation of the backend's jitted pieces under",
            "autodiff.",
        ]
    if "max_loss_difference" in doc:
        lines += [
            "",
            "Largest difference between the frameworks' training losses at the same step: "
            f"{num(doc['max_loss_difference'])}.",
        ]
    if figure:
        lines += ["", f"![Copy task: attention before and after training, and the loss]({figure})"]
    return lines


def plot(doc: dict[str, Any], path: str | Path, dpi: int = 90) -> None:
    """One row per framework: held-out attention before and after training, and the loss."""
    from matplotlib.figure import Figure

    runs, s = doc["runs"], doc["settings"]
    fig = Figure(figsize=(10.2, 3.0 * len(runs)))
    for row, r in enumerate(runs):
        for col, when in enumerate(("before", "after")):
            ax = fig.add_subplot(len(runs), 3, 3 * row + col + 1)
            e = r[when]
            im = ax.imshow(
                np.asarray(e["weights"], float), cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest"
            )
            fig.colorbar(im, ax=ax, shrink=0.85, label="weight")
            ax.set_title(
                f"{r['framework']} {r['version']}, {when} training\ndiagonal mass "
                f"{e['diagonal_mass']:.3f}, accuracy {e['accuracy']:.3f}",
                fontsize=8,
            )
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
            ax.tick_params(labelsize=7)
        ax = fig.add_subplot(len(runs), 3, 3 * row + 3)
        steps = len(r["losses"])
        ax.plot(np.arange(1, steps + 1), r["losses"], lw=1.0, label="training batch")
        ax.axhline(
            math.log(s["vocab"]),
            color="gray",
            ls=":",
            lw=1.0,
            label=f"ln V = {math.log(s['vocab']):.2f} (chance)",
        )
        ax.plot([steps], [r["after"]["loss"]], "o", color="crimson", ms=4, label="held-out, after")
        ax.set_yscale("log")
        ax.set_xlabel("Adam step")
        ax.set_ylabel("cross-entropy")
        eager = ", eager (no jax.jit)" if r.get("jit") is False else ""
        ax.set_title(f"{r['framework']}: loss, {r['wall_s']:.1f} s for {steps} steps{eager}", fontsize=8)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=6)
    fig.suptitle(
        f"Copy task through backend.mha: V={s['vocab']}, n={s['n']}, E={s['embed_dim']}, "
        f"H={s['num_heads']}, batch {s['batch']}; weights averaged over "
        f"{s['eval_batch']} held-out sequences and the heads",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, metadata={"Software": None})  # no version: stable bytes
