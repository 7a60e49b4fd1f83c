"""The spec's version and its labelled clauses: a stable id for every rule the spec decides.

The spec is versioned apart from the package (`SPEC_VERSION`, semantic versioning): a change
that can make a conforming result stop conforming (another result for an input already accepted,
a tighter tolerance, a clause removed or redefined) is a new major version; one that says more and
changes no verdict given (a new variant, a defined result where `SpecError` was raised, a looser
tolerance, a new clause) a minor one; a corrected clause title a patch; a change of wording or of
the kit's code none. ``spec/CHANGELOG.md`` records each semantic change with the version that
made it, and the policy.

Every rule has a clause id (`CLAUSES`), ``function.rule`` in lower case, never reused once
published. The semantics page (``spec/README.md``, "Clauses") lists them with the decision they
label; every conformance property states the clauses it checks (`PROPERTY_CLAUSES`), every case
the clauses its options exercise (`case_clauses`), and every failure names a clause beside its
cause (`failure_clauses`). Bundles of conformance vectors carry both the version and each case's
clauses, so a kernel judged without Python reports failures in the same words.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "CLAUSES",
    "PROPERTY_CLAUSES",
    "SPEC_VERSION",
    "Clause",
    "case_clauses",
    "clause",
    "clause_label",
    "failure_clauses",
    "property_clauses",
    "split_label",
]

#: the version of the semantics (not of the package): see spec/CHANGELOG.md
SPEC_VERSION = "1.1.0"


@dataclass(frozen=True)
class Clause:
    id: str
    title: str
    where: str  # the section or decision of spec/README.md that states it


def _load(path: Path) -> dict[str, Any]:
    """spec/clauses.toml: the clauses (``id = [title, where]``, in the semantics page's order) and
    the clauses each property checks."""
    return tomllib.loads(path.read_text(encoding="utf-8"))


_TABLE = _load(Path(__file__).with_name("clauses.toml"))
CLAUSES: dict[str, Clause] = {
    cid: Clause(cid, title, where) for cid, (title, where) in _TABLE["clauses"].items()
}


def clause(cid: str) -> Clause:
    """The clause ``cid``; a `KeyError` naming the known ones otherwise."""
    try:
        return CLAUSES[cid]
    except KeyError:
        raise KeyError(f"unknown clause {cid!r}; known: {', '.join(CLAUSES)}") from None


#: (function, property) -> the clauses the property checks on every case (the case adds its own)
PROPERTY_CLAUSES: dict[tuple[str, str], tuple[str, ...]] = {
    (function, prop): tuple(clauses)
    for function, table in _TABLE["properties"].items()
    for prop, clauses in table.items()
}


def property_clauses(function: str, prop: str) -> tuple[str, ...]:
    """The clauses property ``prop`` of ``function`` checks on every case (its function's
    definition when the pair is not listed)."""
    found = PROPERTY_CLAUSES.get((function, prop))
    if found is not None:
        return found
    guess = function.replace("lsh_attention", "lsh") + ".definition"
    return (guess,) if guess in CLAUSES else ("sdpa.definition",)


#: option name -> the clause a case that uses it exercises
_OPTION_CLAUSES = {
    "mask": "sdpa.mask",
    "bias": "sdpa.bias",
    "window": "sdpa.window",
    "scale": "sdpa.scale",
    "q_lengths": "sdpa.lengths",
    "kv_lengths": "sdpa.lengths",
    "softcap": "sdpa.softcap",
    "alibi_slopes": "sdpa.alibi",
    "sinks": "sdpa.sinks",
    "q_segment_ids": "sdpa.segments",
    "dropout_mask": "sdpa.dropout",
    "return_lse": "sdpa.lse",
    "return_weights": "sdpa.weights",
}
#: case tag -> clause
_TAG_CLAUSES = {
    "no_visible_row": "sdpa.empty_row",
    "masked_nonfinite": "sdpa.hidden_nonfinite",
    "gqa": "sdpa.gqa",
    "mqa": "sdpa.gqa",
    "finite_floor": "sdpa.visibility",
    "bias_neg_inf": "sdpa.bias",
    "empty": "sdpa.zero_sizes",
    "rank2": "sdpa.broadcast",
    "batch_broadcast": "sdpa.broadcast",
}


def case_clauses(
    options: Mapping[str, Any], tags: Iterable[str] = (), function: str = "sdpa"
) -> tuple[str, ...]:
    """The clauses a case exercises beyond its function's definition, from its options (a mask,
    a causal alignment, a variant...) and tags (a row with no visible key, a hidden NaN...), in
    `CLAUSES` order. For mha and the vjps the sdpa clauses apply through the per-head call."""
    found = set()
    for name, value in options.items():
        if value is None or value is False or (name == "dropout_p" and not value):
            continue
        if name in _OPTION_CLAUSES:
            found.add(_OPTION_CLAUSES[name])
        if name == "causal":
            found.add(f"sdpa.causal.{value}" if f"sdpa.causal.{value}" in CLAUSES else "sdpa.definition")
    for tag in tags:
        if tag in _TAG_CLAUSES:
            found.add(_TAG_CLAUSES[tag])
    if function in ("mha", "mha_vjp") and "sdpa.empty_row" in found:
        found.add("mha.empty_row")
    if function == "sdpa_vjp" and "sdpa.empty_row" in found:
        found.add("sdpa_vjp.empty_row")
    if function == "sdpa_vjp" and "sdpa.hidden_nonfinite" in found:
        found.add("sdpa_vjp.hidden_keys")
    if function in ("lsh_attention", "lsh_attention_vjp"):
        lsh = {"causal": "lsh.causal", "kv_lengths": "lsh.padding", "dedup": "lsh.dedup"}
        # `is`, not `in (None, False)`: kv_lengths is an array, whose == is elementwise
        found = {
            cid
            for name, cid in lsh.items()
            if options.get(name) is not None and options.get(name) is not False
        }
    return tuple(c for c in CLAUSES if c in found)


#: how a cause begins (`attnspec.conformance.causes.CAUSE_PREFIXES`, and the judge's) -> the clause it breaks
_CAUSE_CLAUSES = (
    ("row with no visible key", "sdpa.empty_row"),
    ("row with a visible key came out 0", "sdpa.visibility"),
    ("a hidden key's NaN/inf reached", "sdpa.hidden_nonfinite"),
    ("hidden keys took weight", "sdpa.visibility"),
    ("GQA heads tiled", "sdpa.gqa"),
    ("visible weights leak to hidden keys", "sdpa.visibility"),
    ("out.shape", "sdpa.broadcast"),
    ("out.dtype", "sdpa.output_dtype"),
    ("out.device", "sdpa.output_dtype"),
    ("lse.dtype", "sdpa.output_dtype"),
    ("returned no lse", "sdpa.lse"),
)


def failure_clauses(
    cause: str, function: str, prop: str, case_clause_ids: Iterable[str] = ()
) -> tuple[str, ...]:
    """The clauses a failure breaks: those its cause names when the cause is rule-specific (an
    empty row, a hidden NaN, tiled GQA heads...; each of its "; "-separated parts may name one),
    else those of the property and the case (what was exercised; the failure is somewhere in them)."""
    named = []
    for part in cause.split("; "):
        for prefix, cid in _CAUSE_CLAUSES:
            if part.startswith(prefix):
                if function in ("mha", "mha_vjp") and cid == "sdpa.empty_row":
                    cid = "mha.empty_row"
                elif function == "sdpa_vjp" and cid == "sdpa.empty_row":
                    cid = "sdpa_vjp.empty_row"
                named.append(cid)
                break
    if named:
        return tuple(dict.fromkeys(named))
    ids = dict.fromkeys((*property_clauses(function, prop), *case_clause_ids))
    return tuple(c for c in ids if c in CLAUSES)


def clause_label(ids: Iterable[str]) -> str:
    """How a message names clauses beside a cause: ``[clause sdpa.empty_row]``,
    ``[clauses sdpa.mask, sdpa.window]``; empty for none."""
    ids = list(dict.fromkeys(ids))
    if not ids:
        return ""
    return f"[clause{'s' * (len(ids) > 1)} {', '.join(ids)}]"


#: a label (`clause_label`) at the end of a line
_LABEL = re.compile(r"\s*\[clauses? ([a-z0-9_.]+(?:, [a-z0-9_.]+)*)\]\s*$")


def split_label(line: str) -> tuple[str, tuple[str, ...]]:
    """A line without the clause label that ends it, and the ids the label names (none when the
    line has no label): how a reader of a failure message (the recorder, the CLI) finds them."""
    found = _LABEL.search(line)
    if not found:
        return line, ()
    return line[: found.start()], tuple(found.group(1).split(", "))
