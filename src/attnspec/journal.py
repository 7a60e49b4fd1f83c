"""Reading a journal: one JSON object a line, appended by a child process that may die mid-line."""

from __future__ import annotations

import json
from pathlib import Path


def read_journal(path: Path) -> list[dict]:
    """Every complete event of ``path`` (none if it does not exist); a line cut by a crash is skipped."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a line cut by the crash
    return events
