"""The tiled online-softmax sdpa of `attnspec.spec.blocked`, written against the array API standard.

``xp`` is any namespace that implements the standard (see `attnspec.backends._xp_core`); only
standard functions, operators and basic slicing are used, so array_api_strict runs it. Shape
letters as in `attnspec.spec.sdpa`, plus r query rows in a tile (<= block_q) and t keys in a tile
(<= block_k). Heads are kept as (Hkv, G), G = Hq // Hkv, so that query head h reads kv head h // G
by broadcasting, and every (batch, head) pair is one batched matmul per tile.

For each block of query rows, walk the key tiles keeping per row the running max M, an offset c
and the sums A = sum_j exp(s_ij - c) v_j, L = sum_j exp(s_ij - c), then out = A / L; the proof
that this is sdpa, and the choice of c (0 while |M| <= NEAR, else M), are in the docstring of
`attnspec.spec.blocked`. NEAR is 32 in float64 and 16 in float32: with c = 0, exp(s) <= e^NEAR
cannot overflow L (m e^16 < 3e38 for any m below 1e31), and a term below exp(-87), where float32
underflows, is below e^-71 of the row's largest term: far under float32's eps (e^-16.6).
Computing in float32 for float16/bfloat16/float32 inputs and float64 for float64, like `_xp_core`.

Tiles hidden from a whole block of rows by structure (causal, window, kv_lengths, q_lengths) are
skipped; tiles fully visible by structure, with no mask or bias, skip the visibility `where`. The
weights (when asked) and the exact treatment of non-finite values in v (see
`_xp_core._nonfinite_values`) need the final M and L, so they take a second pass over the tiles.
A block of rows whose logits are all bounded by NEAR (Cauchy-Schwarz: |scale q_i| max_j |k_j| +
max |bias|, checked once per block) keeps c = 0 throughout and skips the running max: one pass
over each tile fewer. On NumPy (`is_numpy_namespace`), matmul and exp write into buffers reused
from tile to tile, since the standard has no ``out=``; the arithmetic is the same.

Memory: a few (..., Hq, r, t) tiles and O(n dv) of output and row state; never (n, m) except
the weights themselves. Python branches on data (whether a tile needs rescaling) make this an
eager-mode algorithm: not for `jax.jit` (the jax backends do not use it).
"""

from __future__ import annotations

import math

import numpy as np
from array_api_compat import is_numpy_namespace

from attnspec.backends._common import compute_dtype_name
from attnspec.spec.validate import SDPAPlan

__all__ = ["attention_blocked"]

_NEAR = {"float64": 32.0, "float32": 16.0}


def attention_blocked(
    xp,
    p: SDPAPlan,
    q,
    k,
    v,
    mask,
    bias,
    *,
    nonfinite_v: bool,
    want_weights: bool,
    block_q: int,
    block_k: int,
    device,
):
    """out, and weights if asked (else None), shaped like sdpa's, in q's dtype.

    q, k, v carry a head axis (rank >= 3); mask (bool) and bias broadcast to (*batch, Hq, n, m),
    or are None. Callers handle n = 0, m = 0, Hq = 0 and a batch of 0 (`is_empty`).
    """
    t = _Tiles(xp, p, q, k, v, mask, bias, nonfinite_v, device)
    outs, weight_rows = [], []
    for i0 in range(0, p.n, block_q):
        i1 = min(i0 + block_q, p.n)
        out, w = t.row_block(i0, i1, block_k, want_weights)
        outs.append(out)
        weight_rows.append(w)
    out = xp.concat(outs, axis=-2) if len(outs) > 1 else outs[0]  # (..., Hkv, G, n, dv)
    out = _merge_heads(xp, p, xp.astype(out, q.dtype), p.dv)
    if not want_weights:
        return out, None
    w = xp.concat(weight_rows, axis=-2) if len(weight_rows) > 1 else weight_rows[0]
    return out, _merge_heads(xp, p, xp.astype(w, q.dtype), p.m)


def _merge_heads(xp, p: SDPAPlan, x, last: int):
    full = (*p.batch, p.hkv, p.group, p.n, last)
    x = x if tuple(x.shape) == full else xp.broadcast_to(x, full)
    return xp.reshape(x, (*p.batch, p.hq, p.n, last) if not p.squeeze_head else (p.n, last))


