"""The cases of the sdpa_vjp properties (``test_grads.py``) and of their conformance vectors
(`attnspec.conformance.vectors_families`): a drawn sdpa case with its upstream gradient, the case
with its visibility as one explicit mask, and the case with hidden keys poisoned."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase, full_visibility, tag_visibility
from attnspec.conformance.judge import plan_of

__all__ = ["explicit_mask_case", "poison_hidden_keys", "vjp_case"]


def vjp_case(case: SDPACase) -> tuple[SDPACase, np.ndarray]:
    """The case tagged ``vjp`` (without the forward's return_weights and return_lse) and its d_out:
    standard normal from the case's seed, in its dtype."""
    options = {k: v for k, v in case.options.items() if k not in ("return_weights", "return_lse")}
    case = replace(case, options=options, tags=(case.tags - {"lse"}) | {"vjp"})
    shape = plan_of(case).out_shape
    d_out = np.random.default_rng(case.seed ^ 0x5EED).standard_normal(shape).astype(NP_DTYPES[case.dtype])
    return case, d_out


def explicit_mask_case(case: SDPACase) -> SDPACase:
    """The case with every visibility rule folded into one explicit mask (bias and scale kept)."""
    vis = full_visibility(plan_of(case), case.options)
    if case.q.ndim == 2:
        vis = vis.reshape(vis.shape[-2:])
    opts = {k: v for k, v in case.options.items() if k in ("bias", "scale")}
    return replace(case, options={**opts, "mask": vis})


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
