"""The tiles of `attnspec.spec.sdpa_blocked`: one (batch index, query head) at a time, the online
softmax over (row block, key block) tiles that `attnspec.spec.blocked`'s docstring defines
(shape letters as there). `blocked._attend_all` builds a `_Head` per query head and calls `_attend`.
"""

from __future__ import annotations

import numpy as np

from attnspec.spec.validate import SDPAPlan

# While a row's running max M stays in [-_NEAR, _NEAR], the offset c is 0: exp(s) can neither
# overflow (L <= m e^32) nor lose a term that matters (one below e^-745 is e^-713 of the largest),
# and the subtraction s - c, a full pass over the tile, is skipped. Beyond that, c = M.
_NEAR = 32.0


class _KV:
    """One kv head in float64: k (m, dk), and v with a column of ones appended (m, dv + 1).

    The ones make P @ v_aug return the row sums of P in its last column, so L needs no separate
    pass over the tile. Non-finite entries of v are zeroed here (a hidden key's weight is exactly
    0, and 0 * inf = NaN would otherwise reach every row); `bad` lists the keys that had them,
    with indicator matrices of +inf, -inf and NaN entries for `_add_non_finite_values`.
    """

    def __init__(self, k: np.ndarray, v: np.ndarray):
        self.k = np.ascontiguousarray(k, dtype=np.float64)  # (m, dk)
        m, dv = v.shape
        self.v_aug = np.empty((m, dv + 1))  # (m, dv + 1)
        values = self.v_aug[:, :dv]
        values[...] = v
        self.v_aug[:, dv] = 1.0
        finite = np.isfinite(values)
        self.bad = np.flatnonzero(~finite.all(axis=1))
        if self.bad.size:
            bad_v = values[self.bad]  # (s, dv), s keys with a non-finite entry
            self.pos_inf = (bad_v == np.inf).astype(np.float64)
            self.neg_inf = (bad_v == -np.inf).astype(np.float64)
            self.nan = np.isnan(bad_v).astype(np.float64)
            values[~finite] = 0.0


class _Rows:
    """What the query rows of one batch index share across heads: anchors i' (n,) and segment ids."""

    def __init__(self, anchor: np.ndarray, segments: tuple[np.ndarray, np.ndarray] | None):
        self.anchor = anchor  # (n,)
        self.segments = segments  # q ids (n,), kv ids (m,)


