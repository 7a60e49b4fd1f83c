"""How much of the spec a run exercised: the coverage a verdict states beside its counts.

A verdict of "conforms" on a run that exercised nothing is no verdict. `coverage(results)` reads
a results JSON (`attnspec.conformance.recorder`) and says, per spec function, which of the needs
of `attnspec.backends.conventions.NEEDS` (GQA, each rank, masks, causal alignments, variants...)
ran to a verdict and in how many cases, which the implementation refused (the probe's reason),
and which its convention cannot express. `gaps(cov)` lists what keeps a run from a verdict of
conformance: the implementation never called successfully; a need its convention can express
that never ran; a dtype asked for that never ran.

FP8 (`attnspec.backends.conventions.FP8_NEEDS`): an sdpa_fp8 case needs ``fp8`` (q, k, v in FP8
with descales) or ``fp8_kv_cache`` (its ``wide_q`` tag: a wide q over an FP8 cache). They are
reported for a convention that passes descales, and wherever an sdpa_fp8 case ran; a run of any
other convention is reported on `NEEDS` alone.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

__all__ = ["coverage", "gaps"]

#: needs that never come alone: a broadcast mask is a mask
IMPLIED = {"mask_broadcast": ("mask",)}
#: statuses of a case that ran to a verdict
VERDICTS = ("passed", "failed", "deviation")


def coverage(
    results: dict[str, Any], cases: list[dict[str, Any]] | None = None, convention: Any = None
) -> dict[str, Any]:
    """{"functions": {fn: {"cases": n, "called": n}}, "needs": {need: {...}}, "dtypes": {...}}.

    ``cases`` are the per-case records (the recorder's); without them only the rows are read, and
    the needs are not known. ``convention``: the `Convention` a checked function is called by
    (None for a backend). Each need: ``status`` one of ``ran`` (cases ran to a verdict),
    ``refused`` (the implementation refused it: the probe's reason), ``not expressible`` (the
    convention has no way to pass it: its reason), ``not run`` (expressible, not refused, and
    still no case ran it); ``cases`` how many ran, ``declined`` how many it declined one by one.
    """
    functions: dict[str, dict[str, int]] = defaultdict(lambda: {"cases": 0, "called": 0})
    dtypes: dict[str, Counter] = defaultdict(Counter)
    for row in results.get("rows", []):
        f = functions[row["function"]]
        f["cases"] += row["run"]
        if row["feature"] not in ("bad_input", "signature"):
            f["called"] += sum(row.get(s, 0) for s in VERDICTS)
            dtypes[row["dtype"]]["ran"] += sum(row.get(s, 0) for s in VERDICTS)
            dtypes[row["dtype"]]["unsupported"] += row.get("unsupported", 0)
    out: dict[str, Any] = {"functions": dict(functions), "dtypes": {d: dict(c) for d, c in dtypes.items()}}
    for r in results.get("capabilities") or ():  # why the probe found a dtype unusable
        if r["need"] == "dtype" and r["status"] != "ok":
            out["dtypes"].setdefault(r["dtype"], {})["reason"] = (
                f"{r['status']}: {r.get('reason') or r['status']}"
            )
    if cases is None:
        return out
    ran: Counter = Counter()
    declined: Counter = Counter()  # cases with the need that were refused
    by_function: Counter = Counter()  # ... by the function itself, not by its convention
    fp8_ran = False
    for c in cases:
        needs_of = list(c.get("needs") or ())
        if c.get("function") == "sdpa_fp8":
            needs_of.append("fp8_kv_cache" if "wide_q" in (c.get("tags") or ()) else "fp8")
            fp8_ran |= c["status"] in VERDICTS
        for need in needs_of:
            if c["status"] in VERDICTS:
                ran[need] += 1
            elif c["status"] == "unsupported":
                declined[need] += 1
                by_function[need] += "convention" not in (c.get("reason") or "")
    needs: dict[str, dict[str, Any]] = {}
    expressible, refused = _expressible(convention), _refused(results)
    from attnspec.backends.conventions import FP8_NEEDS, NEEDS

    fp8 = FP8_NEEDS if fp8_ran or getattr(convention, "descales", None) else ()
    for need in (*NEEDS, *fp8):
        entry: dict[str, Any] = {"cases": ran[need], "declined": declined[need]}
        if ran[need]:
            entry["status"] = "ran"
        elif need in refused:
            entry["status"], entry["reason"] = "refused", refused[need]
        elif expressible is not None and need in expressible:
            entry["status"], entry["reason"] = "not expressible", expressible[need]
        elif declined[need] and not by_function[need]:
            # every case drawn with it also asked for something the convention cannot express
            # (flash's lengths-aligned causal comes with lengths): the suite's reach, not the function's
            entry["status"] = "not reached"
            entry["reason"] = "every case with it needed something else the convention cannot express"
        else:
            entry["status"] = "not run"
        needs[need] = entry
    out["needs"] = needs
    return out


def _expressible(conv: Any) -> dict[str, str] | None:
    """need -> why ``conv`` cannot express it; None for a backend (it declares what it supports
    case by case)."""
    if conv is None:
        return None
    from attnspec.backends.conventions import FP8_NEEDS, NEEDS, Call

    why = {}
    for need in (*NEEDS, *FP8_NEEDS):
        needs = frozenset({need, *IMPLIED.get(need, ())})
        reasons = conv.refusals(Call(needs, 4, 4))
        if (
            reasons
            and not need.startswith("causal_")
            and any(
                not conv.refusals(Call(needs | {causal}, 4, 4))
                for causal in ("causal_lower_right", "causal_lower_right_lengths")
            )
        ):
            reasons = []  # an always-causal convention (vllm_paged) expresses it under causal
        if reasons:
            why[need] = "; ".join(reasons)
    return why


def _refused(results: dict[str, Any]) -> dict[str, str]:
    """need -> the probe's reason, for each need the probe found the implementation refusing."""
    found = {}
    for r in results.get("capabilities") or ():
        if r["need"] != "dtype" and r["status"] not in ("ok", "convention"):
            found[r["need"]] = f"{r['status']}: {r.get('reason') or r['status']}"
    return found


def gaps(cov: dict[str, Any], dtypes: tuple[str, ...] | None = None, function_only: bool = True) -> list[str]:
    """What keeps a run from a verdict of conformance, one line each (empty: nothing).

    ``dtypes``: the dtypes the user asked for (each must have run); ``function_only``: the run
    checked a plain function through a convention, so every need the convention can express must
    have run (a registered backend declares its own support and is held to the first rule only).
    """
    lines = []
    called = sum(f["called"] for f in cov["functions"].values())
    if called == 0:
        lines.append("the implementation was never called successfully: no case ran to a verdict")
        return lines
    for d in dtypes or ():
        if not cov["dtypes"].get(d, {}).get("ran"):
            why = cov["dtypes"].get(d, {}).get("reason")
            lines.append(f"dtype {d}: no case ran" + (f" (probe: {why})" if why else ""))
    if function_only and "needs" in cov:
        for need, e in cov["needs"].items():
            if e["status"] == "refused":
                lines.append(f"{need}: refused by the function ({e['reason']})")
            elif e["status"] == "not run":
                lines.append(
                    f"{need}: expressible by the convention, but no case ran it"
                    + (f" ({e['declined']} declined)" if e["declined"] else "")
                )
    return lines
