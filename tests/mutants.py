"""Deliberately broken backends: the conformance suite must catch every one.

`Naive` is an independent, deliberately plain NumPy implementation of the spec (float64, explicit
visibility, a where-guarded weighted sum). With no bug switched on it is the control: it must pass
the suite. Each mutant switches on one bug that real implementations have shipped.
"""

from __future__ import annotations

import numpy as np

from attnspec.backends._base import Backend
from attnspec.spec._validate import numpy_info, validate_sdpa


class Naive(Backend):
    name = "naive"
    bug = None

    def asarray(self, x, dtype=None, device=None):
        return np.array(x, dtype=dtype)

    def to_numpy(self, x):
        return np.asarray(x)

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, softcap=None, alibi_slopes=None, sinks=None,
             q_segment_ids=None, kv_segment_ids=None, dropout_mask=None, dropout_p=None,
             return_weights=False, return_lse=False):
        fn = f"{self.name}.sdpa"
        info = lambda name, x: None if x is None else numpy_info(fn, name, x)  # noqa: E731
        p = validate_sdpa(fn, info("q", q), info("k", k), info("v", v), mask=info("mask", mask),
                          bias=info("bias", bias), causal=causal, window=window, scale=scale,
                          q_lengths=q_lengths, kv_lengths=kv_lengths, softcap=softcap,
                          alibi_slopes=info("alibi_slopes", alibi_slopes), sinks=info("sinks", sinks),
                          q_segment_ids=info("q_segment_ids", q_segment_ids),
                          kv_segment_ids=info("kv_segment_ids", kv_segment_ids),
                          dropout_mask=info("dropout_mask", dropout_mask),
                          dropout_p=dropout_p, return_lse=return_lse)
        # the variants of issue #15 are not this control's (Naive declares none): refused, not ignored
        self.refuse_variants("sdpa", dict(softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                                          q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                          dropout_mask=dropout_mask, dropout_p=dropout_p,
                                          return_lse=return_lse, causal=causal))
        bug = self.bug
        ct = np.float32 if bug == "f32_accumulation" and p.dtype == "float64" else np.float64

        def lift(x):  # (..., H, L, d), batch dims broadcast out
            x = x if x.ndim > 2 else x[None]
            return np.broadcast_to(x, (*p.batch, *x.shape[-3:])).astype(ct)

        q, k, v = lift(q), lift(k), lift(v)
        heads = np.arange(p.hq) % p.hkv if bug == "gqa_modulo" else np.arange(p.hq) // p.group
        k, v = k[..., heads, :, :], v[..., heads, :, :]  # (..., Hq, m, d)
        if scale is None:
            scale = 1.0 / p.dk if bug == "scale_1_over_dk" else 1.0 / np.sqrt(p.dk)
        if bug == "no_scale":
            scale = 1.0
        s = np.einsum("...id,...jd->...ij", q, k) * ct(scale)  # (..., Hq, n, m)
        i, j = np.arange(p.n)[:, None], np.arange(p.m)[None, :]
        vis = np.ones(p.full_weights_shape, bool)
        shift = p.m - p.n if causal == "lower_right" and bug != "wrong_alignment" else 0
        if causal is not None:
            vis &= (j <= i + shift + 1) if bug == "causal_off_by_one" else (j <= i + shift)
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
            if bug != "bias_ignored":
                s = s + np.where(bias == -np.inf, 0, bias).astype(ct)
        if bug == "fill_minus_1e9":
            s = np.where(vis, s, -1e9)
            w = _softmax(s, -1)
            out = w @ v  # 0 * NaN: masked NaN leaks; empty rows become mean(V)
        else:
            if bug == "no_renormalize":
                w = _softmax(s, -1) * vis
            elif bug == "softmax_wrong_axis":
                w = _softmax(np.where(vis, s, -np.inf), -2)
            else:
                w = _softmax(np.where(vis, s, -np.inf), -1)
            w = np.where(vis, np.nan_to_num(w), 0)
            out = np.where(vis[..., None], w[..., None] * v[..., None, :, :], 0).sum(-2)
            if bug == "empty_rows_mean":
                empty = ~vis.any(-1, keepdims=True)
                out = np.where(empty, v.mean(-2, keepdims=True), out)
        dt = _np_dtype(p.dtype)
        shape = p.out_shape
        out = out.astype(dt).reshape(shape)
        return (out, w.astype(dt).reshape(p.weights_shape)) if return_weights else out


def _softmax(s, axis):
    with np.errstate(invalid="ignore", over="ignore"):
        top = np.max(s, axis=axis, keepdims=True, initial=-np.inf)
        e = np.exp(s - np.where(np.isfinite(top), top, 0))
        return e / e.sum(axis=axis, keepdims=True)


def _np_dtype(name):
    from attnspec.spec.tolerance import _NP

    return _NP[name]


# mutant name -> (bug, a feature whose failure the suite must report)
MUTANTS = {
    "no_scale": ("no_scale", "plain"),
    "scale_1_over_dk": ("scale_1_over_dk", "plain"),
    "causal_off_by_one": ("causal_off_by_one", "causal_upper_left"),
    "wrong_alignment": ("wrong_alignment", "causal_lower_right"),
    "fill_minus_1e9": ("fill_minus_1e9", "masked_nonfinite"),
    "softmax_wrong_axis": ("softmax_wrong_axis", "plain"),
    "gqa_modulo": ("gqa_modulo", "gqa"),
    "empty_rows_mean": ("empty_rows_mean", "no_visible_rows"),
    "bias_ignored": ("bias_ignored", "bias"),
    "f32_accumulation": ("f32_accumulation", "plain"),
    "no_renormalize": ("no_renormalize", "mask"),
}


def make(bug):
    return type(f"Mutant_{bug}", (Naive,), {"name": f"mutant-{bug}", "bug": bug})


def control():
    return Naive()


for _name, (_bug, _) in MUTANTS.items():
    globals()[f"mutant_{_name}"] = (lambda b: (lambda: make(b)()))(_bug)


class Crasher(Naive):
    """Aborts the process (as a segfaulting kernel would) for float32 with n > m; correct elsewhere."""

    name = "crasher"

    def sdpa(self, q, k, v, **kw):
        if q.dtype == np.float32 and q.shape[-2] > k.shape[-2]:
            import os

            os.abort()
        return super().sdpa(q, k, v, **kw)


class Hanger(Naive):
    """Never returns (a deadlocked kernel) for float32 with n > m; correct elsewhere."""

    name = "hanger"

    def sdpa(self, q, k, v, **kw):
        if q.dtype == np.float32 and q.shape[-2] > k.shape[-2]:
            import time

            time.sleep(3600)
        return super().sdpa(q, k, v, **kw)


class SignatureDrift(Naive):
    """Correct numbers, but sdpa grew a keyword the spec does not have: its own run must fail."""

    name = "signature-drift"

    def sdpa(self, q, k, v, *, mask=None, bias=None, causal=None, window=None, scale=None,
             q_lengths=None, kv_lengths=None, return_weights=False, dropout_p=0.0):
        return super().sdpa(q, k, v, mask=mask, bias=bias, causal=causal, window=window, scale=scale,
                            q_lengths=q_lengths, kv_lengths=kv_lengths, return_weights=return_weights)
