"""The atlas' declared deviations (``deviations.toml``), and checking them both ways.

ATLAS_DEVIATIONS              every entry, as `Deviation` (attnspec.backends.deviations):
                              the same record and TOML format as the built-in catalogue's,
                              each checked by an atlas question (question + answer)
check(backend, answers)       each entry: observed | stale | not_exercised; plus the undeclared
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnspec.backends.deviation_probe import Deviation, status
from attnspec.backends.deviations import ATLAS_SOURCE, load

__all__ = ["ATLAS_DEVIATIONS", "AtlasDeviation", "check"]

#: the atlas' entries are the one record type; the old name stays for code that imports it
AtlasDeviation = Deviation

#: an atlas answer a built-in native's catalogue entry covers (by its tags)
BUILTIN_STATUS = "declared in backends/deviations/*.toml (checked both ways by tests/test_deviations.py)"

ATLAS_DEVIATIONS = list(load(Path(__file__).with_name("deviations.toml"), source=ATLAS_SOURCE))


def check(backend: str, answers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(each declared entry of ``backend`` with its status, the answers that differ from the spec
    with no entry). An entry is observed when its question gives its answer, stale when the
    question gives another, not_exercised when the question could not be asked (n/a): `status`."""
    by_question = {a["id"]: a for a in answers}
    entries = []
    declared_questions = set()
    for d in (d for d in ATLAS_DEVIATIONS if d.backend == backend):
        declared_questions.add(d.question)
        got = by_question.get(d.question, {}).get("answer", "n/a")
        entries.append(
            {
                "id": d.id,
                "question": d.question,
                "declared": d.answer,
                "measured": got,
                "status": status(d, answers),
                "summary": d.native_does,
                "upstream": d.upstream,
            }
        )
    differing = [
        a
        for a in answers
        if a["spec"]
        and a["answer"] != a["spec"]
        and not a["answer"].startswith("n/a")
        and a["id"] not in declared_questions
    ]
    undeclared = []
    for a in differing:  # a built-in native's deviations are declared by suite tags instead
        from attnspec.backends.atlas.questions import QUESTION_TAGS
        from attnspec.backends.deviations import DEVIATIONS

        tags = QUESTION_TAGS.get(a["id"])
        builtin = [d for d in DEVIATIONS if d.backend == backend and tags and d.tags and set(d.tags) <= tags]
        if not builtin:
            undeclared.append(a)
            continue
        # tags cannot tell a key's NaN from a value's: the built-ins name it (torch.masked-nonfinite-k / -v)
        suffix = {"nan_hidden_key": "-k", "nan_hidden_value": "-v"}.get(a["id"])
        if suffix and any(d.deviation_id.endswith(suffix) for d in builtin):
            builtin = [d for d in builtin if d.deviation_id.endswith(suffix)]
        for dev in builtin:
            entries.append(
                {
                    "id": dev.deviation_id,
                    "question": a["id"],
                    "declared": dev.native_does[:120],
                    "measured": a["answer"],
                    "status": BUILTIN_STATUS,
                    "summary": dev.native_does.rstrip("."),
                    "upstream": "",
                }
            )
    return entries, undeclared
