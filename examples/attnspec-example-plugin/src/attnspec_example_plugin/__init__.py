"""A minimal attnspec backend: attention in NumPy, written the obvious way.

Shape letters as in `attnspec.spec.sdpa`. Registered through the entry point group
``attnspec.backends`` as ``example`` (see pyproject.toml).
"""

from __future__ import annotations

import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)
import numpy as np

from attnspec.backends.authoring import Backend, attend_mask, expand_kv_heads, plan_sdpa

__all__ = ["ExampleBackend"]


class ExampleBackend(Backend):
    """float64 attention that materializes every (query, key, value-column) product."""

    name = "example"

    def asarray(self, x, dtype=None, device=None):
        x = np.array(x)  # a copy, like every backend's asarray
        return x if dtype is None else x.astype(dtype)  # NumPy knows "bfloat16" via ml_dtypes

    def to_numpy(self, x):
        return np.asarray(x)

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, return_weights=False):
        # the spec's checks, so the spec's SpecError messages for bad input
        p = plan_sdpa("example.sdpa", q, k, v, mask=mask, bias=bias, causal=causal, window=window,
                      scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths, library="numpy")
        dtype = q.dtype
        q, k, v = (_with_head(x).astype(np.float64) for x in (q, k, v))
        k = expand_kv_heads(k, p.group)  # (..., Hq, m, dk): query head h reads kv head h // G
        v = expand_kv_heads(v, p.group)  # (..., Hq, m, dv)
        # every rule (causal, window, lengths, mask, bias == -inf) folded into one mask
        vis = attend_mask(p, mask, bias, full=True)  # (..., Hq, n, m)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf inputs are allowed
            s = p.scale * (q @ np.swapaxes(k, -1, -2))  # (..., Hq, n, m)
            if bias is not None:
                s = s + bias.astype(np.float64)
            vis = np.broadcast_to(vis, p.full_weights_shape)
            s = np.where(vis, s, -np.inf)  # an absent key is gone, whatever its k holds
            top = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Hq, n, 1)
            e = np.exp(s - np.where(top == -np.inf, 0, top))
            total = e.sum(axis=-1, keepdims=True)
            w = e / np.where(total == 0, 1, total)  # a row with no visible key: weights 0
            terms = w[..., :, :, None] * v[..., None, :, :]  # (..., Hq, n, m, dv)
            out = np.where(vis[..., None], terms, 0).sum(axis=-2)  # absent keys add nothing
        out = np.broadcast_to(out, (*p.batch, p.hq, p.n, p.dv)).astype(dtype).reshape(p.out_shape)
        if not return_weights:
            return out
        return out, np.broadcast_to(w, p.full_weights_shape).astype(dtype).reshape(p.weights_shape)


def _with_head(x: np.ndarray) -> np.ndarray:
    return x[None] if x.ndim == 2 else x  # (L, d) -> (1, L, d): one head
