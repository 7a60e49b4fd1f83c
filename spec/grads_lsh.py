"""Gradients of LSH attention: the backward pass of `attnspec.spec.lsh_attention`, analytic.

Shape letters as in `attnspec.spec.lsh`:
    ...  leading batch dims;  B  them flattened;  L  positions;  d  x dim;  dv  value dim
    nh   hashing rounds;  C  chunk_length;  Lp  padded length;  nc  chunks;  W = 2C window slots

The buckets, the sort and the dedup counts are piecewise constant in x, so they are treated as
constants: the vjp is the derivative of the attention *given* the buckets (it exists wherever no
bucket margin is 0; a finite-difference check must stay inside one bucket assignment). x reaches
the output twice: as the query of its own rows and, normalized, as the key of other rows.

Per round r and slot row i (window entries j), with w the weights, o_r the round's output, lse_r
its logsumexp, c_r = exp(lse_r - logsumexp_r(lse_r)) the round weights, out = sum_r c_r o_r and
dO the upstream gradient of query i:

    do_r[i]   = c_r[i] dO[i]
    dlse_r[i] = c_r[i] (dO[i] . o_r[i] - dO[i] . out[i])
    ds[i, j]  = w[i, j] (do_r[i] . v[j] - do_r[i] . o_r[i] + dlse_r[i])   (0 for a self entry,
                whose logit is the constant SELF_LOGIT, and for an absent pair)
    dx[i]    += scale * sum_j ds[i, j] k_hat[j]          (x as a query)
    dk_hat[j]+= scale * sum_i ds[i, j] x[i]              (x as a key)
    dv[j]    += sum_i w[i, j] do_r[i]

summed over every slot that holds the position (a position sits in nh slots, and a window can
hold it twice). Then the normalization k_hat = x / max(||x||, NORM_EPS) adds
``(dk_hat - k_hat (k_hat . dk_hat)) / ||x||`` to dx where ||x|| > NORM_EPS and
``dk_hat / NORM_EPS`` where ||x|| <= NORM_EPS (there k_hat = x / NORM_EPS is linear). Padded
positions (t >= kv_length) are absent keys and silent queries: dx = dv = 0 exactly there.
"""

from __future__ import annotations

import math

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec._lsh_core import NORM_EPS, SELF_LOGIT, _rotated, _weighted_values, _window_counts
from attnspec.spec.dtypes import round_to
from attnspec.spec.grads import _sum_to, _visible_matmul
from attnspec.spec.lsh import LSHPlan, plan_lsh_call
from attnspec.spec.options import LSH_OPTIONS, with_options
from attnspec.spec.validate import numpy_info

__all__ = ["lsh_attention_vjp"]


@with_options(outputs=False, table=LSH_OPTIONS)
def lsh_attention_vjp(
    x: np.ndarray, v: np.ndarray, d_out: np.ndarray, **options
) -> tuple[np.ndarray, np.ndarray]:
    """The vector-Jacobian product of `lsh_attention`: gradients of ``sum(lsh_attention(...) * d_out)``.

    Args:
        x, v, rotations, chunk_length, causal, kv_lengths, dedup, scale: as for `lsh_attention`.
        d_out: the upstream gradient, with the output's shape (..., L, dv) and x's dtype.

    Returns:
        ``(dx, dv)``, each with its input's shape and dtype (summed over broadcast batch dims).
        Buckets, sort order and dedup counts are constants (see the module docstring); dx
        includes both the query path and the normalized-key path. Positions at or beyond
        kv_length get dx = dv = 0 exactly, whatever x, v and d_out hold there. Computed in
        float64; results are cast to x's dtype.

    Raises:
        SpecError: for any input `lsh_attention` refuses, and for a d_out of the wrong type,
            shape or dtype.
    """
    fn = "lsh_attention_vjp"
    p, o = plan_lsh_call(fn, x, v, options, outputs=False)
    rotations = o["rotations"]
    out_shape = (*p.batch, p.L, p.dv)
    info = numpy_info(fn, "d_out", d_out)
    if info.shape != out_shape:
        raise SpecError(f"{fn}: d_out.shape={info.shape} must equal the output shape {out_shape}")
    if info.dtype != p.dtype:
        raise SpecError(f"{fn}: d_out.dtype={info.dtype} must equal x.dtype={p.dtype}")
    B, L = math.prod(p.batch), p.L
    x64 = np.broadcast_to(x.astype(np.float64), (*p.batch, L, p.d)).reshape(B, L, p.d)  # (B, L, d)
    v64 = np.broadcast_to(v.astype(np.float64), (*p.batch, L, p.dv)).reshape(B, L, p.dv)  # (B, L, dv)
    dO = d_out.astype(np.float64).reshape(B, L, p.dv)  # (B, L, dv)
    kv = np.full(B, L) if p.kv_lengths is None else p.kv_lengths.reshape(B)  # (B,)
    if B == 0 or L == 0:
        dx, dv = np.zeros((B, L, p.d)), np.zeros((B, L, p.dv))
    else:
        buckets = np.argmax(_rotated(x64, rotations.astype(np.float64)), axis=-1)  # (B, nh, L)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            dx, dv = _lsh_grads(p, x64, v64, dO, kv, buckets)
    dx = round_to(_sum_to(dx.reshape(*p.batch, L, p.d), x.shape), x.dtype)
    dv = round_to(_sum_to(dv.reshape(*p.batch, L, p.dv), v.shape), x.dtype)
    return dx, dv


