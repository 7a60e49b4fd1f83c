"""A deliberately broken sdpa_blocked: the conformance suite (test_blocked) must catch it.

`BlockedNaive` adds to `mutants.Naive` an independent, deliberately plain sdpa_blocked: the full
logits as Naive builds them, then an online softmax over key tiles of ``block_k`` keys with the
textbook offset c = M (running max). With no bug it is the control and must pass. The mutant
``no_rescale`` forgets to rescale the running sums when the max grows: the terms summed so far stay
relative to the old max, so they are overweighted by exp(M_new - M_old), the classic online-softmax
bug that tiles of a single size (block_k >= m) never show.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from mutants import Naive, _np_dtype, naive_visibility

from attnspec.spec.options import OPTIONS, take, with_options
from attnspec.spec.validate import plan_options

#: sdpa's keywords but the variants': this plain sdpa_blocked refuses a variant's keyword as an
#: unexpected one
CORE = tuple(o for o in OPTIONS if o.variant is None)


class BlockedNaive(Naive):
    name = "blocked-naive"
    bug = None

    @with_options(after=("block_q", "block_k"), table=CORE)
    def sdpa_blocked(self, q, k, v, *, block_q=256, block_k=512, **options):
        fn = f"{self.name}.sdpa_blocked"
        o = SimpleNamespace(**take(fn, options, table=CORE))
        p, _ = plan_options(fn, q, k, v, vars(o))

        def lift(x):  # (..., H, L, d), batch dims broadcast out
            x = x if x.ndim > 2 else x[None]
            return np.broadcast_to(x, (*p.batch, *x.shape[-3:])).astype(np.float64)

        heads = np.arange(p.hq) // p.group
        q, k, v = lift(q), lift(k)[..., heads, :, :], lift(v)[..., heads, :, :]  # (..., Hq, L, d)
        s = np.einsum("...id,...jd->...ij", q, k) * p.scale  # (..., Hq, n, m)
        vis = naive_visibility(
            p, o.causal, o.window, o.q_lengths, o.kv_lengths, o.mask, o.bias
        )  # (..., Hq, n, m)
        if o.bias is not None:
            s = s + np.where(o.bias == -np.inf, 0, o.bias)
        s = np.where(vis, s, -np.inf)

        run_max = np.full((*p.full_weights_shape[:-1], 1), -np.inf)  # (..., Hq, n, 1)
        acc = np.zeros((*p.full_weights_shape[:-1], p.dv))  # (..., Hq, n, dv)
        total = np.zeros_like(run_max)
        with np.errstate(invalid="ignore", over="ignore"):
            for j0 in range(0, p.m, block_k):
                cols = slice(j0, j0 + block_k)
                new_max = np.maximum(run_max, s[..., cols].max(axis=-1, keepdims=True))
                safe = np.where(new_max == -np.inf, 0.0, new_max)
                e = np.exp(s[..., cols] - safe)  # (..., Hq, n, t)
                alpha = np.exp(np.where(run_max == -np.inf, safe, run_max) - safe)
                if self.bug == "no_rescale":
                    alpha = np.ones_like(alpha)
                seen = vis[..., cols]
                term = np.where(seen[..., None], e[..., None] * v[..., None, cols, :], 0).sum(-2)
                acc = alpha * acc + term
                total = alpha * total + e.sum(axis=-1, keepdims=True)
                run_max = new_max
            out = acc / np.where(total == 0, 1, total)
            safe = np.where(run_max == -np.inf, 0.0, run_max)
            w = np.where(vis, np.exp(s - safe) / np.where(total == 0, 1, total), 0)
        dt = _np_dtype(p.dtype)
        out = out.astype(dt).reshape(p.out_shape)
        return (out, w.astype(dt).reshape(p.weights_shape)) if o.return_weights else out


# mutant name -> (bug, a feature whose failure the suite must report)
MUTANTS_BLOCKED = {"no_rescale": ("no_rescale", "plain")}


def control_blocked():
    return BlockedNaive()


def mutant_no_rescale():
    attrs = {"name": "mutant-blocked-no_rescale", "bug": "no_rescale"}
    return type("Mutant_no_rescale", (BlockedNaive,), attrs)()
