"""A plain scaled dot-product attention, written apart from the golden: the mutation target.

`nox -s mutation` mutates this file token by token and checks every mutant with the conformance
suite; a mutant the suite passes is a wrong attention the suite cannot see. So this file imports
NumPy only and shares nothing with `attnspec.spec`: its own anchors, its own visibility test, a
loop over (batch, head) with each row's softmax written out. It takes the spec's keywords
(`spec_keywords` convention, tests/mutation/reference_convention.py) and returns what the spec
returns. Inputs arrive validated (the kit checks them before the call), so nothing here checks.

The one subtle part is non-finite values: a NaN or inf in a key or value that a row cannot see
must not reach that row, while one it can see must. The matrix product over a whole head would
multiply hidden values by a zero weight (0 * inf = NaN), so the rows that see a non-finite value
are recomputed one by one over their visible keys alone.
"""

from __future__ import annotations

import math

import numpy as np


def sdpa(
    q,
    k,
    v,
    *,
    mask=None,
    bias=None,
    causal=None,
    window=None,
    scale=None,
    q_lengths=None,
    kv_lengths=None,
    softcap=None,
    alibi_slopes=None,
    sinks=None,
    q_segment_ids=None,
    kv_segment_ids=None,
    dropout_mask=None,
    dropout_p=None,
    return_weights=False,
    return_lse=False,
):
    """The spec's sdpa: out, then the weights and the lse when asked for."""
    dtype = q.dtype
    headless = q.ndim == 2
    q3, k3, v3 = (x[None] if x.ndim == 2 else x for x in (q, k, v))
    hq, n, dk = q3.shape[-3:]
    hkv, m, dv = v3.shape[-3:]
    batch = tuple(np.broadcast_shapes(q3.shape[:-3], k3.shape[:-3], v3.shape[:-3]))
    per_group = hq // hkv
    s = 1.0 / math.sqrt(dk) if scale is None else float(scale)
    qs = np.broadcast_to(q3, (*batch, hq, n, dk))
    ks = np.broadcast_to(k3, (*batch, hkv, m, dk))
    vs = np.broadcast_to(v3, (*batch, hkv, m, dv))
    grid = (*batch, hq, n, m)
    allowed = None if mask is None else np.broadcast_to(mask, grid)
    added = None if bias is None else np.broadcast_to(bias, grid)
    kept = None if dropout_mask is None else np.broadcast_to(dropout_mask, grid)
    slopes = None if alibi_slopes is None else np.broadcast_to(alibi_slopes, (*batch, hq))
    qlen = np.broadcast_to(np.asarray(n if q_lengths is None else q_lengths), batch)
    kvlen = np.broadcast_to(np.asarray(m if kv_lengths is None else kv_lengths), batch)
    qids = None if q_segment_ids is None else np.broadcast_to(q_segment_ids, (*batch, n))
    kvids = None if kv_segment_ids is None else np.broadcast_to(kv_segment_ids, (*batch, m))

    out = np.zeros((*batch, hq, n, dv))
    weights = np.zeros(grid)
    lse = np.full((*batch, hq, n), -np.inf)
    rows = np.arange(n)
    cols = np.arange(m)
    for b in np.ndindex(*batch):
        nq, nk = int(qlen[b]), int(kvlen[b])
        a = _anchors(
            causal, n, m, nq, nk, None if qids is None else qids[b], None if kvids is None else kvids[b]
        )
        seen = (rows[:, None] < nq) & (cols[None, :] < nk)
        if causal is not None:
            seen &= cols[None, :] <= a[:, None]
        if window is not None:
            seen &= (cols[None, :] >= a[:, None] - window[0]) & (cols[None, :] <= a[:, None] + window[1])
        if qids is not None:
            qi, kj = qids[b][:, None], kvids[b][None, :]
            seen &= (qi == kj) & (qi >= 0)
        distance = np.abs(a[:, None] - cols[None, :])
        for h in range(hq):
            g = h // per_group
            vis = seen.copy()
            if allowed is not None:
                vis &= allowed[(*b, h)]
            if added is not None:
                vis &= added[(*b, h)] != -np.inf
            qh = qs[(*b, h)].astype(np.float64)
            kh = ks[(*b, g)].astype(np.float64)
            vh = vs[(*b, g)].astype(np.float64)
            with np.errstate(all="ignore"):
                logits = s * (qh @ kh.T)
                if softcap is not None:
                    logits = softcap * np.tanh(logits / softcap)
                if added is not None:
                    logits = logits + added[(*b, h)].astype(np.float64)
                if slopes is not None:
                    logits = logits - float(slopes[(*b, h)]) * distance
            sink = None if sinks is None else float(sinks[h])
            w, row_lse = _softmax(logits, vis, sink)
            if kept is not None:
                w = w * kept[(*b, h)] / (1.0 - dropout_p)
            clean = np.where(np.isfinite(vh), vh, 0.0)
            o = w @ clean
            bad_keys = ~np.isfinite(vh).all(axis=1)
            for i in np.nonzero((vis & bad_keys[None, :]).any(axis=1))[0]:
                keys = np.nonzero(vis[i])[0]
                o[i] = w[i, keys] @ vh[keys]
            out[(*b, h)] = o
            weights[(*b, h)] = w
            lse[(*b, h)] = row_lse

    results = [_cast(out, dtype)]
    if return_weights:
        results.append(_cast(weights, dtype))
    if return_lse:
        results.append(lse.astype(np.float64 if dtype == np.float64 else np.float32))
    if headless:
        results = [r[0] for r in results]
    return results[0] if len(results) == 1 else tuple(results)


def _anchors(causal, n, m, nq, nk, qids, kvids):
    """The position each query row measures causality, windows and ALiBi from."""
    i = np.arange(n)
    if causal == "lower_right":
        return i + (m - n)
    if causal != "lower_right_lengths":
        return i
    if qids is None:
        return i + (nk - nq)
    a = i.copy()
    for row in range(n):
        sid = qids[row]
        q_same = np.nonzero(qids[:nq] == sid)[0]
        k_same = np.nonzero(kvids[:nk] == sid)[0]
        q_end = q_same[-1] + 1 if len(q_same) else 0
        k_end = k_same[-1] + 1 if len(k_same) else 0
        a[row] = row + k_end - q_end
    return a


def _softmax(logits, vis, sink):
    """Row softmax over the visible logits, a sink logit in the denominator; (weights, lse).
    A NaN logit a row sees makes that row NaN (the maximum propagates it)."""
    masked = np.where(vis, logits, -np.inf)
    top = masked.max(axis=1, initial=-np.inf)
    if sink is not None:
        top = np.maximum(top, sink)
    empty = np.isneginf(top)  # no visible key and no sink
    shift = np.where(empty, 0.0, top)
    with np.errstate(all="ignore"):
        e = np.where(vis, np.exp(masked - shift[:, None]), 0.0)
        total = e.sum(axis=1) + (0.0 if sink is None else np.exp(sink - shift))
        w = np.where(empty[:, None], 0.0, e / np.where(empty, 1.0, total)[:, None])
        lse = np.where(empty, -np.inf, shift + np.log(total))
    return w, lse


def _cast(x, dtype):
    return x.astype(dtype)