def _lsh_grads(p: LSHPlan, x64, v64, dO, kv, buckets, rnd=None):
    """(dx (B, L, d), dv (B, L, dv)): the forward of `_lsh_core._lsh_core` with its intermediates kept,
    then the backward of the module docstring.

    Arithmetic runs in x64's dtype (float64 for the golden). ``rnd`` rounds every stored
    intermediate (the gradient tolerance rule's low-precision reference,
    `attnspec.spec.tolerance_grads.reference_lsh_vjp`); None keeps them exact.
    """
    rnd = rnd or (lambda a: a)
    ct = x64.dtype
    B, L, d, dv = x64.shape[0], p.L, p.d, p.dv
    nh, nb, C, Lp, nc = p.n_hashes, p.n_buckets, p.chunk_length, p.padded_length, p.n_chunks
    # -- forward, as _lsh_core._lsh_core --
    pos = np.arange(Lp)
    valid = pos < kv[:, None]  # (B, Lp)
    eff = np.full((B, nh, Lp), nb)
    eff[:, :, :L] = buckets
    eff = np.where(valid[:, None, :], eff, nb)  # (B, nh, Lp)
    order = np.argsort(eff * Lp + pos, axis=-1)  # (B, nh, Lp)
    slot_pos = order.reshape(B, nc, C)  # (B, nc, C)
    win_pos = np.concatenate([np.roll(slot_pos, 1, axis=1), slot_pos], axis=-1)  # (B, nc, W)
    x_pad = np.zeros((B, Lp, d), ct)
    x_pad[:, :L] = x64  # (B, Lp, d)
    v_pad = np.zeros((B, Lp, dv), ct)
    v_pad[:, :L] = v64  # (B, Lp, dv)
    norm = rnd(np.linalg.norm(x_pad, axis=-1, keepdims=True))  # (B, Lp, 1)
    k_hat = rnd(x_pad / np.maximum(norm, NORM_EPS))  # (B, Lp, d)
    bi = np.arange(B)[:, None, None]
    q = x_pad[bi, slot_pos]  # (B, nc, C, d)
    k = k_hat[bi, win_pos]  # (B, nc, W, d)
    v_win = v_pad[bi, win_pos]  # (B, nc, W, dv)
    s = rnd(p.scale * (q @ np.swapaxes(k, -1, -2)))  # (B, nc, C, W)
    qp, kp = slot_pos[..., :, None], win_pos[..., None, :]  # (B, nc, C, 1), (B, nc, 1, W)
    vis = valid[bi, slot_pos][..., :, None] & valid[bi, win_pos][..., None, :]  # (B, nc, C, W)
    if p.causal:
        vis &= kp <= qp
    is_self = np.broadcast_to(kp == qp, vis.shape)  # (B, nc, C, W)
    s = np.where(is_self, SELF_LOGIT, s)
    if p.dedup:
        s = s - np.log(_window_counts(order, win_pos, C))
    s = np.where(vis, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)  # (B, nc, C, 1)
    row_max = np.where(row_max == -np.inf, 0, row_max)
    e = rnd(np.exp(s - row_max))
    denom = rnd(e.sum(axis=-1, keepdims=True))
    w = rnd(np.where(vis, e / np.where(denom == 0, 1, denom), 0))  # (B, nc, C, W)
    lse = rnd(row_max + np.log(denom))[..., 0]  # (B, nc, C)
    o = rnd(_weighted_values(w, v_win, vis))  # (B, nc, C, dv)

    slot_of = np.argsort(order, axis=-1)  # (B, nh, Lp)
    flat = np.arange(nh)[:, None] * Lp + slot_of  # (B, nh, Lp): slot of (round, position)
    o_r = o.reshape(B, nh * Lp, dv)[bi, flat]  # (B, nh, Lp, dv)
    lse_r = lse.reshape(B, nh * Lp)[bi, flat]  # (B, nh, Lp)
    lse_r = np.where(valid[:, None, :], lse_r, 0)
    rw = rnd(np.exp(lse_r - lse_r.max(axis=1, keepdims=True)))
    rw = rnd(rw / rw.sum(axis=1, keepdims=True))  # (B, nh, Lp): c_r
    out = rnd((rw[..., None] * o_r).sum(axis=1))  # (B, Lp, dv)

    # -- backward --
    dO_pad = np.zeros((B, Lp, dv), ct)
    dO_pad[:, :L] = dO
    dO_pad = np.where(valid[..., None], dO_pad, 0)  # padded rows produce 0: nothing flows back
    live = valid[:, None, :]  # (B, 1, Lp)
    do_r = rnd(np.where(live[..., None], rw[..., None] * dO_pad[:, None], 0))  # (B, nh, Lp, dv)
    dot_o = np.sum(dO_pad[:, None] * o_r, axis=-1)  # (B, nh, Lp)
    dot_out = np.sum(dO_pad * out, axis=-1)[:, None]  # (B, 1, Lp)
    dlse_r = rnd(np.where(live, rw * (dot_o - dot_out), 0))  # (B, nh, Lp)
    # back to slot layout: slot (r, slot_of[r, t]) holds position t of round r
    do_s = np.zeros((B, nh * Lp, dv), ct)
    do_s[bi, flat] = do_r
    dlse_s = np.zeros((B, nh * Lp), ct)
    dlse_s[bi, flat] = dlse_r
    do_s = do_s.reshape(B, nc, C, dv)  # (B, nc, C, dv)
    dlse_s = dlse_s.reshape(B, nc, C, 1)  # (B, nc, C, 1)

    dp = do_s @ np.swapaxes(np.where(np.isfinite(v_win), v_win, 0), -1, -2)  # (B, nc, C, W)
    dp = rnd(dp + _nonfinite_dots(do_s, v_win, vis))  # a visible NaN/inf value reaches its own pairs
    row = np.sum(do_s * o, axis=-1, keepdims=True)  # (B, nc, C, 1)
    ds = rnd(np.where(vis & ~is_self, w * (dp - row + dlse_s), 0))  # (B, nc, C, W)

    dq = rnd(p.scale * _visible_matmul(ds, k, vis))  # (B, nc, C, W) @ (B, nc, W, d) -> (B, nc, C, d)
    vis_t = np.swapaxes(vis, -1, -2)  # (B, nc, W, C)
    dk = rnd(p.scale * _visible_matmul(np.swapaxes(ds, -1, -2), q, vis_t))  # (B, nc, W, d)
    dv_win = rnd(_visible_matmul(np.swapaxes(w, -1, -2), do_s, vis_t))  # (B, nc, W, dv)

    dx_pad = np.zeros((B, Lp, d), ct)
    np.add.at(dx_pad, (bi, slot_pos), dq)  # a position's query rows, one per round
    dk_hat = np.zeros((B, Lp, d), ct)
    np.add.at(dk_hat, (bi, win_pos), dk)  # every window entry that holds the position
    dv_pad = np.zeros((B, Lp, dv), ct)
    np.add.at(dv_pad, (bi, win_pos), dv_win)
    big = norm > NORM_EPS  # (B, Lp, 1)
    radial = rnd(np.sum(k_hat * dk_hat, axis=-1, keepdims=True))  # (B, Lp, 1)
    dx_pad = dx_pad + np.where(
        big, (dk_hat - k_hat * radial) / np.where(big, norm, 1), dk_hat / ct.type(NORM_EPS)
    )
    keep = valid[..., None]  # (B, Lp, 1): padded positions get exactly 0
    return np.where(keep, dx_pad, 0)[:, :L], np.where(keep, dv_pad, 0)[:, :L]


def _nonfinite_dots(do_s, v_win, vis):
    """The part of do . v[j] that non-finite entries of v add, only for visible pairs (B, nc, C, W)."""
    finite = np.isfinite(v_win)
    if finite.all():
        return 0.0
    bad = np.where(finite, 0, v_win)[..., None, :, :]  # (B, nc, 1, W, dv)
    contrib = (do_s[..., :, None, :] * bad).sum(axis=-1)  # (B, nc, C, W)
    return np.where(vis, contrib, 0)
