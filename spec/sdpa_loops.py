"""`sdpa` written as explicit loops over batch, head, query and key: the literal definition of
`attnspec.spec.sdpa`'s docstring, an independent check of the vectorized code (small shapes only)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attnspec.spec.options import take, with_options
from attnspec.spec.sdpa import _with_head
from attnspec.spec.validate import finish, plan_options

__all__ = ["sdpa_loops"]


@with_options()
def sdpa_loops(q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any):
    """`sdpa` written as explicit loops over batch, head, query and key: the literal definition.

    O(n * m) Python iterations per head, so for small shapes only. It applies each rule as
    written in the docstring of `sdpa` (the anchor i', the segment ids, softcap, ALiBi, the sink,
    dropout) rather than through the mask builders and `query_anchor`, which makes it an
    independent check of the vectorized code.
    """
    o = take("sdpa_loops", options)
    p, _ = plan_options("sdpa_loops", q, k, v, o)
    mask, bias, dropout_mask, alibi_slopes = o["mask"], o["bias"], o["dropout_mask"], o["alibi_slopes"]
    sinks, q_segment_ids, kv_segment_ids = o["sinks"], o["q_segment_ids"], o["kv_segment_ids"]
    full = (*p.batch, p.hq)
    q64 = np.broadcast_to(_with_head(q).astype(np.float64), (*full, p.n, p.dk))
    k64 = np.broadcast_to(_with_head(k).astype(np.float64), (*p.batch, p.hkv, p.m, p.dk))
    v64 = np.broadcast_to(_with_head(v).astype(np.float64), (*p.batch, p.hkv, p.m, p.dv))
    fw = p.full_weights_shape
    mask_f = None if mask is None else np.broadcast_to(mask, fw)
    bias_f = None if bias is None else np.broadcast_to(bias.astype(np.float64), fw)
    keep_f = None if dropout_mask is None else np.broadcast_to(dropout_mask, fw)
    slopes = None if alibi_slopes is None else np.broadcast_to(alibi_slopes.astype(np.float64), full)
    q_ids = None if q_segment_ids is None else np.broadcast_to(q_segment_ids, (*p.batch, p.n))
    kv_ids = None if kv_segment_ids is None else np.broadcast_to(kv_segment_ids, (*p.batch, p.m))
    out = np.zeros((*full, p.n, p.dv))
    weights = np.zeros(fw)
    lse = np.full((*full, p.n), -np.inf)

    def lengths(b) -> tuple[int, int]:
        q_len = p.n if p.q_lengths is None else int(p.q_lengths[b])
        return q_len, p.m if p.kv_lengths is None else int(p.kv_lengths[b])

    def anchor(b, i) -> int:
        if p.causal == "lower_right":
            return i + p.m - p.n
        if p.causal != "lower_right_lengths":
            return i
        q_len, kv_len = lengths(b)
        if q_ids is None:
            return i + kv_len - q_len
        assert kv_ids is not None  # segment ids come both or neither (plan_numpy checked)
        sid = q_ids[b][i]  # the ends of query i's own sequence, within the lengths
        qend = max((i2 + 1 for i2 in range(q_len) if q_ids[b][i2] == sid), default=0)
        kend = max((j + 1 for j in range(kv_len) if kv_ids[b][j] == sid), default=0)
        return i + kend - qend

    def visible(b, h, i, j, i_anchor) -> bool:
        q_len, kv_len = lengths(b)
        if p.causal == "upper_left" and j > i:
            return False
        if p.causal in ("lower_right", "lower_right_lengths") and j > i_anchor:
            return False
        if p.window is not None and not (i_anchor - p.window[0] <= j <= i_anchor + p.window[1]):
            return False
        if j >= kv_len or i >= q_len:
            return False
        if q_ids is not None and kv_ids is not None and (q_ids[b][i] < 0 or q_ids[b][i] != kv_ids[b][j]):
            return False
        if mask_f is not None and not mask_f[b + (h, i, j)]:
            return False
        return bias_f is None or bias_f[b + (h, i, j)] != -np.inf

    for b in np.ndindex(*p.batch):
        for h in range(p.hq):
            g = h // p.group
            for i in range(p.n):
                i_anchor = anchor(b, i)
                keys, logits = [], []
                for j in range(p.m):
                    if visible(b, h, i, j, i_anchor):
                        logit = p.scale * float(np.dot(q64[b + (h, i)], k64[b + (g, j)]))
                        if p.softcap is not None:
                            logit = p.softcap * math.tanh(logit / p.softcap)
                        if bias_f is not None:
                            logit += bias_f[b + (h, i, j)]
                        if slopes is not None:
                            logit += -slopes[b + (h,)] * abs(i_anchor - j)
                        keys.append(j)
                        logits.append(logit)
                candidates = logits + ([] if sinks is None else [float(sinks[h])])
                if not candidates:
                    continue  # no visible key and no sink: output 0, weights 0, lse -inf
                top = np.max(candidates)  # NaN propagates, as in sdpa
                exps = [np.exp(s - top) for s in logits]
                total = sum(exps) + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
                with np.errstate(divide="ignore"):
                    lse[b + (h, i)] = top + np.log(total)
                for j, e in zip(keys, exps):
                    w = e / total
                    if keep_f is not None:
                        w = w * keep_f[b + (h, i, j)] / (1.0 - p.dropout_p)
                    weights[b + (h, i, j)] = w
                    out[b + (h, i)] += w * v64[b + (g, j)]
    return finish(p, out, weights, q.dtype, o["return_weights"], lse)
