"""The cases of the sdpa_vjp properties (``test_grads.py``) and of their conformance vectors
(`attnspec.conformance.vectors_families`): a drawn sdpa case with its upstream gradient, the case
with its visibility as one explicit mask, and the case with hidden keys poisoned."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, tag_visibility
from attnspec.conformance.judge import plan_of

__all__ = ["empty_row_problems", "poison_hidden_keys", "vjp_case"]


def vjp_case(case: SDPACase) -> tuple[SDPACase, np.ndarray]:
    """The case tagged ``vjp`` (without the forward's return_weights and return_lse) and its d_out:
    standard normal from the case's seed, in its dtype."""
    options = {k: v for k, v in case.options.items() if k not in ("return_weights", "return_lse")}
    case = replace(case, options=options, tags=(case.tags - {"lse"}) | {"vjp"})
    shape = plan_of(case).out_shape
    d_out = np.random.default_rng(case.seed ^ 0x5EED).standard_normal(shape).astype(NP_DTYPES[case.dtype])
    return case, d_out


def poison_hidden_keys(base, hidden: np.ndarray, poison: float):
    """(clean, d_out, poisoned): ``base`` with keys ``hidden`` (bool over m) hidden by its mask
    and, in ``poisoned`` only, their keys and values set to ``poison``; ``d_out`` is clean's. The
    masked_keys_get_zero property and its conformance vectors (`attnspec.conformance.vectors_families`)
    build their cases with it."""
    mask = base.options.get("mask")
    n, m = base.q.shape[-2], base.k.shape[-2]
    options = {**base.options, "mask": (np.ones((n, m), bool) if mask is None else mask) & ~hidden}
    k, v = base.k.copy(), base.v.copy()
    k[..., hidden, :] = poison
    v[..., hidden, :] = poison
    tags = set(base.tags)
    tag_visibility(tags, base.q, k, v, options)
    clean, d_out = vjp_case(replace(base, options=options, tags=frozenset(tags)))
    return clean, d_out, replace(clean, k=k, v=v)


def empty_row_problems(grads: dict[str, np.ndarray], dq_name: str, empty, rows: str) -> list[str]:
    """What breaks "empty rows zero and finite" in float64 gradients: a NaN/inf in any of
    ``grads`` (by name; the inputs are finite), or a nonzero ``grads[dq_name]`` (broadcast to
    ``empty.shape`` plus its feature axis) on an ``empty`` row (``rows`` says which rows those are)."""
    problems = [
        f"{name} has {int((~np.isfinite(g)).sum())} NaN/inf entries; the inputs are finite, so every "
        "gradient must be"
        for name, g in grads.items()
        if not np.isfinite(g).all()
    ]
    dq = np.broadcast_to(grads[dq_name], (*empty.shape, grads[dq_name].shape[-1]))
    if empty.any() and not (dq[empty] == 0).all():
        problems.append(
            f"{dq_name} of the {int(empty.sum())} {rows} is not exactly 0 "
            f"(max |{dq_name}| there {np.nanmax(np.abs(dq[empty]), initial=0):.3e})"
        )
    return problems
