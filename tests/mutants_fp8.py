"""FP8 kernels with the bugs FP8 attention ships, for the suite to catch (tests/test_mutants_fp8.py).

`FP8Kernel` computes sdpa_fp8 the way FlashAttention-3 does, in plain NumPy float32: q . k on the
stored FP8 values, the softmax scale folded with q_descale * k_descale, P @ V on the stored v, and
v_descale applied at the output. With no bug it is the control and must pass. Each mutant
switches on one bug:

- ``forget_descale``: drops k_descale on one call and v_descale on the next;
- ``descale_twice``: folds q_descale * k_descale into the scale *and* dequantises q and k;
- ``p_e4m3``: rounds P to e4m3 as FA3 does (scaled so the row max is 2**8), while claiming float32
  P; ``p_e4m3_claimed`` is the same kernel with the claim made, which must pass.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from attnspec.backends.base import Backend, Unsupported
from attnspec.spec.dtypes import round_to
from attnspec.spec.fp8 import validate_fp8
from attnspec.spec.masks import visibility
from attnspec.spec.options import take, with_options
from attnspec.spec.validate import numpy_info

BUGS = ("forget_descale", "descale_twice", "p_e4m3")
#: the keywords this kernel refuses, as FA3 does
UNSUPPORTED = ("mask", "bias", "alibi_slopes", "sinks", "q_segment_ids", "dropout_mask")


class FP8Kernel(Backend):
    name = "fp8_kernel"
    bug: str | None = None
    calls = 0

    def asarray(self, x, dtype=None, device=None):
        return np.array(x)

    def to_numpy(self, x):
        return np.asarray(x)

    @with_options()
    def sdpa_fp8(self, q, k, v, *, q_descale=None, k_descale=None, v_descale=None, out_dtype=None, **options):
        fn = f"{self.name}.sdpa_fp8"
        o = take(fn, options)
        if any(o[name] is not None for name in UNSUPPORTED) or o["return_weights"]:
            raise Unsupported(f"{fn} takes no mask, bias, ALiBi, sinks, segments, dropout or weights")
        infos = (numpy_info(fn, "q", q), numpy_info(fn, "k", k), numpy_info(fn, "v", v))
        descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
        kept = {name: o[name] for name in ("causal", "window", "scale", "q_lengths", "kv_lengths", "softcap")}
        fp = validate_fp8(fn, *infos, **descales, out_dtype=out_dtype, return_lse=o["return_lse"], **kept)
        softcap, return_lse = o["softcap"], o["return_lse"]
        p, f32 = fp.sdpa, np.float32
        self.calls += 1
        G = p.group
        qd = fp.q_descale.astype(f32)  # (*batch, Hq)
        kd = np.repeat(fp.k_descale, G, axis=-1).astype(f32)  # (*batch, Hq)
        vd = np.repeat(fp.v_descale, G, axis=-1).astype(f32)  # (*batch, Hq)
        if self.bug == "forget_descale":
            if self.calls % 2:
                kd = np.ones_like(kd)
            else:
                vd = np.ones_like(vd)

        def heads(x):  # (..., H, L, d) float32, batch broadcast out
            x = x.astype(f32)
            x = x[None] if x.ndim == 2 else x
            return np.broadcast_to(x, (*p.batch, *x.shape[-3:]))

        qs, ks, vs = (
            heads(q),
            np.repeat(heads(k), G, axis=-3),
            np.repeat(heads(v), G, axis=-3),
        )  # (..., Hq, L, d)
        if self.bug == "descale_twice":
            qs = qs * qd[..., None, None]
            ks = ks * kd[..., None, None]
        fold = (f32(p.scale) * qd * kd)[..., None, None]  # (..., Hq, 1, 1): the scale, folded
        s = (qs @ np.swapaxes(ks, -1, -2)) * fold  # (..., Hq, n, m)
        if softcap is not None:
            s = f32(softcap) * np.tanh(s / f32(softcap))
        vis = visibility(
            p.n, p.m, causal=p.causal, window=p.window, q_lengths=p.q_lengths, kv_lengths=p.kv_lengths
        )
        if vis is not None:
            s = np.where(vis, s, -np.inf)
        row_max = s.max(axis=-1, keepdims=True, initial=-np.inf)  # (..., Hq, n, 1)
        row_max = np.where(row_max == -np.inf, 0, row_max)
        P = np.exp(s - row_max)  # (..., Hq, n, m), in (0, 1]
        Z = P.sum(axis=-1, keepdims=True)  # the unrounded P's sum, as FA3 sums it
        if self.bug == "p_e4m3":
            P = (P * f32(256)).astype(ml_dtypes.float8_e4m3fn).astype(f32) / f32(256)
        out = (P @ vs) / np.where(Z == 0, 1, Z) * vd[..., None, None]  # (..., Hq, n, dv)
        out = round_to(out.astype(np.float64), fp.out_dtype).reshape(p.out_shape)
        if not return_lse:
            return out
        with np.errstate(divide="ignore"):
            lse = (row_max + np.log(Z))[..., 0]  # (..., Hq, n)
        return out, lse.astype(fp.lse_dtype).reshape(p.lse_shape)


def _mutant(bug: str | None, claim: str = "float32") -> type[FP8Kernel]:
    name = f"fp8_{bug or 'control'}" + ("_claimed" if claim != "float32" else "")
    return type(name, (FP8Kernel,), {"name": name, "bug": bug, "fp8_p_precision": claim})


control = _mutant(None)
mutant_forget_descale = _mutant("forget_descale")
mutant_descale_twice = _mutant("descale_twice")
mutant_p_e4m3 = _mutant("p_e4m3")
#: the FA3 rounding, declared: the claim is what makes it conform
mutant_p_e4m3_claimed = _mutant("p_e4m3", "float8_e4m3fn")
