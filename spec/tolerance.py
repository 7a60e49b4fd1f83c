"""The tolerance rule: how far a backend may be from the float64 golden.

For a case with inputs of dtype D:

    golden   = the spec's result (float64 arithmetic, one final rounding to D)
    ref      = the same algorithm with every stored intermediate rounded to D (for float16 and
               bfloat16 each operation runs in float32 first, as fused kernels accumulate)
    err_ref  = max |ref - golden|
    allowed  = K * err_ref + floor
    floor    = eps(D) * V * (1 + sqrt(m) + 2 * sqrt(dk) * L)

    K = 4: an implementation that rounds as often as the reference, in another order, can be off
        by the reference's error once more (2x); fused kernels rescale their running sums once per
        key block, which can double that again.
    V = the largest finite |v| (the scale of the output); L = the largest scale * sum_d |q_d k_d|
        plus |bias| over visible pairs (the scale of the logits). A pair whose product term is
        exactly 0 has the logit 0 + bias, the stored bias, exact in any dtype: its |bias|, however
        large (-1e9, finfo.min), adds no rounding error and does not count (`_logit_scale`).
    floor: the first-order error of an implementation that is as exact as its dtype allows but
        sums in another order: the final rounding (1), the weighted sum of up to m values (sqrt(m),
        random-walk growth), and a logit error of sqrt(dk) * eps * L, which moves each weight by up
        to twice that relative amount. It matters where err_ref is 0, always so in float64, where
        the reference *is* the golden. It is the floor that the FlashAttention and PyTorch SDPA
        test rule lacks.

A backend's result passes when every finite element is within ``allowed`` of the golden and
every non-finite element equals the golden's (same positions, same signs, NaN for NaN). The
report shows ``budget used = max error / allowed``: 1.0 is the edge.

Weights use the same rule with V = 1 (they are probabilities).

The variants (issue #15) enter L: the ALiBi term |slope * (i' - j)| adds to each visible logit's
magnitude, and a sink is one more logit (L >= |sink|). softcap only shrinks logits and its tanh
has slope <= 1, so it passes a logit error through at most unchanged: L stays a bound. The
weights of a row with a sink sum to less than 1, which the V = 1 rule covers as it is. The log-
sum-exp gets a rule of its own, `lse_allowed`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from attnspec.spec.dtypes import FLOAT_DTYPES, NUMPY_DTYPES, compute_dtype_name, eps
from attnspec.spec.masks import visible
from attnspec.spec.sdpa import attention_core, finish
from attnspec.spec.validate import NO_EXTRAS, SDPAExtras, SDPAPlan

K = 4.0
#: float dtype name -> NumPy scalar type, from the one dtype table (`attnspec.spec.dtypes`)
_NP = {name: NUMPY_DTYPES[name].type for name in FLOAT_DTYPES}


def reference_sdpa(
    plan: SDPAPlan, q, k, v, mask, bias, return_weights: bool = False, extras: SDPAExtras = NO_EXTRAS
):
    """The golden algorithm run in the inputs' precision (the tolerance rule's ``ref``).

    Without weights, large inputs run in blocks of query rows (`visible_rows`): rows are
    independent, so each block is the same computation, in O(ROW_BLOCK_LOGITS) memory. Calls
    with a variant array (``extras``: ALiBi, sinks, segment ids, dropout) run whole, in
    O(n * m) memory, since ALiBi and "lower_right_lengths" need the rows' anchors. Returns what
    sdpa returns for the plan (lse last when ``plan.return_lse``; computed in the compute dtype
    from the rounded row max and denominator).
    """
    dt = _NP[plan.dtype]
    compute = _NP[compute_dtype_name(plan.dtype)]

    def rnd(x: np.ndarray) -> np.ndarray:
        return x.astype(dt).astype(compute)

    per_row = math.prod(plan.full_weights_shape) // max(plan.n, 1)
    has_extras = any(x is not None for x in dataclasses.astuple(extras))
    if return_weights or has_extras or plan.n * per_row <= ROW_BLOCK_LOGITS:
        out, w, lse = attention_core(plan, q, k, v, mask, bias, compute, rnd, extras, with_lse=True)
        return finish(plan, out, w, dt, return_weights, lse)
    vis = visibility_view(plan, mask, None)  # bias: attention_core drops its -inf keys itself
    step = max(1, ROW_BLOCK_LOGITS // per_row)
    outs, lses = [], []
    for i0 in range(0, plan.n, step):
        i1 = min(i0 + step, plan.n)
        # the structural rules are folded into the block's mask: the block's plan has none
        block = dataclasses.replace(
            plan, n=i1 - i0, causal=None, window=None, q_lengths=None, kv_lengths=None
        )
        out, _, lse = attention_core(
            block,
            q[..., i0:i1, :],
            k,
            v,
            rows(vis, plan.n, i0, i1),
            rows(bias, plan.n, i0, i1),
            compute,
            rnd,
            with_lse=True,
        )
        outs.append(out)  # (..., Hq, r, dv)
        lses.append(lse)  # (..., Hq, r)
    return finish(plan, np.concatenate(outs, axis=-2), None, dt, False, np.concatenate(lses, axis=-1))


#: reference_sdpa and the logit scale work on blocks of query rows of at most this many logits
ROW_BLOCK_LOGITS = 1 << 22


def rows(x: np.ndarray | None, n: int, i0: int, i1: int) -> np.ndarray | None:
    """Rows i0..i1-1 of an array that broadcasts against (..., n, m) (its n axis may be 1)."""
    if x is None or x.ndim < 2 or x.shape[-2] != n:
        return x
    return x[..., i0:i1, :]


def visibility_view(plan: SDPAPlan, mask, bias, extras: SDPAExtras = NO_EXTRAS) -> np.ndarray | None:
    """Which keys each row sees (every rule ANDed), broadcastable to (..., Hq, n, m) but not
    expanded to it; None when all are visible. The spec's `visible`, under the name the tolerance
    modules use."""
    return visible(plan, mask, bias, extras)


@dataclass(frozen=True)
class Comparison:
    """The outcome of comparing one result with the golden."""

    ok: bool
    max_abs_err: float
    max_rel_err: float
    allowed: float
    budget_used: float
    worst_index: tuple[int, ...] | None
    out_of_tolerance: float  # share of elements over `allowed` (or with mismatched non-finites)
    nonfinite_mismatch: int
    shape_ok: bool = True


def compare(result: np.ndarray, golden: np.ndarray, allowed: float) -> Comparison:
    """Compare ``result`` with ``golden`` elementwise under the allowed absolute error."""
    if result.shape != golden.shape:
        return Comparison(False, math.inf, math.inf, allowed, math.inf, None, 1.0, 0, shape_ok=False)
    r = result.astype(np.float64)
    g = golden.astype(np.float64)
    if np.isfinite(r).all() and np.isfinite(g).all():  # the common case, judged with fewer passes
        return _compare_finite(r, g, allowed)
    g_fin = np.isfinite(g)
    both_fin = g_fin & np.isfinite(r)
    same_nonfinite = ~g_fin & ((np.isnan(g) & np.isnan(r)) | (g == r))
    mismatch = ~both_fin & ~same_nonfinite  # a NaN/inf on one side only, or of another kind
    err = np.where(both_fin, np.abs(r - g), 0.0)
    err = np.where(mismatch, np.inf, err)
    bad = err > allowed
    max_err = float(err.max(initial=0.0))
    # relative error only where |golden| exceeds the allowed error: nearer 0 it measures nothing
    # but the size of the golden (an error within tolerance over a golden of 1e-12 is "1e+4")
    rel_ok = both_fin & (np.abs(g) > allowed)
    rel = np.where(rel_ok, err / np.where(rel_ok, np.abs(g), 1.0), 0.0)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape)) if err.size else None
    return Comparison(
        ok=not bad.any(),
        max_abs_err=max_err,
        max_rel_err=float(np.where(mismatch, np.inf, rel).max(initial=0.0)),
        allowed=allowed,
        budget_used=max_err / allowed if allowed > 0 else (0.0 if max_err == 0 else math.inf),
        worst_index=worst if err.size and max_err > 0 else None,
        out_of_tolerance=float(bad.mean()) if bad.size else 0.0,
        nonfinite_mismatch=int(mismatch.sum()),
    )


def _compare_finite(r: np.ndarray, g: np.ndarray, allowed: float) -> Comparison:
    """`compare` where every element of both is finite: the same figures, without the NaN/inf
    bookkeeping."""
    err = np.abs(r - g)
    max_err = float(err.max(initial=0.0))
    bad_count = int(np.count_nonzero(err > allowed)) if max_err > allowed else 0
    abs_g = np.abs(g)
    rel_ok = abs_g > allowed
    rel = float((err[rel_ok] / abs_g[rel_ok]).max(initial=0.0))
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(err)), err.shape)) if err.size else None
    return Comparison(
        ok=bad_count == 0,
        max_abs_err=max_err,
        max_rel_err=rel,
        allowed=allowed,
        budget_used=max_err / allowed if allowed > 0 else (0.0 if max_err == 0 else math.inf),
        worst_index=worst if err.size and max_err > 0 else None,
        out_of_tolerance=bad_count / err.size if err.size else 0.0,
        nonfinite_mismatch=0,
    )


def sdpa_allowed(
    plan: SDPAPlan,
    q,
    k,
    v,
    bias,
    vis: np.ndarray | None,
    err_ref: float,
    value_scale: float | None = None,
    extras: SDPAExtras = NO_EXTRAS,
) -> float:
    """``allowed`` for one sdpa case (outputs; pass value_scale=1 for weights)."""
    v64 = np.asarray(v, dtype=np.float64)
    V = value_scale if value_scale is not None else float(np.abs(v64[np.isfinite(v64)]).max(initial=0.0))
    L = logit_scale(plan, q, k, bias, vis, extras)
    floor = eps(plan.dtype) * V * (1.0 + math.sqrt(plan.m) + 2.0 * math.sqrt(plan.dk) * L)
    if extras.dropout_mask is not None:  # kept weights are scaled by 1 / (1 - p), and so their error
        floor /= 1.0 - plan.dropout_p
    return K * err_ref + floor


def lse_allowed(
    plan: SDPAPlan,
    q,
    k,
    bias,
    vis: np.ndarray | None,
    err_ref: float,
    golden_lse: np.ndarray,
    extras: SDPAExtras = NO_EXTRAS,
) -> float:
    """``allowed`` for the log-sum-exp of one sdpa case: K * err_ref + floor, where

        floor = eps(D) * (2 * sqrt(dk) * L + sqrt(m) + 1) + eps(lse dtype) * max |lse|

    Derivation. lse = log sum_j exp(s_j) has d lse / d s_j = w_j, and the w_j sum to at most 1,
    so an error of at most e in every logit moves lse by at most e: the logit error of an
    implementation exact to its dtype, eps(D) * 2 * sqrt(dk) * L as for the output (L as there).
    Summing the m exponentials in another order changes the denominator by a relative
    eps(D) * sqrt(m) (random-walk growth), so its log by that much absolutely; forming M + log Z
    rounds once more (the 1). Finally lse is stored in its own dtype (float32, or float64 for
    float64 inputs), a relative rounding of eps(lse dtype) * |lse|. err_ref (the same-precision
    reference's lse against the golden's) and K = 4 are as for the output. Rows with lse = -inf
    (no visible key, no sink) must match exactly, as every non-finite element does.
    """
    L = logit_scale(plan, q, k, bias, vis, extras)
    g = np.asarray(golden_lse, dtype=np.float64)
    top = float(np.abs(g[np.isfinite(g)]).max(initial=0.0))
    floor = (
        eps(plan.dtype) * (2.0 * math.sqrt(plan.dk) * L + math.sqrt(plan.m) + 1.0) + eps(plan.lse_dtype) * top
    )
    return K * err_ref + floor


def logit_scale(plan: SDPAPlan, q, k, bias, vis, extras: SDPAExtras = NO_EXTRAS) -> float:
    """L: `_logit_scale` with the |ALiBi term| added to each visible pair's, at least |sink|."""
    term = None
    if extras.alibi_slopes is not None and plan.n and plan.m and plan.hq:
        from attnspec.spec.sdpa import alibi_term

        term = np.abs(alibi_term(plan, extras))  # (..., Hq, n, m)
    L = _logit_scale(plan, q, k, bias, vis, term)
    if extras.sinks is not None:
        L = max(L, float(np.abs(np.asarray(extras.sinks, np.float64)).max(initial=0.0)))
    return L


