"""A visibility array as an inline SVG grid: one row per query, one column per key."""

from __future__ import annotations

import numpy as np

CELL = 22
PAD = 26  # room for the key numbers above and the query numbers on the left


def grid(visible: np.ndarray, title: str) -> str:
    """(n, m) bool -> an <svg> whose filled cells are the keys each query row sees."""
    n, m = visible.shape
    width, height = PAD + m * CELL + 2, PAD + n * CELL + 2
    parts = [
        f'<svg class="attnspec-grid" role="img" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{_escape(title)}</title>",
    ]
    for j in range(m):
        parts.append(f'<text x="{PAD + j * CELL + CELL / 2}" y="{PAD - 8}" text-anchor="middle">{j}</text>')
    for i in range(n):
        y = PAD + i * CELL
        parts.append(f'<text x="{PAD - 6}" y="{y + CELL / 2 + 4}" text-anchor="end">{i}</text>')
        for j in range(m):
            cls = "seen" if visible[i, j] else "hidden"
            parts.append(f'<rect class="{cls}" x="{PAD + j * CELL}" y="{y}" width="{CELL}" height="{CELL}"/>')
    parts.append("</svg>")
    return "".join(parts)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
