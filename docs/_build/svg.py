"""A clause's picture as an inline SVG grid: one row per query (or head), one column per key.

A `Picture` is computed from the spec's code when the site is built (`pictures`); `draw` lays it
out with its axis titles, its row and column numbers and a legend, in the theme's colours
(docs/assets/attnspec.css), so that it reads in both the light and the dark scheme.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CELL = 22  # a cell without text; with text, as wide as its longest text needs
LEFT = 30  # room for the row numbers
TOP = 40  # room for the column axis title and the column numbers
GAP = 12  # between the columns before `split` and those after


@dataclass
class Picture:
    """cells: (n, m) str, each cell's kind (a CSS class: seen, hidden, dropped, zero, pass, fail,
    heat); shade: (n, m) in [0, 1], how dark a "heat" cell is; text: (n, m) str printed in cells."""

    cells: np.ndarray
    caption: str
    legend: list[tuple[str, str]]  # (kind, what it means), in the order shown
    rows: str = "query row i"
    cols: str = "key j"
    row_ticks: list[str] | None = None
    col_ticks: list[str] | None = None
    shade: np.ndarray | None = None
    text: np.ndarray | None = None
    split: int | None = None  # columns from here on are a second block (after a gap)
    heat_range: tuple[str, str] | None = None  # the legend's words for the lightest and darkest heat


def mask(visible: np.ndarray, caption: str, **kw) -> Picture:
    """A visibility array: filled where the key is visible."""
    cells = np.where(np.asarray(visible, bool), "seen", "hidden")
    return Picture(cells, caption, [("seen", "visible"), ("hidden", "not visible")], **kw)


def heat(
    values: np.ndarray,
    caption: str,
    low: str,
    high: str,
    *,
    hidden=None,
    hidden_label: str = "not visible",
    digits: int = 2,
    **kw,
) -> Picture:
    """Values >= 0 as shades of one colour, each printed; ``hidden`` (n, m) bool cells drawn empty."""
    values = np.asarray(values, np.float64)
    top = float(np.nanmax(values)) if values.size and np.isfinite(values).any() else 1.0
    shade = np.clip(values / top, 0, 1) if top > 0 else np.zeros_like(values)
    cells = np.full(values.shape, "heat", dtype=object)
    legend = [("heat", "value (darker: larger)")]
    if hidden is not None:
        cells[np.asarray(hidden, bool)] = "hidden"
        legend.append(("hidden", hidden_label))
    text = np.vectorize(lambda x: _number(x, digits))(values)
    text = np.where(cells == "hidden", "", text)
    kw.setdefault("legend", legend)
    return Picture(cells.astype(str), caption, shade=shade, text=text, heat_range=(low, high), **kw)


def draw(pic: Picture, title: str) -> str:
    """The <svg> of ``pic``; ``title`` is its accessible name."""
    n, m = pic.cells.shape
    texts = pic.text if pic.text is not None else np.full((n, m), "", dtype=object)
    longest = max([len(str(t)) for t in np.ravel(texts)] + [len(t) for t in (pic.col_ticks or [])] + [0])
    cw = max(CELL, 7 * longest + 8)
    left = max(LEFT, 7 * max([len(t) for t in (pic.row_ticks or [])] + [2]) + 22)
    gap = GAP if pic.split is not None else 0

    def x0(j: int) -> float:
        return left + j * cw + (gap if pic.split is not None and j >= pic.split else 0)

    width = left + m * cw + gap + 8
    legend_y = TOP + n * CELL + 16
    parts_legend = []
    x = 4
    shown = set(np.ravel(pic.cells))
    for kind, words in [(kind, words) for kind, words in pic.legend if kind in shown]:
        if kind == "heat" and pic.heat_range:
            low, high = pic.heat_range
            parts_legend.append(f'<text x="{x}" y="{legend_y + 11}">{_esc(low)}</text>')
            x += 7 * len(low) + 6
            for s in (0.15, 0.4, 0.7, 1.0):
                parts_legend.append(
                    f'<rect class="heat" x="{x}" y="{legend_y}" width="14" height="14" fill-opacity="{s}"/>'
                )
                x += 15
            parts_legend.append(f'<text x="{x + 4}" y="{legend_y + 11}">{_esc(high)}</text>')
            x += 7 * len(high) + 20
            continue
        parts_legend.append(f'<rect class="{kind}" x="{x}" y="{legend_y}" width="14" height="14"/>')
        parts_legend.append(f'<text x="{x + 19}" y="{legend_y + 11}">{_esc(words)}</text>')
        x += 19 + 7 * len(words) + 16
    legend_w = x
    width = max(width, legend_w, 7 * (len(pic.rows) + len(pic.cols)) + 120)
    height = legend_y + 22
    parts = [
        f'<svg class="attnspec-grid" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{_esc(title)}</title>",
        f'<text class="axis" x="4" y="13">rows ↓ {_esc(pic.rows)}; columns → {_esc(pic.cols)}</text>',
    ]
    col_ticks = pic.col_ticks or [str(j) for j in range(m)]
    row_ticks = pic.row_ticks or [str(i) for i in range(n)]
    for j in range(m):
        parts.append(
            f'<text x="{x0(j) + cw / 2}" y="{TOP - 6}" text-anchor="middle">{_esc(col_ticks[j])}</text>'
        )
    for i in range(n):
        y = TOP + i * CELL
        parts.append(
            f'<text x="{left - 6}" y="{y + CELL / 2 + 4}" text-anchor="end">{_esc(row_ticks[i])}</text>'
        )
        for j in range(m):
            kind = pic.cells[i, j]
            opacity = ""
            if kind == "heat" and pic.shade is not None:
                opacity = f' fill-opacity="{0.08 + 0.92 * float(pic.shade[i, j]):.2f}"'
            parts.append(f'<rect class="{kind}" x="{x0(j)}" y="{y}" width="{cw}" height="{CELL}"{opacity}/>')
            if texts[i, j]:
                dark = kind == "heat" and pic.shade is not None and pic.shade[i, j] > 0.55
                cls = "cell on" if dark or kind in ("seen", "fail", "dropped") else "cell"
                parts.append(
                    f'<text class="{cls}" x="{x0(j) + cw / 2}" y="{y + CELL / 2 + 4}" '
                    f'text-anchor="middle">{_esc(str(texts[i, j]))}</text>'
                )
    parts += parts_legend
    parts.append("</svg>")
    return "".join(p for p in parts if p)


def _number(x: float, digits: int) -> str:
    """A cell's number, short: 0, .25, 1.3, 12.5, 1.2e+03."""
    if x == 0:
        return "0"
    if 0 < x < 1:
        return f"{x:.{digits}f}".lstrip("0")
    return f"{x:.{digits}f}" if abs(x) < 100 else f"{x:.2g}"


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
