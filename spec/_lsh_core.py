"""The vectorized LSH computation behind `attnspec.spec.lsh_attention`, with the switches that
turn it into another library's LSH (`attnspec.spec.reformer`).

Private: the definition, its steps and its constants are documented in `attnspec.spec.lsh`, which
re-exports NORM_EPS and SELF_LOGIT. This module holds the code the golden, its gradient
(`attnspec.spec.grads_lsh`) and the Reformer reproductions share. Shape letters as in
`attnspec.spec.lsh`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from attnspec.spec.lsh import LSHPlan

#: see `attnspec.spec.lsh`, "Constants"
NORM_EPS = 1e-12
SELF_LOGIT = -5e4


def _rotated(x64: np.ndarray, r64: np.ndarray) -> np.ndarray:
    """concat(x R, -x R) per round: (..., nh, L, nb), in float64."""
    d, nh, K = r64.shape
    p = x64 @ r64.reshape(d, nh * K)  # (..., L, nh * K)
    p = np.moveaxis(p.reshape(*p.shape[:-1], nh, K), -2, -3)  # (..., nh, L, K)
    return np.concatenate([p, -p], axis=-1)  # (..., nh, L, nb)


@dataclass(frozen=True)
class _Semantics:
    """The switches that turn the spec's LSH into another library's: private, set only by
    `attnspec.spec.reformer` (the spec page lists each difference). The defaults are the spec.

    ``before``/``after``: chunks of look-back and look-ahead, each wrapping over all nh * Lp slots
    (the spec: 1, 0). ``key_eps``: None for k = x / max(||x||, NORM_EPS); a float e for Hugging
    Face's x * rsqrt(mean(x^2) + e) / sqrt(d). ``pad_bucket``: invalid positions sort last with
    bucket nb (else they keep their hash). ``mask_queries``: an invalid query row is masked too.
    ``mask_value``: the logit of a masked pair (-inf: absent). ``self_logit``: the logit of j == i.
    ``self_over_mask``: the self logit replaces even a masked pair's (the spec masks after).
    ``zero_invalid_rows``: invalid query rows output 0.
    """

    before: int = 1
    after: int = 0
    key_eps: float | None = None
    pad_bucket: bool = True
    mask_queries: bool = True
    mask_value: float = -math.inf
    self_logit: float = SELF_LOGIT
    self_over_mask: bool = False
    zero_invalid_rows: bool = True


SPEC = _Semantics()


def _lsh_core(p: LSHPlan, x64, v64, kv, buckets, sem: _Semantics = SPEC, valid_in=None):
    """(out (B, L, dv), buckets sorted by (B, nh, L)). ``valid_in`` (B, L) bool, when given,
    replaces ``kv`` (an arbitrary mask of valid positions, for `attnspec.spec.reformer`)."""
    B, L, d, dv = x64.shape[0], p.L, p.d, p.dv
    nh, nb, C, Lp, nc = p.n_hashes, p.n_buckets, p.chunk_length, p.padded_length, p.n_chunks
    pos = np.arange(Lp)
    if valid_in is None:
        valid = pos < kv[:, None]  # (B, Lp): unpadded; kv <= L, so also false for the step-9 pad
    else:
        valid = np.zeros((B, Lp), bool)
        valid[:, :L] = valid_in  # (B, Lp)
    eff = np.full((B, nh, Lp), nb)
    eff[:, :, :L] = buckets
    sorts_last = valid if sem.pad_bucket else (pos < L)[None, :]  # (B or 1, Lp)
    eff = np.where(sorts_last[:, None, :], eff, nb)  # (B, nh, Lp): padded positions sort last
    order = np.argsort(eff * Lp + pos, axis=-1)  # (B, nh, Lp): position held by each slot; keys unique
    slot_pos = order.reshape(B, nc, C)  # (B, nc, C): rounds concatenated, cut into chunks
    offsets = range(-sem.before, sem.after + 1)  # chunk c + o for each o, wrapping over all nc
    win_pos = np.concatenate([np.roll(slot_pos, -o, axis=1) for o in offsets], axis=-1)  # (B, nc, W)

    x_pad = np.zeros((B, Lp, d))
    x_pad[:, :L] = x64  # (B, Lp, d)
    v_pad = np.zeros((B, Lp, dv))
    v_pad[:, :L] = v64  # (B, Lp, dv)
    if sem.key_eps is None:
        k_hat = x_pad / np.maximum(np.linalg.norm(x_pad, axis=-1, keepdims=True), NORM_EPS)  # (B, Lp, d)
    else:
        rms = np.sqrt(np.mean(x_pad * x_pad, axis=-1, keepdims=True) + sem.key_eps)  # (B, Lp, 1)
        k_hat = x_pad / rms / math.sqrt(d)  # (B, Lp, d)
    bi = np.arange(B)[:, None, None]
    q = x_pad[bi, slot_pos]  # (B, nc, C, d)
    k = k_hat[bi, win_pos]  # (B, nc, W, d)
    s = p.scale * (q @ np.swapaxes(k, -1, -2))  # (B, nc, C, W)
    qp, kp = slot_pos[..., :, None], win_pos[..., None, :]  # (B, nc, C, 1), (B, nc, 1, W)
    vis = valid[bi, win_pos][..., None, :]  # (B, nc, 1, W)
    if sem.mask_queries:
        vis = vis & valid[bi, slot_pos][..., :, None]  # (B, nc, C, W)
    if p.causal:
        vis = vis & (kp <= qp)
    vis = np.broadcast_to(vis, (B, nc, C, win_pos.shape[-1]))  # (B, nc, C, W)
    is_self = kp == qp
    if sem.self_over_mask:
        s = np.where(is_self, sem.self_logit, np.where(vis, s, sem.mask_value))
        vis = vis | is_self
    else:
        s = np.where(is_self, sem.self_logit, s)
        if p.dedup:
            s = s - np.log(_window_counts(order, win_pos, C))
        s = np.where(vis, s, sem.mask_value)  # absent keys: their x (even NaN) is dropped here
    if math.isfinite(sem.mask_value):
        vis = np.ones_like(vis)  # a finite mask value keeps the pair: its value is multiplied by 0

    row_max = s.max(axis=-1, keepdims=True)  # (B, nc, C, 1)
    row_max = np.where(row_max == -np.inf, 0, row_max)  # rows with no visible key (padded queries)
    e = np.exp(s - row_max)
    denom = e.sum(axis=-1, keepdims=True)  # (B, nc, C, 1)
    w = e / np.where(denom == 0, 1, denom)  # (B, nc, C, W)
    lse = (row_max + np.log(denom))[..., 0]  # (B, nc, C); -inf for padded queries
    o = _weighted_values(w, v_pad[bi, win_pos], vis)  # (B, nc, C, dv)

    slot_of = np.argsort(order, axis=-1)  # (B, nh, Lp): slot within its round holding position t
    flat = np.arange(nh)[:, None] * Lp + slot_of  # (B, nh, Lp): index among the nh * Lp slots
    o = o.reshape(B, nh * Lp, dv)[bi, flat]  # (B, nh, Lp, dv)
    lse = lse.reshape(B, nh * Lp)[bi, flat]  # (B, nh, Lp)
    if sem.zero_invalid_rows:
        lse = np.where(valid[:, None, :], lse, 0)  # padded rows: any finite value, zeroed below
    top = lse.max(axis=1, keepdims=True)  # (B, 1, Lp)
    rw = np.exp(lse - top)
    rw = rw / rw.sum(axis=1, keepdims=True)  # (B, nh, Lp): exp(lse_r - logsumexp_r lse)
    out = (rw[..., None] * o).sum(axis=1)  # (B, Lp, dv)
    if sem.zero_invalid_rows:
        out = np.where(valid[..., None], out, 0)
    return out[:, :L], eff[:, :, :L]  # (B, L, dv), (B, nh, L)


def _window_counts(order: np.ndarray, win_pos: np.ndarray, C: int) -> np.ndarray:
    """count(i, j) for every window entry, in slot layout (B, nc, C, 2C)."""
    B, nh, Lp = order.shape
    bi = np.arange(B)[:, None, None]
    flat = np.arange(nh)[:, None] * Lp + np.argsort(order, axis=-1)  # (B, nh, Lp): slot of (r, t)
    keys = win_pos[bi, flat // C]  # (B, nh, Lp, 2C): window of query t in round r
    per_query = np.moveaxis(keys, 1, 2).reshape(B * Lp, nh * 2 * C)  # (B*Lp, nh*2C): all its windows
    ids = np.arange(B * Lp)[:, None] * Lp + per_query  # (B*Lp, nh*2C): one id per (query, key)
    _, inverse, counts = np.unique(ids.ravel(), return_inverse=True, return_counts=True)
    per_query = counts[inverse.ravel()].reshape(B, Lp, nh, 2 * C)  # (B, Lp, nh, 2C)
    by_round = np.moveaxis(per_query, 2, 1)  # (B, nh, Lp, 2C): by round and position
    by_slot = by_round[bi, np.arange(nh)[:, None], order]  # (B, nh, Lp, 2C): by round and slot
    return by_slot.reshape(B, -1, C, 2 * C)  # (B, nc, C, 2C)


def _weighted_values(w, v_win, vis) -> np.ndarray:
    """sum over visible window entries of w * v, where a non-finite v reaches only rows that see it.

    ``w @ v`` would turn an absent NaN (weight exactly 0) into NaN for its whole chunk, so the
    matmul runs on finite values and non-finite ones are added back where visible. That branch
    holds (B, nc, C, 2C, dv) at once; it runs only when v has non-finite entries.
    """
    finite = np.isfinite(v_win)  # (B, nc, 2C, dv)
    out = w @ np.where(finite, v_win, 0)  # (B, nc, C, dv)
    if finite.all():
        return out
    bad = np.where(finite, 0, v_win)[..., None, :, :]  # (B, nc, 1, 2C, dv): non-finite parts only
    contrib = np.where(vis[..., None], w[..., None] * bad, 0)  # (B, nc, C, 2C, dv)
    return out + contrib.sum(axis=-2)
