"""Deliberately broken lsh_attention backends: the LSH conformance properties must catch each one.

`NaiveLSH` is an independent, plain NumPy implementation of `attnspec.spec.lsh` (float64, one
batch element and one round at a time, windows as index lists). With no bug switched on it is
the control and must pass. Each mutant switches on one bug an LSH implementation can ship.
"""

from __future__ import annotations

import math

import numpy as np

from attnspec.backends._common import to_reference
from attnspec.backends.base import Backend
from attnspec.spec.lsh import NORM_EPS, SELF_LOGIT, plan_lsh_call
from attnspec.spec.options import LSH_OPTIONS, with_options


class NaiveLSH(Backend):
    name = "naive-lsh"
    bug = None

    def asarray(self, x, dtype=None, device=None):
        return np.array(to_reference(x, dtype))

    def to_numpy(self, x):
        return np.asarray(x)

    @with_options(table=LSH_OPTIONS)
    def lsh_attention(self, x, v, **options):
        p, o = plan_lsh_call(f"{self.name}.lsh_attention", x, v, options)
        rotations = o["rotations"]
        L, nh, nb, C, Lp = p.L, p.n_hashes, p.n_buckets, p.chunk_length, p.padded_length
        xs = np.broadcast_to(x.astype(np.float64), (*p.batch, L, p.d))
        vs = np.broadcast_to(v.astype(np.float64), (*p.batch, L, p.dv))
        R = rotations.astype(np.float64)
        if self.bug == "random_rotations":  # draws its own rotations on every call
            R = np.random.default_rng().standard_normal(R.shape)
        out = np.zeros((*p.batch, L, p.dv))
        buckets = np.zeros((*p.batch, nh, L), np.int64)
        for b in np.ndindex(*p.batch):
            n = L if p.kv_lengths is None else int(p.kv_lengths[b])
            out[b], buckets[b] = self._one(xs[b], vs[b], R, n, p, L, nh, nb, C, Lp)
        out = out.astype(x.dtype)
        return (out, buckets) if o["return_buckets"] else out

    def _one(self, x, v, R, n, p, L, nh, nb, C, Lp):
        xp = np.zeros((Lp, p.d))
        xp[:n] = x[:n]
        vp = np.zeros((Lp, p.dv))
        vp[:n] = v[:n]
        k_hat = xp / np.maximum(np.linalg.norm(xp, axis=-1, keepdims=True), NORM_EPS)
        with np.errstate(invalid="ignore"):
            proj = np.einsum("td,dk->tk", np.where(np.isfinite(xp), xp, 0), R.reshape(p.d, -1)).reshape(
                Lp, nh, -1
            )
        bk = np.argmax(np.concatenate([proj, -proj], -1), -1).T  # (nh, Lp)
        bk[:, n:] = nb
        order = np.concatenate([np.argsort(bk[r] * Lp + np.arange(Lp), kind="stable") for r in range(nh)])
        chunks = order.reshape(-1, C)
        rank = np.empty(nh * Lp, np.int64)  # rank[r * Lp + t]: flat slot of position t in round r
        for r in range(nh):
            rank[r * Lp + order[r * Lp : (r + 1) * Lp]] = r * Lp + np.arange(Lp)
        windows = {}
        for r in range(nh):
            for i in range(n):
                slot = r * Lp + i if self.bug == "queries_by_position" else rank[r * Lp + i]
                c = slot // C
                own = list(chunks[c])
                windows[r, i] = own if self.bug == "no_lookback" else list(chunks[c - 1]) + own
        out_r = np.zeros((nh, Lp, p.dv))
        lse_r = np.zeros((nh, Lp))
        for i in range(n):
            count = {}
            for r in range(nh):
                for j in windows[r, i]:
                    count[j] = count.get(j, 0) + 1
            for r in range(nh):
                keys = [j for j in windows[r, i] if j < n and not (p.causal and j > i)]
                s = np.array([SELF_LOGIT if j == i else p.scale * xp[i] @ k_hat[j] for j in keys])
                if p.dedup:
                    s = s - np.log([count[j] for j in keys])
                top = s.max()
                e = np.exp(s - top)
                out_r[r, i] = (e / e.sum()) @ vp[keys]
                lse_r[r, i] = top + math.log(e.sum())
        if self.bug == "no_undo_sort":  # round outputs left in sorted order
            out_r = np.stack([out_r[r][order[r * Lp : (r + 1) * Lp]] for r in range(nh)])
        if self.bug == "mean_of_rounds":
            rw = np.full((nh, Lp), 1.0 / nh)
        else:
            rw = np.exp(lse_r - lse_r.max(0))
            rw = rw / rw.sum(0)
        out = (rw[..., None] * out_r).sum(0)
        out[n:] = 0
        return out[:L], bk[:, :L]


# mutant -> the conformance properties (test names) that must catch it
MUTANTS = {
    "no_undo_sort": ("test_matches_golden",),
    "no_lookback": ("test_matches_golden", "test_one_round_two_chunks_is_full_attention"),
    "mean_of_rounds": ("test_matches_golden", "test_dedup_is_softmax_over_window_union"),
    "random_rotations": ("test_matches_golden", "test_deterministic"),
    "queries_by_position": ("test_matches_golden",),
}


def make(bug):
    return type(f"MutantLSH_{bug}", (NaiveLSH,), {"name": f"mutant-lsh-{bug}", "bug": bug})


def control():
    return NaiveLSH()


for _name in MUTANTS:
    globals()[f"mutant_{_name}"] = (lambda b: lambda: make(b)())(_name)