def _logit_scale(plan: SDPAPlan, q, k, bias, vis, term: np.ndarray | None = None) -> float:
    """max over visible (i, j) of scale * sum_d |q_id k_jd| + |term_ij| + |bias_ij| (0 when nothing
    is visible), where |bias_ij| counts only if the pair's other terms are not all zero.

    Why the exception: L scales the rounding error of a logit, eps * |logit|. A pair whose product
    q_i . k_j is exactly 0 (a zero query or key row) and that has no ALiBi term has the logit
    0 + bias_ij = bias_ij, the stored input, exact in every dtype however large |bias_ij| is (-1e9,
    finfo.min). Counting it would make `allowed` exceed any possible error and judge nothing in
    exactly the cases that tell a large finite mask fill from excluded keys (conformance/corners.py).
    """
    if plan.n == 0 or plan.m == 0 or plan.hq == 0:
        return 0.0
    qa = np.abs(np.asarray(q, dtype=np.float64))
    ka = np.abs(np.asarray(k, dtype=np.float64))
    qa = qa[None] if qa.ndim == 2 else qa
    ka = ka[None] if ka.ndim == 2 else ka
    qa = np.where(np.isfinite(qa), qa, 0.0)
    ka = np.where(np.isfinite(ka), ka, 0.0)
    G = plan.group
    kt = np.swapaxes(ka, -1, -2)[..., :, None, :, :]  # (..., Hkv, 1, dk, m)
    step = max(1, ROW_BLOCK_LOGITS * plan.n // max(math.prod(plan.full_weights_shape), 1))
    top = 0.0
    for i0 in range(0, plan.n, step):  # blocks of query rows: O(ROW_BLOCK_LOGITS) memory
        i1 = min(i0 + step, plan.n)
        q5 = qa[..., i0:i1, :].reshape(*qa.shape[:-3], plan.hkv, G, i1 - i0, plan.dk)  # (..., Hkv, G, r, dk)
        s = q5 @ kt  # (..., Hkv, G, r, m)
        s = plan.scale * s.reshape(*s.shape[:-4], plan.hq, i1 - i0, plan.m)  # (..., Hq, r, m)
        if term is not None:
            s = s + rows(term, plan.n, i0, i1)
        if bias is not None:
            b = np.abs(np.asarray(rows(bias, plan.n, i0, i1), dtype=np.float64))
            s = s + np.where(np.isfinite(b) & (s > 0), b, 0.0)
        if vis is not None:
            s = np.where(rows(vis, plan.n, i0, i1), s, 0.0)
        top = max(top, float(s.max(initial=0.0)))
    return top
