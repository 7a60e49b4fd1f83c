"""Markdown building blocks shared by the pages: tables, fenced code, number formatting."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from attnspec.reports._io import as_float

DASH = "—"


def cell(x: Any) -> str:
    """A table cell: pipes escaped and line breaks flattened, so the table stays one row per line."""
    if x is None:
        return DASH
    return re.sub(r"\s*\n\s*", " ", str(x)).replace("|", "\\|")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A pipe table; ``align`` has one letter per column: l(eft), r(ight) or c(enter)."""
    from tabulate import tabulate  # here, not at import: a page's words (a verdict) need no table

    names = {"l": "left", "r": "right", "c": "center"}
    colalign = [names[a] for a in align] if align else None
    body = [[cell(x) for x in row] for row in rows]
    text = tabulate(body, headers=list(headers), tablefmt="pipe", colalign=colalign, disable_numparse=True)
    # tabulate pads every cell to its column's widest: one long note made a 1000-character row of
    # every row of a report. Markdown needs no padding, so cells keep one space on each side.
    return "\n".join(_unpad(line) for line in text.splitlines())


def _unpad(line: str) -> str:
    cells = re.split(r"(?<!\\)\|", line)[1:-1]  # cell text escapes "|" as "\|"
    return "| " + " | ".join(c.strip() for c in cells) + " |"


def fence(text: str, lang: str = "") -> str:
    """A fenced code block whose fence is longer than any backtick run inside ``text``."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}"


def num(x: Any, digits: int = 3) -> str:
    """A measured value with ``digits`` significant digits; "inf"/"nan" as such; None as a dash."""
    v = as_float(x)
    if v is None:
        return DASH
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if v == 0:
        return "0"
    return f"{v:.{digits}g}"


def pct(x: Any) -> str:
    v = as_float(x)
    return DASH if v is None else f"{100 * v:.1f}%"


def seconds(x: Any) -> str:
    v = as_float(x)
    if v is None or not math.isfinite(v):
        return num(v)
    for unit, factor in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(v) >= factor:
            return f"{v / factor:.3g} {unit}"
    return f"{v / 1e-9:.3g} ns"


def nbytes(x: Any) -> str:
    v = as_float(x)
    if v is None or not math.isfinite(v):
        return num(v)
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(v) >= factor:
            return f"{v / factor:.3g} {unit}"
    return f"{int(v)} B"


def anchor(text: str) -> str:
    """The GitHub heading anchor of ``text`` (lower case, punctuation dropped, spaces to dashes)."""
    slug = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return slug.replace(" ", "-")


def run_label(doc: dict[str, Any]) -> str:
    return f"{doc['backend']} / {doc['device']}"
