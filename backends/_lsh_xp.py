"""Reformer LSH attention written once against the Python array API standard (2024.12).

The algorithm is `attnspec.spec.lsh` (its module docstring is the definition; shape letters as
there): hash with the given rotations, sort by (round, bucket, position), attend within a chunk
and its previous chunk, unsort, combine the rounds by their logsumexp. ``xp`` is any namespace
that implements the standard (array-api-compat's NumPy and torch, array_api_strict, ``jax.numpy``);
only standard functions are used (``take``, ``argsort(stable=True)``, ``roll``, ``matmul``...).

Memory: nothing is larger than O(nh * Lp * max(d, dv)) per batch element. Queries of one
chunk and the 2C keys of their window are gathered a block of chunks at a time
(`ATTEND_BLOCK_ELEMENTS`), so the logits are (B, chunks per block, C, 2C); no L x L array is
built. The hash projections, (rows, nh * n_buckets / 2), are made for a block of rows at a time
(`HASH_BLOCK_ELEMENTS`), since n_buckets usually grows with L. dedup adds nh * nh passes over
arrays of the logits' size.

Precision: float32 for float16/bfloat16/float32 inputs and float64 for float64 inputs
(`compute_dtype_name`), hashing included, then one rounding to the input dtype. A float32 hash
can pick another bucket than the golden's float64 hash only where the golden's top-2 margin is
tiny (`attnspec.spec.lsh.lsh_bucket_margins`).

No data-dependent branch or shape, so JAX can trace it under `jax.jit` (``nonfinite_v`` is decided
by the caller, outside any trace, as in `_xp_core`).
"""

from __future__ import annotations

import math

import numpy as np

from attnspec.backends._common import InfoFn, compute_dtype_name
from attnspec.spec.lsh import NORM_EPS, SELF_LOGIT, LSHPlan, plan_lsh_call

__all__ = ["empty", "lsh_attention", "plan"]

#: rows are hashed in blocks whose (B, nh, rows, n_buckets / 2) projection holds about this many
#: elements (at least one chunk of rows): with n_buckets ~ L / C, hashing all L rows at once would
#: hold O(L^2 / C) values, 268 MB in float32 at L = 65536, C = 64
HASH_BLOCK_ELEMENTS = 1 << 22
#: chunks are attended a block at a time whose (B, chunks, C, 2C) logits hold about this many
#: elements (at least one chunk): 1 MB of float32 logits, so the block's gathered windows, logits
#: and weights stay small and the peak no longer grows with nh * L * 2C
ATTEND_BLOCK_ELEMENTS = 1 << 18
#: but at most this many blocks: each block is ~30 framework calls, and on a busy CPU every call's
#: thread hand-off can cost milliseconds (measured: 128 blocks at L = 32768, 4 hashes took 11 s
#: against 2.3 s for reformer-pytorch on a 2-core machine at load 5)
MAX_ATTEND_BLOCKS = 8


def plan(fn: str, info: InfoFn, lengths_to_numpy, x, v, options, *, outputs: bool = True):
    """`attnspec.spec.lsh.plan_lsh_call` on a framework's arrays: the plan, and the call's keywords
    with their defaults."""
    return plan_lsh_call(fn, x, v, options, outputs=outputs, info=info, lengths_to_numpy=lengths_to_numpy)


def kv_flat(p: LSHPlan):
    """The plan's kv_lengths as a flat, writable int64 NumPy array (B,), or None."""
    return None if p.kv_lengths is None else np.array(p.kv_lengths, dtype=np.int64).reshape(-1)


def empty(xp, p: LSHPlan, dtype, device):
    """The result when there is no position or no batch element: nothing to attend to."""
    on = {} if device is None else {"device": device}
    return (
        xp.zeros((*p.batch, p.L, p.dv), dtype=dtype, **on),
        xp.zeros((*p.batch, p.n_hashes, p.L), dtype=xp.int64, **on),
    )


