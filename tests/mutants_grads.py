"""Deliberately broken backward passes: the gradient conformance properties must catch each one.

`NaiveGrad` adds to the plain forward of `mutants.Naive` an independent, plain NumPy backward
(float64, every kv head repeated to its query heads, explicit visibility, broadcast gradients
summed back by hand). With no bug switched on it is the control and must pass. Each mutant
switches on one bug that hand-written attention backwards have shipped.
"""

from __future__ import annotations

import numpy as np

from mutants import Naive, _np_dtype
from attnspec.spec._validate import ArrayInfo, validate_sdpa


class NaiveGrad(Naive):
    name = "naive-grad"
    grad_bug = None

    def sdpa_vjp(self, q, k, v, d_out, *, mask=None, bias=None, causal=None, window=None, scale=None,
                 q_lengths=None, kv_lengths=None):
        info = lambda x: None if x is None else ArrayInfo(tuple(x.shape), x.dtype.name)  # noqa: E731
        p = validate_sdpa(f"{self.name}.sdpa_vjp", info(q), info(k), info(v), mask=info(mask),
                          bias=info(bias), causal=causal, window=window, scale=scale,
                          q_lengths=q_lengths, kv_lengths=kv_lengths)
        shapes = [x.shape for x in (q, k, v)] + ([] if bias is None else [bias.shape])
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

        i, j = np.arange(p.n)[:, None], np.arange(p.m)[None, :]
        shift = p.m - p.n if causal == "lower_right" else 0
        vis = np.ones(p.full_weights_shape, bool)
        if causal is not None:
            vis &= j <= i + shift
        if window is not None:
            vis &= (j >= i + shift - window[0]) & (j <= i + shift + window[1])
        if kv_lengths is not None:
            vis &= j < p.kv_lengths[..., None, None, None]
        if q_lengths is not None:
            vis &= i < p.q_lengths[..., None, None, None]
        if mask is not None:
            vis &= mask
        if bias is not None:
            vis &= bias != -np.inf
        seen = vis.any(axis=-2)[..., None]  # (..., Hq, m, 1): a key no row sees never enters a sum
        k64, v64 = np.where(seen, k64, 0), np.where(seen, v64, 0)

        s = np.einsum("...id,...jd->...ij", q64, k64) * p.scale  # (..., Hq, n, m)
        if bias is not None:
            s = s + np.where(bias == -np.inf, 0, bias.astype(np.float64))
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            if self.grad_bug == "masked_key_leak":
                e = np.exp(s - s.max(axis=-1, keepdims=True))  # recomputed without the mask
                w = e / e.sum(axis=-1, keepdims=True)
            else:
                s = np.where(vis, s, -np.inf)
                top = s.max(axis=-1, keepdims=True)
                if self.grad_bug != "nan_empty_rows":
                    top = np.where(np.isfinite(top), top, 0)  # rows with no visible key
                e = np.exp(s - top)
                denom = e.sum(axis=-1, keepdims=True)
                if self.grad_bug != "nan_empty_rows":
                    denom = np.where(denom == 0, 1, denom)
                w = e / denom  # (..., Hq, n, m)
            out = w @ v64  # (..., Hq, n, dv)
            dp = dO @ np.swapaxes(v64, -1, -2)  # (..., Hq, n, m)
            ds = w * (dp - (dO * out).sum(axis=-1, keepdims=True))
            dq = scale * ds @ k64  # (..., Hq, n, dk)
            dk = scale * np.swapaxes(ds, -1, -2) @ q64  # (..., Hq, m, dk)
            dv = np.swapaxes(w, -1, -2) @ dO  # (..., Hq, m, dv)
        dk = dk.reshape(*p.batch, p.hkv, p.group, p.m, p.dk).sum(axis=-3)  # back to kv heads
        dv = dv.reshape(*p.batch, p.hkv, p.group, p.m, p.dv).sum(axis=-3)
        grads = [dq, dk, dv] + ([] if bias is None else [ds])
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


def make(bug):
    return type(f"GradMutant_{bug}", (NaiveGrad,), {"name": f"grad-mutant-{bug}", "grad_bug": bug})


def control():
    return NaiveGrad()


for _bug in GRAD_MUTANTS:
    globals()[f"mutant_{_bug}"] = (lambda b: (lambda: make(b)()))(_bug)
