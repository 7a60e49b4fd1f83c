"""Mask-only NumPy attention functions for the mask-only finite floor (conformance/corners.py,
``corner_finite_floor_mask_only``), in the ``tutorial`` convention: ``fn(Q, K, V, mask=None) ->
(output, weights)``, mask True = keep. Checked with ``--arrays numpy``."""

from __future__ import annotations

import numpy as np


def _attend(Q, K, V, mask, fill):
    ct = np.float64 if Q.dtype == np.float64 else np.float32
    Q, K, V = (np.asarray(x, ct) for x in (Q, K, V))
    s = Q @ np.swapaxes(K, -1, -2) / ct(np.sqrt(Q.shape[-1]))  # (..., H, L, S)
    keep = np.ones(s.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), s.shape)
    if fill is None:  # excluded keys: no weight, and a row with none gives 0
        top = np.where(keep, s, -np.inf).max(axis=-1, keepdims=True)
        e = np.where(keep, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
        z = e.sum(axis=-1, keepdims=True)
        w = np.where(z > 0, e / np.where(z > 0, z, 1), 0)
        out = np.where(keep[..., None], w[..., None] * V[..., None, :, :], 0).sum(axis=-2)
    else:  # the textbook masked_fill: hidden keys get the finite logit ``fill``
        s = np.where(keep, s, ct(fill))
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        w = e / e.sum(axis=-1, keepdims=True)
        out = w @ V
    dt = np.asarray(Q).dtype
    return out.astype(dt), w.astype(dt)


def correct(Q, K, V, mask=None):
    return _attend(Q, K, V, mask, None)


def fill_minus_1e4(Q, K, V, mask=None):
    return _attend(Q, K, V, mask, -1e4)


def fill_minus_1e6(Q, K, V, mask=None):
    return _attend(Q, K, V, mask, -1e6)
