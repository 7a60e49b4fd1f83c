"""Attention on FP8 inputs with per-tensor descale factors: what FlashAttention-3 kernels take.

Shape letters as in `attnspec.spec.sdpa` (``...`` batch, Hq / Hkv heads, G = Hq // Hkv, n, m,
dk, dv). q, k, v are stored as ``float8_e4m3fn`` or ``float8_e5m2`` (ml_dtypes' names, torch's
too) and each comes with a float32 descale, broadcastable to (..., Hkv):

    x_hat     = float64(x) * float64(x_descale)        exact: a 4-bit times a 24-bit significand
    q_hat[h]  = float64(q[h]) * q_descale[..., h // G]  q's descale is indexed by kv head, as in FA3
    out       = round_to(sdpa(q_hat, k_hat, v_hat, **options) in float64, out_dtype)

that is: dequantise exactly, then the float64 golden of `attnspec.spec.sdpa` (every option:
masks, windows, lengths, softcap, ALiBi, sinks...), then one rounding to ``out_dtype``. A kernel
that folds q_descale * k_descale into the softmax scale and applies v_descale at the output
computes the same function (the descales are per head, so they factor out of q.k and of w @ v).
spec/README.md, "sdpa_fp8", states the decisions; `attnspec.spec.tolerance_fp8` the tolerance.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.dtypes import FLOAT_DTYPES, round_to
from attnspec.spec.options import ARRAY_NAMES, VALUE_NAMES, take, with_options
from attnspec.spec.sdpa import golden
from attnspec.spec.validate import ArrayInfo, SDPAExtras, SDPAPlan, broadcasts_to, numpy_info, validate_sdpa

__all__ = [
    "FP8_DTYPES",
    "FP8Plan",
    "dequantize",
    "finish_fp8",
    "golden_fp8",
    "plan_fp8",
    "sdpa_fp8",
    "validate_fp8",
]

#: the FP8 storage dtypes of q, k and v (kept apart from FLOAT_DTYPES, which every property of
#: the suite runs over)
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
#: FP8 dtype name -> NumPy dtype (ml_dtypes)
FP8_NUMPY: dict[str, np.dtype] = {name: np.dtype(getattr(ml_dtypes, name)) for name in FP8_DTYPES}
#: the dtypes q may have when k and v are FP8 and q is not (an FP8 KV cache, as FlashInfer and
#: vLLM take): then q carries no descale
WIDE_Q_DTYPES = ("float16", "bfloat16", "float32")
#: the dtypes a caller may ask for the output in
OUT_DTYPES = FLOAT_DTYPES
#: bias and sinks are logits, which an FP8 kernel holds in float32
LOGIT_DTYPE = "float32"


@dataclass(frozen=True, eq=False)
class FP8Plan:
    """A validated sdpa_fp8 call: the sdpa plan of the dequantised (float64) inputs, the dtypes,
    and the descales as float64, broadcast to the batch."""

    sdpa: SDPAPlan
    fp8: str  # k's and v's dtype
    q_dtype: str  # fp8, or one of WIDE_Q_DTYPES
    out_dtype: str
    q_descale: np.ndarray  # (*batch, Hq): query head h's is q_descale[..., h // G]
    k_descale: np.ndarray  # (*batch, Hkv)
    v_descale: np.ndarray  # (*batch, Hkv)

    @property
    def lse_dtype(self) -> str:
        """float32, or float64 when the output is float64 (as sdpa's lse follows its dtype)."""
        return "float64" if self.out_dtype == "float64" else "float32"


@with_options()
def sdpa_fp8(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    q_descale: np.ndarray | float | None = None,
    k_descale: np.ndarray | float | None = None,
    v_descale: np.ndarray | float | None = None,
    out_dtype: str | None = None,
    **options: Any,
):
    """Scaled dot-product attention of FP8 q, k, v with descale factors, exactly.

    Args:
        q: (..., Hq, n, dk), float8_e4m3fn or float8_e5m2 (k's dtype), or float16, bfloat16 or
            float32 (an FP8 KV cache with a wide query; then q_descale must be None).
        k: (..., Hkv, m, dk); v: (..., Hkv, m, dv): one FP8 dtype, the same for both.
        q_descale, k_descale, v_descale: float32 arrays broadcastable to (..., Hkv) (FA3's
            (batch, nheads_k)), or real numbers (taken as float32), or None (1). Finite and > 0.
            Query head h is scaled by q_descale[..., h // G], like the kv head it reads. A descale
            given for a tensor that is not FP8 is refused.
        out_dtype: "float16", "bfloat16", "float32" or "float64"; None: bfloat16 when q is FP8
            (what FA3 returns), else q's dtype.
        mask, causal, window, scale, q_lengths, kv_lengths, softcap, alibi_slopes,
            q_segment_ids, kv_segment_ids, dropout_mask, dropout_p: as `attnspec.spec.sdpa`,
            applied to the dequantised inputs (the scale multiplies q_hat . k_hat).
        bias, sinks: as sdpa's, but float32: they are logits, which FP8 kernels hold in float32.
        return_weights: also return the weights, in out_dtype.
        return_lse: also return the log-sum-exp, float32 (float64 when out_dtype is float64).

    Returns:
        out (..., Hq, n, dv) in out_dtype; ``(out, weights)``, ``(out, lse)`` or
        ``(out, weights, lse)`` when asked for. The value is sdpa's float64 golden on
        x_hat = float64(x) * descale, rounded once to out_dtype.

    Raises:
        SpecError: for a dtype other than those above, k and v of different FP8 dtypes, a
            descale of another dtype or shape, non-finite or <= 0, a descale for a non-FP8
            tensor, an unknown out_dtype, and anything `attnspec.spec.sdpa` refuses.
    """
    o = {
        "q_descale": q_descale,
        "k_descale": k_descale,
        "v_descale": v_descale,
        "out_dtype": out_dtype,
        **take("sdpa_fp8", options),
    }
    fp = plan_fp8("sdpa_fp8", q, k, v, o)
    return finish_fp8(fp, golden_fp8(fp, q, k, v, o, o["return_weights"]), o["return_weights"])


def golden_fp8(fp: FP8Plan, q, k, v, options: dict[str, Any], return_weights: bool):
    """sdpa's float64 golden on the dequantised inputs, before the final rounding: out, then
    weights (when asked for) and lse (when planned), all float64."""
    o = options
    q_hat, k_hat, v_hat = dequantize(fp, q, k, v)
    extras = SDPAExtras(
        o.get("alibi_slopes"),
        _wide(o.get("sinks")),
        o.get("q_segment_ids"),
        o.get("kv_segment_ids"),
        o.get("dropout_mask"),
    )
    return golden(fp.sdpa, q_hat, k_hat, v_hat, o.get("mask"), _wide(o.get("bias")), return_weights, extras)


def plan_fp8(fn: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, options: dict[str, Any]) -> FP8Plan:
    """The validated plan of ``sdpa_fp8(q, k, v, **options)`` on NumPy arrays (the tolerance
    rule and the suite plan through it too)."""
    o = options

    def info(name: str) -> ArrayInfo | None:
        return None if o.get(name) is None else numpy_info(fn, name, o[name])

    scalars = ("q_descale", "k_descale", "v_descale", "out_dtype", *VALUE_NAMES)
    return validate_fp8(
        fn,
        numpy_info(fn, "q", q),
        numpy_info(fn, "k", k),
        numpy_info(fn, "v", v),
        **{name: info(name) for name in ARRAY_NAMES},
        **{name: o.get(name) for name in scalars},
        return_lse=o.get("return_lse", False),
    )


def finish_fp8(fp: FP8Plan, result, return_weights: bool):
    """sdpa's float64 results (out, then weights and lse as asked) rounded once: out and weights
    to out_dtype, lse to `FP8Plan.lse_dtype`."""
    parts = list(result) if isinstance(result, tuple) else [result]
    out = [round_to(parts[0], fp.out_dtype)]
    if return_weights:
        out.append(round_to(parts[1], fp.out_dtype))
    if fp.sdpa.return_lse:
        out.append(np.asarray(parts[-1]).astype(fp.lse_dtype))
    return out[0] if len(out) == 1 else tuple(out)


def _wide(x: np.ndarray | None) -> np.ndarray | None:
    return None if x is None else np.asarray(x, dtype=np.float64)


def dequantize(fp: FP8Plan, q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q_hat, k_hat, v_hat in float64: each tensor times its descale, exactly (an FP8 significand
    has 4 bits, a float32 one 24, so the product fits float64's 53). A rank-2 input gains a head
    axis and the batch dims of its descale."""

    def scaled(x: np.ndarray, d: np.ndarray) -> np.ndarray:
        x64 = np.asarray(x, dtype=np.float64)
        x64 = x64[None] if x64.ndim == 2 else x64  # (L, d) -> (1, L, d): one head
        with np.errstate(invalid="ignore"):  # inf * descale stays inf; NaN stays NaN
            return x64 * d[..., :, None, None]  # (..., H, L, d)

    return scaled(q, fp.q_descale), scaled(k, fp.k_descale), scaled(v, fp.v_descale)


def validate_fp8(
    fn: str,
    q: ArrayInfo,
    k: ArrayInfo,
    v: ArrayInfo,
    *,
    q_descale: object = None,
    k_descale: object = None,
    v_descale: object = None,
    out_dtype: object = None,
    bias: ArrayInfo | None = None,
    sinks: ArrayInfo | None = None,
    **sdpa_arguments: Any,
) -> FP8Plan:
    """Check one sdpa_fp8 call and return its plan; raise `SpecError` naming the first problem.

    q, k, v, bias and sinks are described by their `ArrayInfo`; the descales are read by value
    (NumPy arrays or real numbers: backends pass theirs as NumPy, they are tiny). The other
    arguments are `attnspec.spec.validate.validate_sdpa`'s, checked by it as for the
    dequantised inputs.
    """
    fp8 = _check_storage(fn, q, k, v)
    out = _check_out_dtype(fn, out_dtype, q.dtype)
    for name, x in (("bias", bias), ("sinks", sinks)):
        if x is not None and x.dtype != LOGIT_DTYPE:
            raise SpecError(
                f"{fn}: {name}.dtype={x.dtype} must be {LOGIT_DTYPE} (a logit, which an "
                "FP8 kernel holds in float32)"
            )

    def wide(x: ArrayInfo) -> ArrayInfo:
        return ArrayInfo(x.shape, "float64")

    def wide_or_none(x: ArrayInfo | None) -> ArrayInfo | None:
        return None if x is None else wide(x)

    plan = validate_sdpa(
        fn, wide(q), wide(k), wide(v), bias=wide_or_none(bias), sinks=wide_or_none(sinks), **sdpa_arguments
    )
    target = (*plan.batch, plan.hkv)
    qd = _check_descale(fn, "q_descale", q_descale, target, "q", q.dtype)
    kd = _check_descale(fn, "k_descale", k_descale, target, "k", k.dtype)
    vd = _check_descale(fn, "v_descale", v_descale, target, "v", v.dtype)
    qd = np.repeat(qd, plan.group, axis=-1)  # (..., Hkv) -> (..., Hq): head h reads h // G's
    return FP8Plan(plan, fp8, q.dtype, out, qd, kd, vd)


def _check_storage(fn: str, q: ArrayInfo, k: ArrayInfo, v: ArrayInfo) -> str:
    for name, x in (("k", k), ("v", v)):
        if x.dtype not in FP8_DTYPES:
            raise SpecError(f"{fn}: {name}.dtype={x.dtype} must be one of {', '.join(FP8_DTYPES)}")
    if k.dtype != v.dtype:
        raise SpecError(f"{fn}: k and v must share one FP8 dtype, got k.dtype={k.dtype}, v.dtype={v.dtype}")
    if q.dtype != k.dtype and q.dtype not in WIDE_Q_DTYPES:
        raise SpecError(
            f"{fn}: q.dtype={q.dtype} must be k.dtype={k.dtype} or one of {', '.join(WIDE_Q_DTYPES)}"
        )
    return k.dtype


def _check_out_dtype(fn: str, out_dtype: object, q_dtype: str) -> str:
    if out_dtype is None:
        return "bfloat16" if q_dtype in FP8_DTYPES else q_dtype
    if not isinstance(out_dtype, str) or out_dtype not in OUT_DTYPES:
        raise SpecError(f"{fn}: out_dtype={out_dtype!r} must be None or one of {', '.join(OUT_DTYPES)}")
    return out_dtype


def _check_descale(
    fn: str, name: str, value: object, target: tuple[int, ...], tensor: str, tensor_dtype: str
) -> np.ndarray:
    """The descale as float64, broadcast to ``target`` (*batch, Hkv); ones when None."""
    if value is None:
        return np.ones(target)
    if tensor_dtype not in FP8_DTYPES:
        raise SpecError(
            f"{fn}: {name} was given, but {tensor}.dtype={tensor_dtype} is not FP8; "
            "expected None (only an FP8 tensor has a descale)"
        )
    if isinstance(value, np.ndarray):
        if value.dtype != np.float32:
            raise SpecError(f"{fn}: {name}.dtype={value.dtype.name} must be float32")
        if not broadcasts_to(tuple(value.shape), target):
            raise SpecError(f"{fn}: {name}.shape={tuple(value.shape)} must broadcast to (..., Hkv)={target}")
        d = value.astype(np.float64)
    elif isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        with np.errstate(over="ignore"):
            d = np.asarray(np.float32(value), dtype=np.float64)  # held as float32, as kernels hold it
    else:
        raise SpecError(
            f"{fn}: {name} must be a float32 array broadcastable to (..., Hkv)={target}, "
            f"a real number or None, got {type(value).__name__}"
        )
    if d.size and not (np.isfinite(d) & (d > 0)).all():
        raise SpecError(
            f"{fn}: {name} must be finite and > 0, got values in [{float(np.min(d))!r}, {float(np.max(d))!r}]"
        )
    return np.broadcast_to(d, target)
