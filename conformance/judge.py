"""The judge of an sdpa output: one verdict for every property that compares a call with the golden.

`judge_output` checks the output (and the weights and lse when the call returned them) for shape,
dtype and device, compares each with the golden within the tolerance rule, and on a failure names
the causes (`attnspec.conformance.causes`) and attaches the reproducer. The chapters
(``test_sdpa.py``, ``test_variants.py``, ``test_long.py``, ``test_serving.py``, ``test_blocked.py``) all call it;
`plan_of` is the validated plan of a drawn case.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.conformance.causes import sdpa_causes
from attnspec.conformance.hypothesis_helpers import SDPACase, case_plan, full_visibility, tag_visibility
from attnspec.conformance.pytest_helpers import (
    Verdict,
    call_sdpa,
    check_metadata,
    failure_message,
    golden_for,
)
from attnspec.spec.tolerance import compare

__all__ = ["explicit_mask_case", "judge_call", "judge_output", "plan_of"]


def plan_of(case: SDPACase):
    """The spec's validated `SDPAPlan` of a case's call."""
    return case_plan(case.q, case.k, case.v, case.options)[0]


def explicit_mask_case(case: SDPACase, keep: tuple[str, ...] = ("bias", "scale")) -> SDPACase:
    """The same case with every visibility rule folded into one explicit mask, of the golden's
    (..., Hq, n, m) shape ((n, m) for a headless call), and of its other options only ``keep``.
    The tags follow the new call (a mask with batch axes q and k lack is tagged so, and the
    deviations that apply follow)."""
    vis = full_visibility(plan_of(case), case.options)
    if case.q.ndim == 2:
        vis = vis.reshape(vis.shape[-2:])
    options = {**{k: v for k, v in case.options.items() if k in keep}, "mask": vis}
    tags = set(case.tags)
    tag_visibility(tags, case.q, case.k, case.v, options)
    return replace(case, options=options, tags=frozenset(tags))


def judge_call(backend, device, prop, case, golden_case=None) -> Verdict:
    """Call ``backend``'s sdpa on ``case`` and judge what it returns (`judge_output`)."""
    return judge_output(backend, device, prop, case, call_sdpa(backend, case, device), golden_case)


def judge_output(backend, device, prop, case, result, golden_case=None, **extra) -> Verdict:
    """The verdict on ``result``, what ``backend`` returned for ``case``: out, then weights and
    lse when asked. ``golden_case`` (default ``case``) is the call whose golden it must equal;
    ``extra`` goes to the failure message."""
    g = golden_for(golden_case or case)
    found = list(result) if isinstance(result, tuple) else [result]
    lse = found.pop() if case.options.get("return_lse") and len(found) > 1 else None
    out, weights = found[0], (found[1] if len(found) > 1 else None)
    problems = check_metadata(backend, out, g.out.shape, case.dtype, device)
    comparisons = {"out": compare(backend.to_numpy(out).astype(np.float64), g.out, g.allowed_out)}
    if case.options.get("return_lse"):
        if lse is None:
            problems.append("returned no lse, but return_lse=True asks for it last")
        else:
            assert g.lse is not None and g.allowed_lse is not None  # the golden has lse when asked
            problems += [
                p.replace("out.", "lse.")
                for p in check_metadata(backend, lse, g.lse.shape, plan_of(case).lse_dtype, device)
            ]
            comparisons["lse"] = compare(backend.to_numpy(lse).astype(np.float64), g.lse, g.allowed_lse)
    if case.options.get("return_weights") and weights is None:
        problems.append("return_weights=True returned no weights")
    # weights returned unasked on a call too large for the golden to make them are not judged
    if weights is not None and g.weights is not None:
        assert g.allowed_w is not None  # made with the golden's weights
        problems += [
            p.replace("out.", "weights.")
            for p in check_metadata(backend, weights, g.weights.shape, case.dtype, device)
        ]
        comparisons["weights"] = compare(backend.to_numpy(weights).astype(np.float64), g.weights, g.allowed_w)
    if problems or not all(c.ok for c in comparisons.values()):
        causes = problems[:1]
        if not problems:
            got_w = None if weights is None else backend.to_numpy(weights).astype(np.float64)
            judged = golden_case or case
            causes = sdpa_causes(
                plan_of(case),
                full_visibility(plan_of(judged), judged.options),
                case.q,
                case.k,
                case.v,
                backend.to_numpy(out).astype(np.float64),
                g.out,
                g.allowed_out,
                got_w,
                bias=case.options.get("bias"),
            )
            # what the function's calling convention saw in this output (a NaN read from a paged
            # cache's trap slots), unless the spec's own inputs explain it already
            if not any(c.startswith("a hidden key's NaN/inf reached") for c in causes):
                causes += getattr(backend, "last_causes", None) or []
        return Verdict(
            "failed",
            comparisons,
            failure_message(backend.name, prop, case, device, comparisons, problems, causes=causes, **extra),
        )
    return Verdict("passed", comparisons)