def _split_heads(xp, p: SDPAPlan, x):
    """An array broadcasting to (*batch, Hq, n, m) -> one broadcasting to (*batch, Hkv, G, n, m)."""
    while x.ndim < 3:
        x = xp.expand_dims(x, axis=0)
    if x.shape[-3] == 1:
        return xp.expand_dims(x, axis=-3)  # (..., 1, 1, n, m)
    return xp.reshape(x, (*x.shape[:-3], p.hkv, p.group, *x.shape[-2:]))  # (..., Hkv, G, n, m)


def _tile(x, n: int, m: int, i0: int, i1: int, j0: int, j1: int):
    """The (rows, keys) tile of an array broadcasting to (..., n, m); size-1 axes stay as they are."""
    if x.shape[-2] == n and n > 1:
        x = x[..., i0:i1, :]
    if x.shape[-1] == m and m > 1:
        x = x[..., j0:j1]
    return x


class _Tiles:
    buffers: dict[str, np.ndarray]  # matmul's NumPy buffers by slot, each reused from tile to tile

    def __init__(self, xp, p: SDPAPlan, q, k, v, mask, bias, nonfinite_v: bool, device):
        self.xp, self.p, self.device = xp, p, device
        # NumPy fast path: matmul and exp into buffers reused across tiles (no standard `out=`)
        self.numpy, self.buffers = is_numpy_namespace(xp), {}
        self.ct = ct = getattr(xp, compute_dtype_name(p.dtype))
        self.near = _NEAR[compute_dtype_name(p.dtype)]
        # scale folded into q: (scale q) k^T is scale (q k^T) up to one rounding of each q entry
        q = xp.astype(q, ct) * p.scale
        self.q5 = xp.reshape(q, (*q.shape[:-3], p.hkv, p.group, p.n, p.dk))  # (..., Hkv, G, n, dk)
        k = xp.astype(k, ct)
        # |s_ij| <= |scale q_i| max_j |k_j| + max |bias| (Cauchy-Schwarz): when that is <= NEAR for
        # every row of a block, c = 0 throughout and the running max need not be tracked at all
        self.q_norm = xp.sqrt(xp.sum(self.q5 * self.q5, axis=-1))  # (..., Hkv, G, n)
        k_norm = float(xp.max(xp.sqrt(xp.sum(k * k, axis=-1)))) if p.m else 0.0
        b_max = 0.0 if bias is None else float(xp.max(xp.where(bias == -math.inf, 0.0, xp.abs(bias))))
        self.logit_bound = (k_norm, b_max)  # NaN or inf anywhere: no block is bounded
        self.kt5 = xp.matrix_transpose(xp.expand_dims(k, axis=-3))  # (..., Hkv, 1, dk, m)
        v = xp.astype(v, ct)
        self.nonfinite_v = nonfinite_v
        if nonfinite_v:
            self.v_raw = xp.expand_dims(v, axis=-3)  # (..., Hkv, 1, m, dv)
            v = xp.where(xp.isfinite(v), v, xp.asarray(0.0, dtype=ct))
        # not v with a column of ones (which would give L from the matmul, as the spec does):
        # OpenBLAS multiplies by (t, 65) far slower than by (t, 64), so L is a row sum instead
        self.v5 = xp.expand_dims(v, axis=-3)  # (..., Hkv, 1, m, dv)
        self.mask = None if mask is None else _split_heads(xp, p, mask)
        self.bias = None if bias is None else _split_heads(xp, p, xp.astype(bias, ct))
        self.shift = p.m - p.n if p.causal == "lower_right" else 0  # i' = i + shift
        self.q_len = self._lengths(p.q_lengths)
        self.kv_len = self._lengths(p.kv_lengths)
        self.q_hi = p.n if p.q_lengths is None else int(p.q_lengths.max(initial=0))
        self.kv_hi = p.m if p.kv_lengths is None else int(p.kv_lengths.max(initial=0))
        self.kv_lo = p.m if p.kv_lengths is None else int(p.kv_lengths.min(initial=p.m))
        self.q_lo = p.n if p.q_lengths is None else int(p.q_lengths.min(initial=p.n))

    def _lengths(self, x):
        if x is None:
            return None
        # (*batch,) -> (*batch, 1, 1, 1, 1), against (*batch, Hkv, G, r, t)
        # a copy: the plan's lengths may be a read-only broadcast view, which torch warns about
        return self.xp.asarray(np.array(x).reshape(*self.p.batch, 1, 1, 1, 1), device=self.device)

    def key_range(self, i0: int, i1: int) -> tuple[int, int]:
        """[lo, hi): the keys rows i0..i1-1 may see by structure (causal, window, lengths)."""
        lo, hi = 0, self.kv_hi
        if self.p.causal is not None:
            hi = min(hi, i1 + self.shift)
        if self.p.window is not None:
            left, right = self.p.window
            lo = max(lo, i0 + self.shift - left)
            hi = min(hi, i1 + self.shift + right)
        return lo, max(lo, hi)

    def visible(self, i0: int, i1: int, j0: int, j1: int):
        """Bool (..., r, t) broadcasting to (*batch, Hkv, G, r, t); None if all are visible."""
        xp, p = self.xp, self.p
        i = xp.reshape(xp.arange(i0, i1, device=self.device), (i1 - i0, 1)) + self.shift  # (r, 1): i'
        j = xp.reshape(xp.arange(j0, j1, device=self.device), (1, j1 - j0))  # (1, t)
        vis = None

        def add(rule):
            nonlocal vis
            vis = rule if vis is None else vis & rule

        if p.causal is not None and j1 - 1 > i0 + self.shift:
            add(j <= i)
        if p.window is not None:
            left, right = p.window
            if j0 < i1 - 1 + self.shift - left:
                add(j >= i - left)
            if j1 - 1 > i0 + self.shift + right:
                add(j <= i + right)
        if self.kv_len is not None and j1 > self.kv_lo:
            add(j < self.kv_len)
        if self.q_len is not None and i1 > self.q_lo:
            add(i - self.shift < self.q_len)
        if self.mask is not None:
            add(_tile(self.mask, p.n, p.m, i0, i1, j0, j1))
        if self.bias is not None:
            add(_tile(self.bias, p.n, p.m, i0, i1, j0, j1) != -math.inf)
        return vis

    def matmul(self, a, b, slot: str):
        """a @ b; on NumPy into a buffer reused from tile to tile (valid until the next call)."""
        if not self.numpy:
            return self.xp.matmul(a, b)
        shape = (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
        size = math.prod(shape)
        buf = self.buffers.get(slot)
        if buf is None or buf.size < size:
            buf = self.buffers[slot] = np.empty(size, dtype=a.dtype)
        return np.matmul(a, b, out=buf[:size].reshape(shape))

    def logits(self, qs, i0: int, i1: int, j0: int, j1: int):
        """s (..., Hkv, G, r, t) with hidden keys at -inf, and the visibility (None: all visible).

        s may be a reused buffer (see `matmul`): it is only valid until the next call.
        """
        xp = self.xp
        s = self.matmul(qs, self.kt5[..., j0:j1], "s")  # (..., Hkv, G, r, dk) @ (..., Hkv, 1, dk, t)
        if self.bias is not None:
            s += _tile(self.bias, self.p.n, self.p.m, i0, i1, j0, j1)
        vis = self.visible(i0, i1, j0, j1)
        if vis is not None:  # overwrite, never add: NaN + -inf is NaN
            if self.numpy:
                np.copyto(s, -math.inf, where=~vis)
            else:
                s = xp.where(vis, s, -math.inf)
        return s, vis

    def row_block(self, i0: int, i1: int, bk: int, want_weights: bool):
        xp, p, ct = self.xp, self.p, self.ct
        r = i1 - i0
        lo, hi = self.key_range(i0, i1)
        zeros_out = xp.zeros((*p.batch, p.hkv, p.group, r, p.dv), dtype=ct, device=self.device)
        if lo == hi or i0 >= self.q_hi:  # no row of this block sees any key: 0
            if not want_weights:
                return zeros_out, None
            return zeros_out, xp.zeros((*p.batch, p.hkv, p.group, r, p.m), dtype=ct, device=self.device)
        qs = self.q5[..., i0:i1, :]  # (..., Hkv, G, r, dk)
        row_max = xp.full((*p.batch, p.hkv, p.group, r, 1), -math.inf, dtype=ct, device=self.device)
        offset = xp.zeros_like(row_max)  # c: acc holds sums of exp(s - c)
        acc = xp.zeros((*p.batch, p.hkv, p.group, r, p.dv), dtype=ct, device=self.device)  # A
        denom = xp.zeros_like(row_max)  # L
        k_norm, b_max = self.logit_bound
        bounded = float(xp.max(self.q_norm[..., i0:i1])) * k_norm + b_max <= self.near
        for j0 in range(lo, hi, bk):
            j1 = min(j0 + bk, hi)
            s, _ = self.logits(qs, i0, i1, j0, j1)  # (..., Hkv, G, r, t)
            if bounded:  # c = 0 for every row (see __init__); M is not needed
                p_tile = np.exp(s, out=s) if self.numpy else xp.exp(s)
                acc += self.matmul(p_tile, self.v5[..., j0:j1, :], "pv")  # (..., r, t) @ (..., t, dv)
                denom += xp.sum(p_tile, axis=-1, keepdims=True)
                continue
            row_max = xp.maximum(row_max, xp.max(s, axis=-1, keepdims=True))  # NaN propagates
            far = ~(xp.abs(row_max) <= self.near) & (row_max != -math.inf)  # NaN and +inf included
            if bool(xp.any(far)):
                new_offset = xp.where(far, row_max, xp.asarray(0.0, dtype=ct))
                s -= new_offset
            else:
                new_offset = xp.zeros_like(row_max)
            p_tile = np.exp(s, out=s) if self.numpy else xp.exp(s)  # hidden keys: exp(-inf) = 0
            if bool(xp.any(new_offset != offset)):
                # c only decreases from 0 for a row whose sums are still 0; the clamp keeps
                # exp(c - c') from overflowing to 0 * inf = NaN there
                alpha = xp.exp(xp.minimum(offset - new_offset, xp.asarray(0.0, dtype=ct)))
                acc *= alpha
                denom *= alpha
                offset = new_offset
            acc += self.matmul(p_tile, self.v5[..., j0:j1, :], "pv")  # (..., r, t) @ (..., t, dv)
            denom += xp.sum(p_tile, axis=-1, keepdims=True)
        out = acc / xp.where(denom == 0, xp.asarray(1.0, dtype=ct), denom)
        if not (want_weights or self.nonfinite_v):
            return out, None
        # sdpa's row max and denominator, for its weights w = exp(s - max) / denom; for a bounded
        # block any finite max will do (0, the offset used): the weights are the same function
        row_max = xp.where((row_max == -math.inf) | bounded, xp.asarray(0.0, dtype=ct), row_max)
        denom = denom * xp.exp(offset - row_max)
        denom = xp.where(denom == 0, xp.asarray(1.0, dtype=ct), denom)
        tiles = []
        for j0 in range(0, p.m, bk):
            j1 = min(j0 + bk, p.m)
            s, vis = self.logits(qs, i0, i1, j0, j1)
            w = xp.exp(s - row_max) / denom  # (..., Hkv, G, r, t)
            if self.nonfinite_v and j1 > lo and j0 < hi:
                out = out + self._nonfinite(w, vis, j0, j1)
            tiles.append(w)
        if not want_weights:
            return out, None
        # a NaN or +inf visible logit makes sdpa's whole row NaN, hidden keys included
        w = xp.concat(tiles, axis=-1) if len(tiles) > 1 else tiles[0]
        w = xp.where(xp.isnan(denom), xp.asarray(math.nan, dtype=ct), w)
        return out, w

    def _nonfinite(self, w, vis, j0: int, j1: int):
        """sum over the visible keys j0..j1-1 of w_ij v_j for v's non-finite entries (see
        `_xp_core._nonfinite_values`): 0, +inf, -inf or NaN per (row, column). Added to the
        finite part, +inf and -inf from two tiles make NaN, as in the one sum."""
        xp, ct = self.xp, self.ct
        v = self.v_raw[..., j0:j1, :]  # (..., Hkv, 1, t, dv)
        if vis is None:
            seen = xp.ones(w.shape, dtype=xp.bool, device=self.device)
        else:
            seen = xp.broadcast_to(vis, w.shape)

        def hits(rows, keys):  # does any visible key of this kind reach (row, column)?
            return xp.matmul(xp.astype(rows, ct), xp.astype(keys, ct)) > 0

        pos_inf, neg_inf = v == math.inf, v == -math.inf
        any_pos = hits(seen & (w > 0), pos_inf)
        any_neg = hits(seen & (w > 0), neg_inf)
        nan = hits(seen, xp.isnan(v)) | (any_pos & any_neg) | hits(seen & (w == 0), pos_inf | neg_inf)
        zero = xp.asarray(0.0, dtype=ct)
        contrib = xp.where(any_pos, xp.asarray(math.inf, dtype=ct), zero)
        contrib = xp.where(any_neg, xp.asarray(-math.inf, dtype=ct), contrib)
        return xp.where(nan, xp.asarray(math.nan, dtype=ct), contrib)
