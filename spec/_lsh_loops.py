"""`lsh_attention` as Python loops over the numbered steps of `attnspec.spec.lsh`'s docstring: an
independent check of the vectorized golden, for tiny inputs (tests/test_spec_lsh.py)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from attnspec.spec.dtypes import round_to
from attnspec.spec.lsh import NORM_EPS, SELF_LOGIT, plan_lsh_call
from attnspec.spec.options import LSH_OPTIONS, with_options


@with_options(table=LSH_OPTIONS)
def _lsh_attention_loops(x: np.ndarray, v: np.ndarray, **options):
    """`lsh_attention` as Python loops over the numbered steps: an independent check, tiny inputs.
    It takes `lsh_attention`'s keywords (`attnspec.spec.options.LSH_OPTIONS`)."""
    fn = "_lsh_attention_loops"
    p, o = plan_lsh_call(fn, x, v, options)
    L, nh, nb, C, Lp = p.L, p.n_hashes, p.n_buckets, p.chunk_length, p.padded_length
    xs = np.broadcast_to(x.astype(np.float64), (*p.batch, L, p.d))
    vs = np.broadcast_to(v.astype(np.float64), (*p.batch, L, p.dv))
    R = o["rotations"].astype(np.float64)
    out = np.zeros((*p.batch, L, p.dv))
    all_buckets = np.zeros((*p.batch, nh, L), np.int64)
    for b in np.ndindex(*p.batch):
        n = L if p.kv_lengths is None else int(p.kv_lengths[b])
        xb = [[float(c) for c in xs[b][t]] for t in range(L)]

        def k_hat(j: int, xb: list[list[float]] = xb) -> list[float]:  # this b's rows
            norm = math.sqrt(sum(c * c for c in xb[j]))
            return [c / max(norm, NORM_EPS) for c in xb[j]]

        slots: list[int] = []  # steps 2, 3, 9: the flat sorted sequence of all rounds
        for r in range(nh):
            bucket = {}
            for t in range(Lp):
                bucket[t] = _hash_one(xb[t], R, r) if t < n else nb
                if t < L:
                    all_buckets[b + (r, t)] = bucket[t]
            slots += sorted(range(Lp), key=lambda t: (bucket[t], t))
        chunks = [slots[c : c + C] for c in range(0, len(slots), C)]  # step 5

        for i in range(n):  # padded query rows stay 0
            windows = []
            for r in range(nh):
                c = (r * Lp + slots[r * Lp : (r + 1) * Lp].index(i)) // C
                windows.append(chunks[c - 1] + chunks[c])  # chunks[-1] wraps to the last chunk
            count = Counter(j for window in windows for j in window)  # step 8
            lses, outs = [], []
            for window in windows:  # steps 4, 6, 7 for one round
                logits, values = [], []
                for j in window:
                    if j >= n or (p.causal and j > i):
                        continue
                    if j == i:
                        logit = SELF_LOGIT
                    else:
                        logit = p.scale * sum(a * c for a, c in zip(xb[i], k_hat(j)))
                    if p.dedup:
                        logit -= math.log(count[j])
                    logits.append(logit)
                    values.append(vs[b][j])
                top = max(logits)
                exps = [math.exp(s - top) for s in logits]
                total = sum(exps)
                lses.append(top + math.log(total))
                outs.append(sum(e / total * val for e, val in zip(exps, values)))
            top = max(lses)
            round_w = [math.exp(s - top) for s in lses]
            out[b + (i,)] = sum(rw / sum(round_w) * o for rw, o in zip(round_w, outs))
    out = round_to(out, x.dtype)
    return (out, all_buckets) if o["return_buckets"] else out


def _hash_one(xt: list[float], R: np.ndarray, r: int) -> int:
    d, _, K = R.shape
    proj = [sum(xt[a] * float(R[a, r, k]) for a in range(d)) for k in range(K)]
    values = proj + [-s for s in proj]
    best = 0
    for idx, value in enumerate(values):
        if value > values[best]:  # strict: the first index wins ties
            best = idx
    return best
