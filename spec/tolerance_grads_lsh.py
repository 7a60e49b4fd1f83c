"""The gradient tolerance rule for lsh_attention_vjp (`reference_lsh_vjp`, `lsh_vjp_allowed`).

The rule of `attnspec.spec.tolerance_grads`, allowed_T = K * err_ref_T + floor_T, per gradient
tensor: the reference runs LSH's forward and backward with every stored intermediate rounded to
D, and the floor is the first-order bound written out in `lsh_vjp_allowed`. Re-exported by
`attnspec.spec.tolerance_grads`.
"""

from __future__ import annotations

import math

import numpy as np

from attnspec.spec.grads import _sum_to
from attnspec.spec.grads_lsh import _lsh_grads
from attnspec.spec.lsh import NORM_EPS, LSHPlan, _rotated
from attnspec.spec.tolerance import _NP, K, eps

__all__ = ["LSH_GRAD_NAMES", "lsh_vjp_allowed", "reference_lsh_vjp"]

#: lsh_attention_vjp's gradients; dx is judged in two parts, see `lsh_vjp_allowed`
LSH_GRAD_NAMES = ("dx", "dx_zero_x", "dv")


def _finite_max(x) -> float:
    x = np.abs(np.asarray(x, dtype=np.float64))
    return float(x[np.isfinite(x)].max(initial=0.0))


def reference_lsh_vjp(plan: LSHPlan, x, v, d_out, rotations) -> dict:
    """LSH's forward and backward (`grads_lsh._lsh_grads`) with every stored intermediate rounded
    to D, in float32 for 16-bit and float32 inputs (float64 for float64), on the golden's
    buckets (the float64 hash). Returns ``{"dx": ..., "dv": ...}``, float64, each in its input's
    shape, rounded once more to D."""
    p = plan
    dt = _NP[p.dtype]
    ct = np.float64 if p.dtype == "float64" else np.float32
    B, L = math.prod(p.batch), p.L
    if B == 0 or L == 0:
        return {"dx": np.zeros(x.shape), "dv": np.zeros(v.shape)}

    def rnd(a):
        return a.astype(dt).astype(ct)

    xc = np.broadcast_to(x.astype(ct), (*p.batch, L, p.d)).reshape(B, L, p.d)  # (B, L, d)
    vc = np.broadcast_to(v.astype(ct), (*p.batch, L, p.dv)).reshape(B, L, p.dv)  # (B, L, dv)
    dO = d_out.astype(ct).reshape(B, L, p.dv)  # (B, L, dv)
    kv = np.full(B, L) if p.kv_lengths is None else p.kv_lengths.reshape(B)  # (B,)
    with np.errstate(invalid="ignore"):
        buckets = np.argmax(_rotated(xc.astype(np.float64), rotations.astype(np.float64)), axis=-1)
    with np.errstate(all="ignore"):
        dx, dv = _lsh_grads(p, xc, vc, dO, kv, buckets, rnd)
        dx = _sum_to(dx.reshape(*p.batch, L, p.d), x.shape)
        dv = _sum_to(dv.reshape(*p.batch, L, p.dv), v.shape)
    return {"dx": rnd(dx).astype(np.float64), "dv": rnd(dv).astype(np.float64)}


def lsh_vjp_allowed(plan: LSHPlan, x, v, d_out, err_ref: dict) -> dict:
    """``allowed_T`` for dx, dx_zero_x and dv of one lsh_attention_vjp case.

    dx is judged in two parts because the normalization's derivative scales with 1 / ||x[t]||:
    ``dx`` at positions with ||x[t]|| > NORM_EPS, ``dx_zero_x`` at the others (x[t] = 0, where
    k_hat = x / NORM_EPS and the key path's gradient is dk_hat / NORM_EPS, ~1e12 times larger).
    With u = eps(D), T = 2C * nh window entries a query reads over all rounds, Pc = min(L, T)
    (the most total weight one key gets), A = max|dO| max|v|, Lg = scale * max ||x[t]|| and
    n_min the smallest ||x[t]|| above NORM_EPS, each over unpadded positions:

        |ds| <= 4 A c_r w  (dP - D and dlse each bounded by 2 A c_r)
        dx query path  S_q = 4 A scale,                 c_q = T + dv
        dk_hat         S_k = 4 A scale max|x| Pc,       c_k = Pc + dv + d
        dx     floor = u (S_q b(c_q) + S_k (1 + sqrt(d)) / n_min * b(c_k))
        dx_zero_x    = u (S_q b(c_q) + S_k / NORM_EPS * b(c_k))
        dv     floor = u max|dO| Pc b(T)
        b(c) = 1 + sqrt(c) + 2 sqrt(d) Lg

    (1 + sqrt(d)) / ||x||: the normalization's Jacobian (I - k_hat k_hat^T) / ||x|| applied to
    dk_hat, whose d-term dot product k_hat . dk_hat adds the sqrt(d). Each floor is multiplied by
    the broadcast copies summed into its input's gradient.
    """
    p = plan
    u = eps(p.dtype)
    L, d = p.L, p.d
    batch = p.batch
    kv = np.broadcast_to(np.asarray(L if p.kv_lengths is None else p.kv_lengths), batch)
    unpadded = np.arange(L) < kv[..., None]  # (*batch, L)
    xb = np.broadcast_to(np.asarray(x, dtype=np.float64), (*batch, L, d))
    vb = np.broadcast_to(np.asarray(v, dtype=np.float64), (*batch, L, p.dv))
    xu, vu = xb[unpadded], vb[unpadded]  # (positions, d), (positions, dv)
    dOu = np.asarray(d_out, dtype=np.float64)[unpadded]
    norms = np.sqrt((np.where(np.isfinite(xu), xu, 0) ** 2).sum(axis=-1))
    big = norms[norms > NORM_EPS]
    n_min = float(big.min()) if big.size else math.inf
    T = 2 * p.chunk_length * p.n_hashes
    pc = min(L, T)
    A = _finite_max(dOu) * _finite_max(vu)
    Lg = p.scale * float(norms.max(initial=0.0))

    def b(c):
        return 1 + math.sqrt(c) + 2 * math.sqrt(d) * Lg

    s_q = 4 * A * p.scale
    s_k = 4 * A * p.scale * _finite_max(xu) * pc
    total = math.prod(batch)
    copies_x = total // max(math.prod(x.shape[:-2]), 1)
    copies_v = total // max(math.prod(v.shape[:-2]), 1)
    floor = {
        "dx": copies_x * u * (s_q * b(T + p.dv) + s_k * (1 + math.sqrt(d)) / n_min * b(pc + p.dv + d)),
        "dx_zero_x": copies_x * u * (s_q * b(T + p.dv) + s_k / NORM_EPS * b(pc + p.dv + d)),
        "dv": copies_v * u * _finite_max(dOu) * pc * b(T),
    }
    return {name: K * err_ref.get(name, 0.0) + f for name, f in floor.items()}
