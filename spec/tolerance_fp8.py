"""The tolerance of `attnspec.spec.sdpa_fp8`: how far an FP8 kernel may be from the golden.

The model. The spec is defined on the dequantised inputs x_hat = x * descale (exact in float64),
so the inputs carry no error: their FP8 rounding happened before the call and is the caller's.
What a kernel adds is its arithmetic, in float32 (FA3 and FA4 accumulate there whatever the
storage dtype):

    logits      q.k summed over dk in float32, times the folded scale * q_descale * k_descale
                (one more float32 rounding): a logit error of ~ eps(f32) * sqrt(dk) * L, which
                moves each weight by up to twice that relatively
    P @ V       a float32 sum of up to m terms: eps(f32) * sqrt(m) * V (random-walk growth)
    v_descale   applied once at the output in float32: eps(f32) * V
    output      one rounding to out_dtype: eps(out) * V

and so, with the same K = 4 and the same err_ref as `attnspec.spec.tolerance`:

    ref      = the golden's algorithm on x_hat in float32 arithmetic (every stored intermediate
               rounded to float32: `attnspec.spec.sdpa.attention_core`, as the tolerance rule's
               reference runs it)
    err_ref  = max |ref - golden|
    allowed  = K * err_ref + eps(out) * V + eps(f32) * V * (sqrt(m) + 2 sqrt(dk) L + 1)

V = max finite |v_hat|, L = `attnspec.spec.tolerance.logit_scale` of q_hat, k_hat (ALiBi, bias
and sinks included). Weights: the same with V = 1; lse: `attnspec.spec.tolerance.lse_allowed` as
for float32 inputs. A float64 out_dtype gets the float32 terms too: the model is a float32
kernel, whatever dtype it writes.

P precision is a claim. FA3 rounds the unnormalised weights to e4m3 before P @ V: P =
exp2(s * scale - rowmax * scale + 8) lies in (0, 256], is cast (saturating at 448) to e4m3, and
the row sum uses the unrounded float32 P; that rounding is a relative 2**-4 per weight, far above
any float32 budget. A kernel that does it says so (``p_precision="float8_e4m3fn"``); then the
reference rounds P the same way (with the final row max, where a kernel uses its running one:
K covers the other order), so err_ref holds that rounding and the budget grows to match. A
kernel that claims ``"float32"`` (the default) is held to the float32 budget, and rounding P
fails it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from attnspec.spec.dtypes import eps
from attnspec.spec.fp8 import FP8Plan, dequantize, golden_fp8, plan_fp8
from attnspec.spec.sdpa import _weighted_values, _with_head, attention_core
from attnspec.spec.tolerance import K, compare, logit_scale, lse_allowed, visibility_view
from attnspec.spec.validate import SDPAExtras

__all__ = ["P_PRECISIONS", "FP8Golden", "fp8_allowed", "fp8_golden", "reference_fp8"]

#: what a kernel may claim for the weights it multiplies V by
P_PRECISIONS = ("float32", "float8_e4m3fn")
#: FA3's offset: P = exp2(... + 8) lies in (0, 2**8], inside e4m3's range
P_OFFSET = 2.0**8
#: e4m3's largest finite value; FA3's cast saturates there
E4M3_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)


@dataclass(frozen=True)
class FP8Golden:
    """The float64 golden of one sdpa_fp8 call (before the final rounding) and the allowed
    errors; weights and lse when the call asks for them."""

    out: np.ndarray
    allowed_out: float
    weights: np.ndarray | None = None
    allowed_w: float | None = None
    lse: np.ndarray | None = None
    allowed_lse: float | None = None


def fp8_golden(q, k, v, *, p_precision: str = "float32", **options: Any) -> FP8Golden:
    """The golden of ``sdpa_fp8(q, k, v, **options)`` and what a kernel claiming
    ``p_precision`` may differ from it by (`fp8_allowed`)."""
    fp = plan_fp8("fp8_golden", q, k, v, options)
    want_w = bool(options.get("return_weights"))
    parts = golden_fp8(fp, q, k, v, options, want_w)
    parts = list(parts) if isinstance(parts, tuple) else [parts]
    w = parts[1] if want_w else None
    lse = parts[-1] if fp.sdpa.return_lse else None
    out_a, w_a, lse_a = fp8_allowed(fp, q, k, v, options, parts[0], w, lse, p_precision=p_precision)
    return FP8Golden(parts[0], out_a, w, w_a, lse, lse_a)


def fp8_allowed(
    fp: FP8Plan,
    q,
    k,
    v,
    options: dict[str, Any],
    golden_out: np.ndarray,
    golden_w: np.ndarray | None = None,
    golden_lse: np.ndarray | None = None,
    *,
    p_precision: str = "float32",
) -> tuple[float, float | None, float | None]:
    """(allowed out, allowed weights, allowed lse) of one sdpa_fp8 call, by the model above.

    ``q, k, v`` are the stored inputs (FP8, or a wide q), ``options`` the call's keywords, the
    golden arrays float64 as `attnspec.spec.fp8.golden_fp8` returns them. Weights and lse get a
    budget only when their golden is given.
    """
    if p_precision not in P_PRECISIONS:
        raise ValueError(f"fp8_allowed: p_precision={p_precision!r}, expected one of {P_PRECISIONS}")
    plan = fp.sdpa
    q_hat, k_hat, v_hat = dequantize(fp, q, k, v)
    mask, bias, extras = options.get("mask"), _wide(options.get("bias")), _extras(options)
    ref_out, ref_w, ref_lse = reference_fp8(fp, q_hat, k_hat, v_hat, mask, bias, extras, p_precision)
    vis = visibility_view(plan, mask, bias, extras)
    L = logit_scale(plan, q_hat, k_hat, bias, vis, extras)
    growth = math.sqrt(plan.m) + 2.0 * math.sqrt(plan.dk) * L + 1.0
    keep = 1.0 - plan.dropout_p if extras.dropout_mask is not None else 1.0

    def allowed(ref: np.ndarray, gold: np.ndarray, value_scale: float) -> float:
        err_ref = compare(ref, gold.reshape(ref.shape), math.inf).max_abs_err
        floor = (eps(fp.out_dtype) + eps("float32") * growth) * value_scale / keep
        return K * err_ref + floor

    finite = v_hat[np.isfinite(v_hat)]
    V = float(np.abs(finite).max(initial=0.0))
    out_a = allowed(ref_out, golden_out, V)
    w_a = None if golden_w is None else allowed(ref_w, golden_w, 1.0)
    lse_a = None
    if golden_lse is not None:
        err = compare(ref_lse, np.asarray(golden_lse).reshape(ref_lse.shape), math.inf).max_abs_err
        lse_a = lse_allowed(
            dataclasses.replace(plan, dtype="float32"), q_hat, k_hat, bias, vis, err, golden_lse, extras
        )
    return out_a, w_a, lse_a


def reference_fp8(
    fp: FP8Plan, q_hat, k_hat, v_hat, mask, bias, extras: SDPAExtras, p_precision: str = "float32"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The golden's algorithm on the dequantised inputs in float32 arithmetic: out
    (*batch, Hq, n, dv), weights (*batch, Hq, n, m) and lse (*batch, Hq, n), float32.

    With ``p_precision="float8_e4m3fn"`` the weights that multiply V are rounded as FA3 rounds
    P: scaled so the row's largest is 2**8, saturated at 448, cast to e4m3, scaled back; the
    normaliser (and so lse and the returned weights) stays the unrounded one. Whole arrays, O(n * m)
    memory: meant for the suite's small cases.
    """
    plan = dataclasses.replace(fp.sdpa, dtype="float32")

    def rnd(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float32)

    out, w, lse = attention_core(
        plan, q_hat, k_hat, v_hat, mask, bias, np.float32, rnd, extras, with_lse=True
    )
    if p_precision == "float32" or plan.n == 0 or plan.m == 0 or plan.hq == 0:
        return out, w, lse
    vis = visibility_view(plan, mask, bias, extras)
    vis = np.broadcast_to(np.ones((1, 1), bool) if vis is None else vis, plan.full_weights_shape)
    with np.errstate(invalid="ignore"):
        top = np.where(vis, w, 0).max(axis=-1, keepdims=True)  # (..., Hq, n, 1): the row max's weight
        top = np.where(top > 0, top, 1).astype(np.float32)
        p = np.minimum(w * (np.float32(P_OFFSET) / top), np.float32(E4M3_MAX))  # (..., Hq, n, m), in (0, 256]
        p8 = p.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
        w8 = p8 * (top / np.float32(P_OFFSET))  # the rounded P over the unrounded row sum
    v32 = rnd(_with_head(v_hat))  # (..., Hkv, m, dv)
    return _weighted_values(w8, v32, vis, plan, rnd), w, lse


def _wide(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else np.asarray(x, dtype=np.float64)


def _extras(options: dict[str, Any]) -> SDPAExtras:
    o = options
    return SDPAExtras(
        o.get("alibi_slopes"),
        _wide(o.get("sinks")),
        o.get("q_segment_ids"),
        o.get("kv_segment_ids"),
        o.get("dropout_mask"),
    )
