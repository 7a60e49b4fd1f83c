"""Memory-efficient scaled dot-product attention: `sdpa`, computed tile by tile.

Shape letters, as in `attnspec.spec.sdpa`, plus the two tile sizes:
    ...  leading batch dims;  Hq, Hkv  query and key/value heads, G = Hq // Hkv
    n    queries;  m  keys;  dk  query/key head dim;  dv  value head dim
    r    query rows in a tile (<= block_q);  t  keys in a tile (<= block_k)

The algorithm is the online softmax of FlashAttention. For one (batch index, query head) and one
block of query rows, walk the key tiles left to right, keeping for every row

    M  the running max of the visible logits seen so far (-inf before the first one)
    c  an offset (below)
    A  sum_j exp(s_ij - c) v_j   and   L  sum_j exp(s_ij - c)   over the visible keys seen so far

and, for each tile of logits s (r, t), with hidden keys set to -inf:

    M' = max(M, max_j s_ij)     c' = offset(M')     alpha = exp(c - c')     P = exp(s - c')
    A <- alpha A + P v_tile     L <- alpha L + sum_j P_ij      M, c <- M', c'

then out = A / L and lse = c + log(L). The textbook choice is c = M (so P <= 1); here c = 0 while |M| <= 32, and M
beyond. With c = 0 exp(s) can neither overflow nor lose a term that matters, and both the
subtraction pass over the tile and the rescaling are skipped for the usual logits. A row with no
visible key yet has c = 0, as sdpa replaces an all -inf row max by 0: exp(-inf) = 0, never NaN.

Why this is the same function as `sdpa`: for any c, exp(s - c) = exp(s - M) exp(M - c), so A and
L are sdpa's numerator sum_j e_ij v_j and denominator sum_j e_ij (e = exp(s - M)) times the same
factor exp(M - c), which cancels in A / L = sum_j w_ij v_j; each rescaling by alpha just moves
the partial sums from the old offset to the new one. Only rounding differs (summation order, a
product of rescalings instead of one exp): a few ulp. Max is exact and order-free, so the final
M is sdpa's row max, and the weights are computed with sdpa's formula exp(s - M) / L_M, where
L_M = L exp(c - M). A key hidden from every row of the block by structure (causal, window,
kv_lengths) would add exp(-inf) = 0 to both sums, so those tiles are skipped; rows at or past
q_lengths see nothing and stay 0. Everything else carries over from sdpa unchanged: hidden keys
are overwritten with -inf after the matmul, so NaN or inf in their k never reaches a row; a
visible NaN logit makes M NaN and a visible +inf logit makes P NaN (inf - inf), so the same rows
become NaN as in sdpa. Non-finite entries of v are zeroed for P v and added back afterwards for
the rows that see them, with the final weights (see `_add_non_finite_values`).

The variants fit in without changing that argument. softcap and ALiBi change the logits tile
(softcap * tanh(t / softcap) on the scaled q k^T, then bias, then -slope |i' - j|) before the
hidden keys are overwritten; segment ids are one more hiding rule; the anchor i' of causal,
window and ALiBi is a per-row array (`masks.query_anchor`), so "lower_right_lengths" is the same
code as the constant shifts. A sink is one more logit that every row has seen before the first
tile: M starts at sink_h instead of -inf (so c accounts for it), and exp(sink_h - c) is added to
L after the last tile; a row with no visible key ends with out = 0 / L = 0 and lse = sink_h
(set exactly: M + log(Z) with Z = 1). Dropout multiplies P by keep / (1 - p) for A only;
L sums the P before dropout, as the definition's denominator does.

Memory, per (batch, head) step: one float64 tile of logits (r, t) and a bool tile for the hidden
keys, O(r (dk + dv)) of row state, a float64 copy of one kv head's k and v, O(m (dk + dv)) (k
is used in place when it is float64 and contiguous), plus the float64 output (..., Hq, n, dv)
itself. Never (n, m), except that return_weights returns an (..., Hq, n, m) array by nature; it
is filled by a second tiled pass with the final M and L.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec._blocked_tiles import _KV, _attend, _Head, _Rows
from attnspec.spec.masks import plan_anchor
from attnspec.spec.options import take, with_options
from attnspec.spec.validate import NO_EXTRAS, SDPAExtras, SDPAPlan, finish, is_int, plan_options

__all__ = ["blocked_core", "check_block", "sdpa_blocked"]

_FN = "sdpa_blocked"


@with_options(after=("block_q", "block_k"))
def sdpa_blocked(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int = 256, block_k: int = 512, **options: Any
):
    """`sdpa` without the (n, m) logits: tiled online softmax (see the module docstring).

    Arguments, validation, SpecError messages (with this function's name) and results are those
    of `attnspec.spec.sdpa`; results agree with it to rounding (~1e-13 relative in float64).

    Args:
        block_q: query rows per tile, an int >= 1.
        block_k: keys per tile, an int >= 1. Extra memory per (batch, head) step is about
            8 * block_q * block_k bytes plus O((n + m) * (dk + dv)), instead of O(n * m).
        return_weights: also return the weights (..., Hq, n, m). That result is O(n * m) by
            nature; it is filled tile by tile in a second pass with the final row max and sum.

    Raises:
        SpecError: for any input `sdpa` refuses, and for a block size that is not an int >= 1.
    """
    o = take(_FN, options)
    p, extras = plan_options(_FN, q, k, v, o)
    bq, bk = check_block("block_q", block_q), check_block("block_k", block_k)
    return blocked_core(p, q, k, v, o["mask"], o["bias"], o["return_weights"], bq, bk, extras=extras)


def blocked_core(
    p: SDPAPlan,
    q,
    k,
    v,
    mask,
    bias,
    return_weights: bool,
    block_q: int = 256,
    block_k: int = 512,
    *,
    extras: SDPAExtras = NO_EXTRAS,
):
    """`sdpa_blocked` after validation: the result(s) in q's dtype, shaped as `sdpa` returns them.

    `attnspec.spec.sdpa` calls this for large inputs (see `sdpa.BLOCKED_MIN_LOGITS`).
    """
    bq, bk = block_q, block_k
    out = np.zeros((*p.batch, p.hq, p.n, p.dv))  # (..., Hq, n, dv)
    weights = np.zeros(p.full_weights_shape) if return_weights else None  # (..., Hq, n, m)
    lse = np.full((*p.batch, p.hq, p.n), -np.inf)  # (..., Hq, n): rows never visited keep this
    if extras.sinks is not None:
        lse[...] = extras.sinks.astype(np.float64)[:, None]  # ... or the sink alone
    if p.n and p.m and p.hq:
        # NaN and inf are data here, and the definition says where they go: invalid operations
        # on hidden keys are overwritten, those on visible ones give sdpa's NaN. No warnings.
        with np.errstate(invalid="ignore", divide="ignore"):
            _attend_all(p, q, k, v, mask, bias, out, weights, lse, bq, bk, extras)
    return finish(p, out, weights, q.dtype, return_weights, lse)


def _attend_all(
    p: SDPAPlan, q, k, v, mask, bias, out, weights, lse, bq: int, bk: int, ex: SDPAExtras
) -> None:
    q4 = np.broadcast_to(_with_head(q), (*p.batch, p.hq, p.n, p.dk))  # (..., Hq, n, dk)
    k4 = np.broadcast_to(_with_head(k), (*p.batch, p.hkv, p.m, p.dk))  # (..., Hkv, m, dk)
    v4 = np.broadcast_to(_with_head(v), (*p.batch, p.hkv, p.m, p.dv))  # (..., Hkv, m, dv)
    fw = p.full_weights_shape
    mask4 = None if mask is None else np.broadcast_to(mask, fw)  # (..., Hq, n, m)
    bias4 = None if bias is None else np.broadcast_to(bias, fw)
    keep4 = None if ex.dropout_mask is None else np.broadcast_to(ex.dropout_mask, fw)
    anchors = np.broadcast_to(  # i' per row, (..., n)
        plan_anchor(p, ex.q_segment_ids, ex.kv_segment_ids),
        (*p.batch, p.n),
    )
    slopes = (
        None
        if ex.alibi_slopes is None
        else np.broadcast_to(ex.alibi_slopes.astype(np.float64), (*p.batch, p.hq))
    )  # (..., Hq)
    sinks = None if ex.sinks is None else ex.sinks.astype(np.float64)  # (Hq,)
    q_ids = None if ex.q_segment_ids is None else np.broadcast_to(ex.q_segment_ids, (*p.batch, p.n))
    kv_ids = None if ex.kv_segment_ids is None else np.broadcast_to(ex.kv_segment_ids, (*p.batch, p.m))
    scratch = np.empty(min(bq, p.n) * min(bk, p.m))  # the one (r, t) logits tile, reused
    for b in np.ndindex(*p.batch):
        q_len = p.n if p.q_lengths is None else int(p.q_lengths[b])
        kv_len = p.m if p.kv_lengths is None else int(p.kv_lengths[b])
        # segment ids come both or neither (validate_sdpa)
        rows = _Rows(anchors[b], None if q_ids is None or kv_ids is None else (q_ids[b], kv_ids[b]))
        for g in range(p.hkv):
            kv = _KV(k4[b][g], v4[b][g])
            for h in range(g * p.group, (g + 1) * p.group):  # query heads reading kv head g
                head = _Head(p, q4[b][h], kv, rows, q_len, kv_len)
                head.mask = None if mask4 is None else mask4[b][h]  # (n, m), a view
                head.bias = None if bias4 is None else bias4[b][h]
                head.keep = None if keep4 is None else keep4[b][h]
                head.slope = None if slopes is None else float(slopes[b][h])
                head.sink = None if sinks is None else float(sinks[h])
                _attend(
                    head, out[b][h], None if weights is None else weights[b][h], lse[b][h], bq, bk, scratch
                )


def check_block(name: str, value: object, fn: str = _FN) -> int:
    """A tile size as an int, or SpecError naming ``fn`` unless it is an int >= 1."""
    if not is_int(value) or value < 1:
        raise SpecError(f"{fn}: {name}={value!r} must be an int >= 1")
    return int(value)


def _with_head(x: np.ndarray) -> np.ndarray:
    return x[None] if x.ndim == 2 else x  # (L, d) -> (1, L, d): a missing head axis is one head
