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

    #: the attention variants this sdpa implements (names from the spec's variant keywords);
    #: the suite asks `supports` first, and ``refuse_variants`` below refuses the rest (ALiBi)
    variants = frozenset({"softcap", "sinks", "lse", "segments", "causal_lower_right_lengths", "dropout"})

    # The spec's keywords, written out as a backend author meets them (`Backend.sdpa` has the same
    # list; the conformance suite checks the two agree). Kept on four lines, as the spec documents
    # them, rather than one a line.
    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, softcap=None, alibi_slopes=None, sinks=None,
             q_segment_ids=None, kv_segment_ids=None, dropout_mask=None, dropout_p=None,
             return_weights=False, return_lse=False):  # fmt: skip
        options = dict(
            mask=mask,
            bias=bias,
            causal=causal,
            window=window,
            scale=scale,
            q_lengths=q_lengths,
            kv_lengths=kv_lengths,
            softcap=softcap,
            alibi_slopes=alibi_slopes,
            sinks=sinks,
            q_segment_ids=q_segment_ids,
            kv_segment_ids=kv_segment_ids,
            dropout_mask=dropout_mask,
            dropout_p=dropout_p,
            return_lse=return_lse,
        )
        # the spec's checks, so the spec's SpecError messages for bad input
        p = plan_sdpa("example.sdpa", q, k, v, library="numpy", **options)
        # a keyword this backend cannot honour (ALiBi) raises Unsupported: refused, never ignored
        self.refuse_variants("sdpa", options)
        dtype = q.dtype
        q, k, v = (_with_head(x).astype(np.float64) for x in (q, k, v))
        k = expand_kv_heads(k, p.group)  # (..., Hq, m, dk): query head h reads kv head h // G
        v = expand_kv_heads(v, p.group)  # (..., Hq, m, dv)
        # every rule (causal and window on their anchor, lengths, segment ids, mask, bias == -inf)
        # folded into one mask; "lower_right_lengths" is anchored there too
        vis = attend_mask(
            p, mask, bias, full=True, q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids
        )  # (..., Hq, n, m)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # NaN/inf inputs are allowed
            s = p.scale * (q @ np.swapaxes(k, -1, -2))  # (..., Hq, n, m)
            if p.softcap is not None:  # capped before the bias (the spec's order)
                s = p.softcap * np.tanh(s / p.softcap)
            if bias is not None:
                s = s + bias.astype(np.float64)
            vis = np.broadcast_to(vis, p.full_weights_shape)
            s = np.where(vis, s, -np.inf)  # an absent key is gone, whatever its k holds
            top = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Hq, n, 1)
            sink = None if sinks is None else sinks.astype(np.float64)[:, None, None]  # (Hq, 1, 1)
            if sink is not None:  # one more logit per row, with no value
                top = np.maximum(top, sink)
            top = np.where(top == -np.inf, 0, top)
            e = np.exp(s - top)
            total = e.sum(axis=-1, keepdims=True)
            if sink is not None:
                total = total + np.exp(sink - top)
            w = e / np.where(total == 0, 1, total)  # a row with no visible key: weights 0
            if dropout_mask is not None:  # the given keep mask, rescaled by 1 / (1 - p)
                w = w * dropout_mask / (1.0 - p.dropout_p)
            terms = w[..., :, :, None] * v[..., None, :, :]  # (..., Hq, n, m, dv)
            out = np.where(vis[..., None], terms, 0).sum(axis=-2)  # absent keys add nothing
            lse = (top + np.log(total))[..., 0]  # (..., Hq, n): -inf for an empty row, no sink
        result = [np.broadcast_to(out, (*p.batch, p.hq, p.n, p.dv)).astype(dtype).reshape(p.out_shape)]
        if return_weights:
            result.append(np.broadcast_to(w, p.full_weights_shape).astype(dtype).reshape(p.weights_shape))
        if return_lse:  # float32 (float64 for float64 inputs), like FlashAttention's
            lse = np.broadcast_to(lse, (*p.batch, p.hq, p.n)).astype(p.lse_dtype)
            result.append(lse.reshape(p.lse_shape))
        return result[0] if len(result) == 1 else tuple(result)


def _with_head(x: np.ndarray) -> np.ndarray:
    return x[None] if x.ndim == 2 else x  # (L, d) -> (1, L, d): one head