class _Head:
    """One (batch index, query head): its operands as views, and which keys each row may see.

    `_attend_all` sets the per-head data after construction: mask, bias, keep (dropout), each
    (n, m) or None, and the scalars slope (ALiBi) and sink, or None.
    """

    mask: np.ndarray | None
    bias: np.ndarray | None
    keep: np.ndarray | None
    slope: float | None
    sink: float | None

    def __init__(self, p: SDPAPlan, q, kv: _KV, rows: _Rows, q_len: int, kv_len: int):
        self.q, self.kv, self.rows = q, kv, rows  # q (n, dk)
        self.mask = self.bias = self.keep = None
        self.slope = self.sink = None
        self.scale, self.dv, self.softcap = p.scale, p.dv, p.softcap
        self.keep_scale = 1.0 / (1.0 - p.dropout_p)
        self.q_len, self.kv_len = q_len, kv_len
        self.causal = p.causal is not None
        self.upper_left = p.causal == "upper_left"  # i' may differ from i only for the other two
        self.window = p.window

    def key_range(self, i0: int, i1: int) -> tuple[int, int]:
        """[lo, hi): the keys that rows i0..i1-1 may see by structure (causal, window, kv_len)."""
        anchor = self.rows.anchor[i0:i1]
        a_min, a_max = int(anchor.min()), int(anchor.max())
        lo, hi = 0, self.kv_len
        if self.causal:
            hi = min(hi, a_max + 1)
        if self.window is not None:
            left, right = self.window
            lo = max(lo, a_min - left)
            hi = min(hi, a_max + right + 1)
        return lo, max(lo, hi)

    def hidden(self, i0: int, i1: int, cols: slice | np.ndarray) -> np.ndarray | None:
        """Bool (r, t), True where key j is not visible from row i; None if all are visible.

        A slice of keys lies inside `key_range`; an index array may lie anywhere.
        """
        j = np.arange(cols.start, cols.stop) if isinstance(cols, slice) else cols
        j_first, j_last = (cols.start, cols.stop - 1) if isinstance(cols, slice) else (None, None)
        anchor = self.rows.anchor[i0:i1]
        i = anchor[:, None]  # (r, 1): i'
        a_min, a_max = int(anchor.min()), int(anchor.max())
        hid = None

        def add(rule):
            nonlocal hid
            hid = rule if hid is None else hid | rule

        if self.causal and (j_last is None or j_last > a_min):
            add(j > i)
        if self.window is not None:
            left, right = self.window
            if j_first is None or j_first < a_max - left:
                add(j < i - left)
            if j_last is None or j_last > a_min + right:
                add(j > i + right)
        if j_first is None and self.kv_len < len(self.kv.k):
            add(j >= self.kv_len)
        if self.rows.segments is not None:
            q_ids, kv_ids = self.rows.segments
            q_col = q_ids[i0:i1, None]  # (r, 1)
            add((q_col != kv_ids[j]) | (q_col < 0))
        if self.mask is not None:
            add(~self.mask[i0:i1, cols])
        if self.bias is not None:
            add(self.bias[i0:i1, cols] == -np.inf)
        return None if hid is None else np.broadcast_to(hid, (i1 - i0, len(j)))

    def logits(self, qs, i0: int, i1: int, cols, scratch) -> tuple[np.ndarray, np.ndarray | None]:
        """s (r, t): (scale q) k^T, capped, + bias + ALiBi, hidden keys set to -inf; and the hidden mask."""
        r, t = qs.shape[0], (cols.stop - cols.start if isinstance(cols, slice) else len(cols))
        s = scratch[: r * t].reshape(r, t)  # (r, t)
        np.matmul(qs, self.kv.k[cols].T, out=s)  # (r, dk) @ (dk, t)
        if self.softcap is not None:
            s /= self.softcap
            np.tanh(s, out=s)
            s *= self.softcap
        if self.bias is not None:
            tile = self.bias[i0:i1, cols]
            s += tile if tile.dtype == np.float64 else tile.astype(np.float64)
        if self.slope is not None:
            j = np.arange(cols.start, cols.stop) if isinstance(cols, slice) else cols
            s -= self.slope * np.abs(self.rows.anchor[i0:i1, None] - j)  # (r, t)
        hidden = self.hidden(i0, i1, cols)
        if hidden is not None:
            np.copyto(s, -np.inf, where=hidden)  # overwrite, never add: NaN + -inf is NaN
        return s, hidden

    def dropout(self, p_tile, i0: int, i1: int, cols) -> np.ndarray:
        """P * keep / (1 - p) for one tile (r, t), in place."""
        assert self.keep is not None  # called only with dropout, which sets keep
        p_tile *= self.keep[i0:i1, cols]
        p_tile *= self.keep_scale
        return p_tile


def _offset(row_max: np.ndarray) -> np.ndarray:
    far = ~(np.abs(row_max) <= _NEAR) & (row_max != -np.inf)  # NaN and +inf included
    return np.where(far, row_max, 0.0)