def lsh_attention(xp, p: LSHPlan, x, v, rotations, kv, *, nonfinite_v: bool, device=None):
    """out (*batch, L, dv) in x's dtype, and the buckets (*batch, nh, L) int64.

    ``x`` (..., L, d) and ``v`` (..., L, dv) broadcast to ``p.batch``; ``rotations`` (d, nh, K);
    ``kv`` is None or an int array (B,) of kv_lengths, B = prod(p.batch). The plan's own
    kv_lengths are ignored (they are NumPy; a jitted caller passes a static plan without them).
    Callers handle B = 0 and L = 0.
    """
    dtype = x.dtype
    ct = getattr(xp, compute_dtype_name(p.dtype))
    on = {} if device is None else {"device": device}
    B = math.prod(p.batch)
    L, d, dv = p.L, p.d, p.dv
    nh, nb, C, Lp, nc = p.n_hashes, p.n_buckets, p.chunk_length, p.padded_length, p.n_chunks

    x = xp.reshape(xp.broadcast_to(xp.astype(x, ct), (*p.batch, L, d)), (B, L, d))  # (B, L, d)
    v = xp.reshape(xp.broadcast_to(xp.astype(v, ct), (*p.batch, L, dv)), (B, L, dv))  # (B, L, dv)
    if Lp > L:  # step 9: absent positions up to whole chunks
        x = xp.concat([x, xp.zeros((B, Lp - L, d), dtype=ct, **on)], axis=1)  # (B, Lp, d)
        v = xp.concat([v, xp.zeros((B, Lp - L, dv), dtype=ct, **on)], axis=1)  # (B, Lp, dv)

    pos = xp.arange(Lp, dtype=xp.int64, **on)  # (Lp,)
    n = xp.full((B,), L, dtype=xp.int64, **on) if kv is None else xp.astype(kv, xp.int64)  # (B,)
    valid = pos[None, :] < n[:, None]  # (B, Lp): unpadded (false for the step-9 positions too)
    # with no padded position (decided from shapes, so static under jit) the visibility gathers
    # and the where passes below are skipped: ~1/3 of the time at large L
    padded = kv is not None or Lp > L
    if padded:
        # padded positions take no part: zeroed with where, so their content (NaN included)
        # reaches no gradient either (a NaN query row would give 0 * NaN in the keys' gradient)
        x = xp.where(valid[..., None], x, 0.0)  # (B, Lp, d)
        v = xp.where(valid[..., None], v, 0.0)  # (B, Lp, dv)

    # step 2: hash in the compute dtype with the given rotations
    r = xp.reshape(xp.astype(rotations, ct), (d, nh * (nb // 2)))  # (d, nh * K)
    rows_per_block = max(C, HASH_BLOCK_ELEMENTS // (B * nh * (nb // 2)))
    buckets = xp.concat(
        [
            _hash(xp, x[:, start : min(start + rows_per_block, Lp), :], r, nh, nb)
            for start in range(0, Lp, rows_per_block)
        ],
        axis=-1,
    )  # (B, nh, Lp)
    # step 3: padded positions take bucket nb, after every real one
    eff = xp.where(valid[:, None, :], xp.astype(buckets, xp.int64), nb)  # (B, nh, Lp)
    order = xp.argsort(eff * Lp + pos, axis=-1, stable=True)  # (B, nh, Lp): position of each slot
    slot_of = xp.argsort(order, axis=-1, stable=True)  # (B, nh, Lp): inverse permutation

    # step 5: chunks of C, each with its previous chunk (wrapping globally across rounds)
    slot_pos = xp.reshape(order, (B, nc, C))  # (B, nc, C)
    win_pos = xp.concat([xp.roll(slot_pos, 1, axis=1), slot_pos], axis=-1)  # (B, nc, 2C)
    batch_ids = xp.reshape(xp.arange(B, dtype=xp.int64, **on), (B, 1, 1))  # (B, 1, 1)

    def rows(a, idx):  # a (B, R, f), idx (B, s, w) row numbers in [0, R) -> (B, s, w, f)
        R, f = a.shape[1], a.shape[2]
        flat = xp.reshape(idx + batch_ids * R, (-1,))  # (B * s * w,)
        got = xp.take(xp.reshape(a, (B * R, f)), flat, axis=0)  # (B * s * w, f)
        return xp.reshape(got, (*idx.shape, f))

    sq = xp.sum(x * x, axis=-1, keepdims=True)  # (B, Lp, 1)
    # sqrt's derivative at 0 is inf, and inf * 0 = NaN: the double where keeps the gradient of
    # x = 0 at the spec's 1 / NORM_EPS (k_hat = x / NORM_EPS there)
    norm = xp.where(sq > 0, xp.sqrt(xp.where(sq > 0, sq, 1.0)), 0.0)  # (B, Lp, 1)
    k_hat = x / xp.maximum(norm, xp.asarray(NORM_EPS, dtype=ct, **on))  # (B, Lp, d)
    valid_col = valid[..., None] if padded else None  # (B, Lp, 1)
    self_logit = xp.asarray(SELF_LOGIT, dtype=ct, **on)

    def attend(sp, wp):  # chunks sp (B, c, C) with windows wp (B, c, 2C) -> o (B, c, C, dv), lse (B, c, C)
        q = rows(x, sp)  # (B, c, C, d)
        k = rows(k_hat, wp)  # (B, c, 2C, d)
        s = xp.matmul(q, xp.matrix_transpose(k)) * p.scale  # (B, c, C, 2C)
        # step 6: visibility by original positions
        qp, kp = sp[..., :, None], wp[..., None, :]  # (B, c, C, 1), (B, c, 1, 2C)
        vis = None  # (B, c, C, 2C) or None: every key visible
        if padded:
            vis = rows(valid_col, sp) & xp.matrix_transpose(rows(valid_col, wp))
        if p.causal:
            vis = (kp <= qp) if vis is None else vis & (kp <= qp)
        s = xp.where(kp == qp, self_logit, s)
        if p.dedup:
            s = s - xp.log(xp.astype(_window_counts(xp, p, slot_of, sp, wp, rows, on), ct))
        if vis is not None:
            s = xp.where(vis, s, -math.inf)  # absent keys: their x (even NaN) is dropped here
        # step 7: per-row softmax and logsumexp
        row_max = xp.max(s, axis=-1, keepdims=True)  # (B, c, C, 1)
        if vis is not None:
            row_max = xp.where(row_max == -math.inf, 0.0, row_max)  # rows with no visible key
        e = xp.exp(s - row_max)
        denom = xp.sum(e, axis=-1, keepdims=True)  # (B, c, C, 1)
        if vis is not None:  # only a padded query row can see nothing (self is always visible)
            denom = xp.where(denom == 0, 1.0, denom)
        w = e / denom  # (B, c, C, 2C)
        lse = (row_max + xp.log(denom))[..., 0]  # (B, c, C); padded rows: 0
        v_win = rows(v, wp)  # (B, c, 2C, dv)
        if nonfinite_v:  # zeroed for the matmul (0 * inf = NaN would reach rows not seeing the key)
            o = xp.matmul(w, xp.where(xp.isfinite(v_win), v_win, 0.0))  # (B, c, C, dv)
            every = xp.ones(s.shape, dtype=xp.bool, **on)
            o = _nonfinite_values(xp, w, v_win, every if vis is None else vis, o, ct)
        else:
            o = xp.matmul(w, v_win)  # (B, c, C, dv)
        return o, lse

    # steps 4-7 a block of chunks at a time: the gathered windows, logits and weights of all nc
    # chunks at once were most of the peak memory (564 MB at L = 65536), and a block that stays
    # in cache is faster too
    per_block = max(1, ATTEND_BLOCK_ELEMENTS // (B * C * 2 * C), -(-nc // MAX_ATTEND_BLOCKS))
    parts = [
        attend(slot_pos[:, c : min(c + per_block, nc), :], win_pos[:, c : min(c + per_block, nc), :])
        for c in range(0, nc, per_block)
    ]
    o = parts[0][0] if len(parts) == 1 else xp.concat([a for a, _ in parts], axis=1)  # (B, nc, C, dv)
    lse = parts[0][1] if len(parts) == 1 else xp.concat([b for _, b in parts], axis=1)  # (B, nc, C)
    del parts

    # undo the sort, combine the rounds with softmax(lse)
    flat = xp.reshape(xp.arange(nh, dtype=xp.int64, **on) * Lp, (1, nh, 1)) + slot_of  # (B, nh, Lp)
    o = rows(xp.reshape(o, (B, nh * Lp, dv)), flat)  # (B, nh, Lp, dv)
    lse = rows(xp.reshape(lse, (B, nh * Lp, 1)), flat)[..., 0]  # (B, nh, Lp)
    if padded:
        lse = xp.where(valid[:, None, :], lse, 0.0)  # padded rows: any finite value, zeroed below
    top = xp.max(lse, axis=1, keepdims=True)  # (B, 1, Lp)
    rw = xp.exp(lse - top)
    rw = rw / xp.sum(rw, axis=1, keepdims=True)  # (B, nh, Lp)
    out = xp.sum(rw[..., None] * o, axis=1)  # (B, Lp, dv)
    if padded:
        out = xp.where(valid[..., None], out, 0.0)[:, :L, :]  # (B, L, dv)
    out = xp.reshape(xp.astype(out, dtype), (*p.batch, L, dv))
    return out, xp.reshape(eff[:, :, :L], (*p.batch, nh, L))


def _hash(xp, x, r, nh: int, nb: int):
    """Buckets (B, nh, n) of the rows x (B, n, d): argmax(concat(p, -p)) with p = x R per round.

    Without building the (B, nh, n, nb) concat: the first half wins ties (max == -min), and
    argmax/argmin each take the first index of a tie within their half; a NaN row takes its
    first NaN, in the first half, as argmax of the concat does.
    """
    B, n = x.shape[0], x.shape[1]
    proj = xp.reshape(xp.matmul(x, r), (B, n, nh, nb // 2))  # (B, n, nh, K)
    proj = xp.permute_dims(proj, (0, 2, 1, 3))  # (B, nh, n, K)
    top, bottom = xp.max(proj, axis=-1), xp.min(proj, axis=-1)  # (B, nh, n)
    return xp.where(
        (top >= -bottom) | xp.isnan(top), xp.argmax(proj, axis=-1), xp.argmin(proj, axis=-1) + nb // 2
    )  # (B, nh, n)


def _window_counts(xp, p: LSHPlan, slot_of, slot_pos, win_pos, rows, on):
    """count(i, j) of step 8 for every window entry, (B, nc, C, 2C), int64.

    Query i's window in round r is chunk c_r(i) and chunk c_r(i) - 1 (mod nc), where c_r(t) is
    the flat chunk holding position t in round r. Key j sits in chunk c_r'(j) in round r', so
    the number of entries for j over all nh windows of i is the number of pairs (r, r') with
    c_r'(j) - c_r(i) = 0 or -1 (mod nc): nh * nh comparisons of (B, nc, C, 2C) arrays.
    """
    nh, C, Lp, nc = p.n_hashes, p.chunk_length, p.padded_length, p.n_chunks
    rounds = xp.reshape(xp.arange(nh, dtype=xp.int64, **on), (1, nh, 1))
    chunk = (rounds * Lp + slot_of) // C  # (B, nh, Lp): flat chunk of position t in round r
    chunk = xp.permute_dims(chunk, (0, 2, 1))  # (B, Lp, nh)
    cq = rows(chunk, slot_pos)  # (B, nc, C, nh)
    ck = rows(chunk, win_pos)  # (B, nc, 2C, nh)
    count = xp.zeros((*slot_pos.shape, win_pos.shape[-1]), dtype=xp.int64, **on)  # (B, nc, C, 2C)
    for r in range(nh):
        for r2 in range(nh):
            gap = (ck[..., None, :, r2] - cq[..., :, None, r]) % nc  # (B, nc, C, 2C), in [0, nc)
            count = count + xp.astype((gap == 0) | (gap == nc - 1), xp.int64)
    return count


def _nonfinite_values(xp, w, v_win, vis, out, ct):
    """Put back the NaN/inf entries of v, only in rows that see their key (IEEE rules).

    As `_xp_core._nonfinite_values`: ``out`` ran with them zeroed (0 * inf = NaN would reach rows
    that do not see the key); per row and column, 0/1 matmuls count the visible keys of each
    kind, exactly. Any NaN gives NaN; w > 0 times +-inf gives +-inf; both signs, or w = 0 times
    inf, give NaN.
    """

    def hits(sel, keys):  # (B, nc, C, dv)
        return xp.matmul(xp.astype(sel, ct), xp.astype(keys, ct)) > 0

    pos_inf, neg_inf = v_win == math.inf, v_win == -math.inf
    any_pos = hits(vis & (w > 0), pos_inf)
    any_neg = hits(vis & (w > 0), neg_inf)
    nan = (
        hits(vis, xp.isnan(v_win))
        | (any_pos & any_neg)
        | hits(vis & (w == 0), pos_inf | neg_inf)
        | xp.isnan(out)
    )
    out = xp.where(any_pos, math.inf, out)
    out = xp.where(any_neg, -math.inf, out)
    return xp.where(nan, math.nan, out)
