"""Deliberately broken backward passes: the gradient conformance properties must catch each one.

`NaiveGrad` adds to the plain forward of `mutants.Naive` an independent, plain NumPy backward
(float64, every kv head repeated to its query heads, explicit visibility, broadcast gradients
summed back by hand), with two of the variants' backward: softcap's and the sinks'. With no bug
switched on it is the control and must pass. Each mutant switches on one bug that hand-written
attention backwards have shipped.

`NaiveGradAll` adds mha_vjp (the chain rule through `mutants_mha.NaiveMHA`'s projections by
hand, around NaiveGrad's sdpa_vjp) and lsh_attention_vjp (`mutants_lsh.NaiveLSH`'s loops run
backwards, one query row and one round at a time); it is the control of `MHA_LSH_MUTANTS`.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from mutants import Naive, _np_dtype, naive_visibility
from mutants_lsh import NaiveLSH
from mutants_mha import NaiveMHA, _info

from attnspec.backends import Unsupported, _mha
from attnspec.backends.base import MHAArrays, variant_features
from attnspec.spec.lsh import NORM_EPS, plan_lsh_call
from attnspec.spec.options import LSH_OPTIONS, take, with_options
from attnspec.spec.validate import plan_options


class NaiveGrad(Naive):
    name = "naive-grad"
    grad_bug = None

    @with_options(outputs=False)
    def sdpa_vjp(self, q, k, v, d_out, **options):
        fn = f"{self.name}.sdpa_vjp"
        o = SimpleNamespace(**take(fn, options, outputs=False))
        variants = [f for f in variant_features(vars(o)) if f not in ("softcap", "sinks")]
        if variants:  # of the variants, this backward has softcap's and the sinks' only
            raise Unsupported(f"{fn}: no backward for {', '.join(variants)}")
        p, _ = plan_options(fn, q, k, v, vars(o))
        shapes = [x.shape for x in (q, k, v)] + [x.shape for x in (o.bias, o.sinks) if x is not None]
        dt = _np_dtype(p.dtype)
        if p.n == 0 or p.m == 0 or p.hq == 0:
            return tuple(np.zeros(s, dt) for s in shapes)

        def lift(x):  # (..., H, L, d), batch dims broadcast out, float64
            x = x if x.ndim > 2 else x[None]
            return np.broadcast_to(x, (*p.batch, *x.shape[-3:])).astype(np.float64)

        heads = np.arange(p.hq) // p.group
        q64, k64, v64 = lift(q), lift(k)[..., heads, :, :], lift(v)[..., heads, :, :]  # kv: (..., Hq, m, d)
        dO = d_out.astype(np.float64).reshape(*p.batch, p.hq, p.n, p.dv)
        scale = p.scale if self.grad_bug != "no_scale" else 1.0

        vis = naive_visibility(
            p, o.causal, o.window, o.q_lengths, o.kv_lengths, o.mask, o.bias
        )  # (..., Hq, n, m)
        seen = vis.any(axis=-2)[..., None]  # (..., Hq, m, 1): a key no row sees never enters a sum
        k64, v64 = np.where(seen, k64, 0), np.where(seen, v64, 0)

        s = np.einsum("...id,...jd->...ij", q64, k64) * p.scale  # (..., Hq, n, m)
        cap_grad = 1.0  # d capped logit / d logit
        if o.softcap is not None:
            th = np.tanh(s / o.softcap)
            s = o.softcap * th
            if self.grad_bug != "softcap_grad_dropped":
                cap_grad = 1 - th**2
        sink = None if o.sinks is None else o.sinks.astype(np.float64)[:, None, None]  # (Hq, 1, 1)
        if o.bias is not None:
            s = s + np.where(o.bias == -np.inf, 0, o.bias.astype(np.float64))
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if self.grad_bug == "masked_key_leak":
                top = s.max(axis=-1, keepdims=True)  # recomputed without the mask
                top = top if sink is None else np.maximum(top, sink)
                e = np.exp(s - top)
                e_sink = 0.0 if sink is None else np.exp(sink - top)
                denom = e.sum(axis=-1, keepdims=True) + e_sink
                w = e / denom
            else:
                s = np.where(vis, s, -np.inf)
                top = s.max(axis=-1, keepdims=True)
                if sink is not None:
                    top = np.maximum(top, sink)  # the sink is one more logit of the row
                if self.grad_bug != "nan_empty_rows":
                    top = np.where(np.isfinite(top), top, 0)  # rows with no visible key
                e = np.exp(s - top)
                e_sink = 0.0 if sink is None else np.exp(sink - top)  # (..., Hq, n, 1)
                denom = e.sum(axis=-1, keepdims=True) + e_sink
                if self.grad_bug != "nan_empty_rows":
                    denom = np.where(denom == 0, 1, denom)
                w = e / denom  # (..., Hq, n, m)
            out = w @ v64  # (..., Hq, n, dv)
            dp = dO @ np.swapaxes(v64, -1, -2)  # (..., Hq, n, m)
            row = (dO * out).sum(axis=-1, keepdims=True)  # (..., Hq, n, 1): D
            ds = w * (dp - row)
            ds_qk = ds * cap_grad  # the gradient of the logits before the cap
            dq = scale * ds_qk @ k64  # (..., Hq, n, dk)
            dk = scale * np.swapaxes(ds_qk, -1, -2) @ q64  # (..., Hq, m, dk)
            dv = np.swapaxes(w, -1, -2) @ dO  # (..., Hq, m, dv)
        dk = dk.reshape(*p.batch, p.hkv, p.group, p.m, p.dk).sum(axis=-3)  # back to kv heads
        dv = dv.reshape(*p.batch, p.hkv, p.group, p.m, p.dv).sum(axis=-3)
        grads = [dq, dk, dv] + ([] if o.bias is None else [ds])
        if sink is not None:  # the sink's probability times the row's D, summed over rows and batch
            d_sinks = -(e_sink / denom * row)[..., 0].reshape(-1, p.hq, p.n).sum(axis=(0, 2))  # (Hq,)
            grads.append(np.zeros_like(d_sinks) if self.grad_bug == "sinks_no_grad" else d_sinks)
        return tuple(_unbroadcast(g, s).astype(dt) for g, s in zip(grads, shapes))


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead)))  # dims the input lacked (the head of a rank-2 input too)
    axes = tuple(a for a, (s, t) in enumerate(zip(shape, g.shape)) if s == 1 and t != 1)
    return g.sum(axis=axes, keepdims=True).reshape(shape)


# mutant name -> the gradient property whose failure the suite must report
GRAD_MUTANTS = {
    "no_scale": "matches_golden",
    "masked_key_leak": "masked_keys_get_zero",
    "nan_empty_rows": "empty_rows_zero_and_finite",
}
#: the variants' backward (issue #15): softcap's derivative 1 - tanh^2 left out (the capped
#: logits differentiated as if uncapped), and sinks treated as constants (dsinks = 0), as a
#: sink held in a buffer rather than a parameter gets. Each must fail variants_match_golden.
VARIANT_GRAD_MUTANTS = {
    "softcap_grad_dropped": "variants_match_golden",
    "sinks_no_grad": "variants_match_golden",
}


def make(bug):
    return type(f"GradMutant_{bug}", (NaiveGrad,), {"name": f"grad-mutant-{bug}", "grad_bug": bug})


def control():
    return NaiveGrad()


for _bug in (*GRAD_MUTANTS, *VARIANT_GRAD_MUTANTS):
    globals()[f"mutant_{_bug}"] = (lambda b: lambda: make(b)())(_bug)


# -- mha_vjp and lsh_attention_vjp ------------------------------------------------------------------


class NaiveGradAll(NaiveGrad, NaiveMHA, NaiveLSH):
    name = "naive-grad-all"
    vjp_bug = None

    @with_options(outputs=False)
    def mha_vjp(self, query, key, value, params, d_out, *, num_heads, num_kv_heads=None, **options):
        fn = f"{self.name}.mha_vjp"
        options = take(fn, options, outputs=False)
        variants = variant_features(options)
        if variants:  # as sdpa_vjp above: the variants' backward is not here
            raise Unsupported(f"{fn}: no backward for {', '.join(variants)}")
        plan = _mha.validate(
            fn, _info, lambda x: x, (query, key, value, params, num_heads, num_kv_heads), options
        )
        mask, bias = options.pop("mask"), options.pop("bias")
        h, hkv, hd = plan.hq, plan.hkv, plan.dk
        p = params
        f = lambda x: None if x is None else x.astype(np.float64)  # noqa: E731

        def project(x, w, b):
            y = f(x) @ f(w).T  # (..., L, in) @ (in, out)
            return y if b is None else y + f(b)

        def split(x, heads):  # (..., L, heads * hd) -> (..., heads, L, hd)
            return np.swapaxes(x.reshape(*x.shape[:-1], heads, hd), -2, -3)

        def merge(x):  # (..., heads, L, hd) -> (..., L, heads * hd)
            x = np.swapaxes(x, -2, -3)
            return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])

        def outer(d, x):  # sum over rows of d^T x: (..., L, out), (..., L, in) -> (out, in)
            return d.reshape(-1, d.shape[-1]).T @ x.reshape(-1, x.shape[-1])

        q, k, v = (
            split(project(query, p.w_q, p.b_q), h),
            split(project(key, p.w_k, p.b_k), hkv),
            split(project(value, p.w_v, p.b_v), hkv),
        )
        o = self.sdpa(q, k, v, mask=mask, bias=f(bias), **options)  # (..., H, n, hd)
        dO = f(d_out)  # (..., n, E)
        do = np.ascontiguousarray(split(dO @ f(p.w_o), h))  # (..., H, n, hd)
        grads = self.sdpa_vjp(q, k, v, do, mask=mask, bias=f(bias), **options)
        dq, dk, dv = (merge(g) for g in grads[:3])
        d_w_o = outer(dO, merge(o))  # (E, E)
        if self.vjp_bug == "w_o_transposed":
            d_w_o = d_w_o.T
        d = {
            "w_q": outer(dq, f(query)),
            "w_k": outer(dk, f(key)),
            "w_v": outer(dv, f(value)),
            "w_o": d_w_o,
            "b_q": dq.reshape(-1, dq.shape[-1]).sum(0),
            "b_k": dk.reshape(-1, dk.shape[-1]).sum(0),
            "b_v": dv.reshape(-1, dv.shape[-1]).sum(0),
            "b_o": dO.reshape(-1, dO.shape[-1]).sum(0),
        }
        d_params = MHAArrays(
            **{
                name: None if getattr(p, name) is None else g.astype(getattr(p, name).dtype)
                for name, g in d.items()
            }
        )
        dt = query.dtype
        out = (dq @ f(p.w_q), dk @ f(p.w_k), dv @ f(p.w_v))
        result = [g.reshape(x.shape).astype(dt) for g, x in zip(out, (query, key, value))] + [d_params]
        return tuple(result) + (() if bias is None else (grads[3].astype(dt),))

    @with_options(outputs=False, table=LSH_OPTIONS)
    def lsh_attention_vjp(self, x, v, d_out, **options):
        p, o = plan_lsh_call(f"{self.name}.lsh_attention_vjp", x, v, options, outputs=False)
        rotations = o["rotations"]
        L = p.L
        xs = np.broadcast_to(x.astype(np.float64), (*p.batch, L, p.d))
        vs = np.broadcast_to(v.astype(np.float64), (*p.batch, L, p.dv))
        dOs = d_out.astype(np.float64)
        dx, dv = np.zeros((*p.batch, L, p.d)), np.zeros((*p.batch, L, p.dv))
        for b in np.ndindex(*p.batch):
            n = L if p.kv_lengths is None else int(p.kv_lengths[b])
            if n:
                dx[b][:n], dv[b][:n] = self._one_vjp(xs[b][:n], vs[b][:n], dOs[b][:n], rotations, n, p)
        return _unbroadcast(dx, x.shape).astype(x.dtype), _unbroadcast(dv, v.shape).astype(x.dtype)

    def _one_vjp(self, x, v, dO, rotations, n, p):
        """One batch element's unpadded positions (n, d), (n, dv), (n, dv) -> dx, dv."""
        _, buckets = self._one(
            x,
            v,
            rotations.astype(np.float64),
            n,
            p,
            n,
            p.n_hashes,
            p.n_buckets,
            p.chunk_length,
            p.padded_length,
        )  # NaiveLSH's buckets of the n positions
        windows = self._windows(buckets, n, p)
        norm = np.linalg.norm(x, axis=-1)  # (n,)
        k_hat = x / np.maximum(norm, NORM_EPS)[:, None]  # (n, d)
        dx, dk_hat, dv = np.zeros_like(x), np.zeros_like(x), np.zeros_like(v)
        for i in range(n):
            rounds = []
            count = {}
            for r in range(p.n_hashes):
                for j in windows[r, i]:
                    count[j] = count.get(j, 0) + 1
            for r in range(p.n_hashes):
                keys = [j for j in windows[r, i] if j < n and not (p.causal and j > i)]
                s = np.array([-5e4 if j == i else p.scale * x[i] @ k_hat[j] for j in keys])
                if p.dedup:
                    s = s - np.log([count[j] for j in keys])
                e = np.exp(s - s.max())
                w = e / e.sum()
                rounds.append((keys, w, w @ v[keys], s.max() + math.log(e.sum())))
            lse = np.array([r[3] for r in rounds])
            c = np.exp(lse - lse.max())
            c = c / c.sum()  # the rounds' weights
            out = sum(c_r * r[2] for c_r, r in zip(c, rounds))
            for c_r, (keys, w, o_r, _) in zip(c, rounds):
                do = c_r * dO[i]
                dlse = c_r * (dO[i] @ o_r - dO[i] @ out)
                for w_j, j in zip(w, keys):
                    dv[j] += w_j * do
                    if j == i:  # the self logit is a constant
                        continue
                    ds = w_j * (do @ v[j] - do @ o_r + dlse)
                    dx[i] += p.scale * ds * k_hat[j]
                    dk_hat[j] += p.scale * ds * x[i]
        for j in range(n):
            if self.vjp_bug == "norm_grad_ignored":  # ||x|| treated as a constant
                dx[j] += dk_hat[j] / max(norm[j], NORM_EPS)
            elif norm[j] > NORM_EPS:
                dx[j] += (dk_hat[j] - k_hat[j] * (k_hat[j] @ dk_hat[j])) / norm[j]
            else:
                dx[j] += dk_hat[j] / NORM_EPS
        return dx, dv

    @staticmethod
    def _windows(buckets, n, p):
        """{(round, position): the positions of its window}, from the sort of the spec's steps 3 and 5."""
        C, Lp, nh = p.chunk_length, p.padded_length, p.n_hashes
        eff = np.full((nh, Lp), p.n_buckets)
        eff[:, :n] = buckets[:, :n]
        order = np.concatenate([np.argsort(eff[r] * Lp + np.arange(Lp), kind="stable") for r in range(nh)])
        chunks = order.reshape(-1, C)
        windows = {}
        for r in range(nh):
            for slot in range(Lp):
                c = (r * Lp + slot) // C
                windows[r, order[r * Lp + slot]] = list(chunks[c - 1]) + list(chunks[c])
        return windows


# mutant name -> (the function it breaks, the property whose failure the suite must report)
MHA_LSH_MUTANTS = {
    "w_o_transposed": ("mha_vjp", "matches_golden"),
    "norm_grad_ignored": ("lsh_attention_vjp", "matches_golden"),
}


def control_all():
    return NaiveGradAll()


for _bug in MHA_LSH_MUTANTS:
    globals()[f"mutant_{_bug}"] = (
        lambda b: (
            lambda: type(f"GradMutant_{b}", (NaiveGradAll,), {"name": f"grad-mutant-{b}", "vjp_bug": b})()
        )
    )(_bug)