def _attend(
    head: _Head, out_h: np.ndarray, w_h: np.ndarray | None, lse_h: np.ndarray, bq: int, bk: int, scratch
):
    """Fill out_h (n, dv), lse_h (n,), and w_h (n, m) if given, for one (batch index, query head)."""
    dv = head.dv
    for i0 in range(0, head.q_len, bq):  # rows at or past q_len see nothing: they stay 0
        i1 = min(i0 + bq, head.q_len)
        lo, hi = head.key_range(i0, i1)
        if lo == hi:
            continue  # no row of this block sees any key: output and weights 0, lse the sink's
        # scale folded into q: (scale q) k^T is scale (q k^T) up to one rounding of each q entry
        qs = head.q[i0:i1].astype(np.float64)  # (r, dk)
        qs *= head.scale
        # M; c, where A and L hold sums of exp(s - c); a sink is a logit seen before any tile
        row_max = np.full(i1 - i0, -np.inf if head.sink is None else head.sink)
        offset = _offset(row_max)
        acc = np.zeros((i1 - i0, dv + 1))  # (r, dv + 1): A, and L in the last column
        for j0 in range(lo, hi, bk):
            cols = slice(j0, min(j0 + bk, hi))
            s, _ = head.logits(qs, i0, i1, cols, scratch)  # (r, t)
            row_max = np.maximum(row_max, s.max(axis=1))  # NaN propagates, as in sdpa
            new_offset = _offset(row_max)
            if (new_offset != 0).any():
                s -= new_offset[:, None]
            np.exp(s, out=s)  # P; hidden keys: exp(-inf) = 0
            if (new_offset != offset).any():  # rescale what was summed relative to the old c
                # c only decreases when a row's first visible logit is below -_NEAR; its sums are
                # still 0 then, and the clamp keeps exp(c - c') from overflowing to 0 * inf = NaN
                acc *= np.exp(np.minimum(offset - new_offset, 0.0))[:, None]
                offset = new_offset
            if head.keep is None:
                acc += s @ head.kv.v_aug[cols]  # (r, t) @ (t, dv + 1)
            else:  # L sums P before dropout; A the kept, rescaled P
                acc[:, dv] += s.sum(axis=1)
                acc[:, :dv] += head.dropout(s, i0, i1, cols) @ head.kv.v_aug[cols, :dv]
        denom = acc[:, dv]
        if head.sink is not None:  # its term is added last, so an empty row's lse is sink exactly
            seen = denom != 0
            denom = denom + np.exp(head.sink - offset)
        out_h[i0:i1] = acc[:, :dv] / np.where(denom == 0, 1.0, denom)[:, None]  # nothing visible: 0
        lse_h[i0:i1] = offset + np.log(denom)  # log(0) = -inf: no visible key and no sink
        if head.sink is not None:
            lse_h[i0:i1][~seen] = head.sink
        # sdpa's row max and denominator, for its weights w = exp(s - max) / denom
        row_max = np.where(row_max == -np.inf, 0.0, row_max)
        denom = denom * np.exp(offset - row_max)
        denom[denom == 0] = 1.0
        if head.kv.bad.size:
            _add_non_finite_values(head, qs, i0, i1, lo, hi, row_max, denom, out_h[i0:i1], bk, scratch)
        if w_h is not None:
            for j0 in range(lo, hi, bk):
                cols = slice(j0, min(j0 + bk, hi))
                s, _ = head.logits(qs, i0, i1, cols, scratch)  # (r, t)
                s -= row_max[:, None]
                np.exp(s, out=s)
                s /= denom[:, None]
                if head.keep is not None:
                    head.dropout(s, i0, i1, cols)
                w_h[i0:i1, cols] = s
            # A NaN or +inf visible logit makes sdpa's whole row NaN (exp(s - NaN), or e / NaN),
            # hidden keys included; L is NaN for exactly those rows.
            w_h[i0:i1][np.isnan(denom)] = np.nan


def _add_non_finite_values(head: _Head, qs, i0, i1, lo, hi, row_max, denom, out_rows, bk, scratch):
    """Add sum over visible j of w_ij * v_j for the non-finite entries of v (zeroed in _KV).

    With w_ij = exp(s_ij - M) / L (sdpa's weights), each such term is, by IEEE rules: NaN for a
    NaN entry, or for an inf entry whose weight is 0; +inf or -inf for an inf entry with weight
    > 0. So the sum over visible keys only needs counts, which are matmuls of 0/1 matrices:
    NaN if any NaN term or both signs of inf, else the inf, else 0. Adding it to the finite part
    is exactly sdpa's `out + contrib` (rows whose weights are NaN are NaN already).
    """
    kv = head.kv
    picked = np.flatnonzero((kv.bad >= lo) & (kv.bad < hi))  # other keys are hidden from the block
    for c0 in range(0, picked.size, bk):
        sel = picked[c0 : c0 + bk]  # positions in kv.bad
        s, hidden = head.logits(qs, i0, i1, kv.bad[sel], scratch)  # (r, t)
        w = np.exp(s - row_max[:, None]) / denom[:, None]  # (r, t)
        if head.keep is not None:  # a dropped key keeps weight 0: 0 * inf is NaN, as in sdpa
            w = head.dropout(w, i0, i1, kv.bad[sel])
        visible = np.ones(w.shape, bool) if hidden is None else ~hidden
        live = (visible & (w > 0)).astype(np.float64)  # (r, t)
        dead = (visible & (w == 0)).astype(np.float64)
        pos = live @ kv.pos_inf[sel]  # (r, t) @ (t, dv): how many +inf terms
        neg = live @ kv.neg_inf[sel]
        nan = visible.astype(np.float64) @ kv.nan[sel] + dead @ (kv.pos_inf[sel] + kv.neg_inf[sel])
        contrib = np.zeros_like(out_rows)  # (r, dv)
        contrib[pos > 0] = np.inf
        contrib[neg > 0] = -np.inf
        contrib[(nan > 0) | ((pos > 0) & (neg > 0))] = np.nan
        out_rows += contrib
