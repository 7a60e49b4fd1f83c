"""Argument checking shared by the golden spec and every backend.

Backends validate framework arrays through the same code, so a bad input raises the same
`SpecError` with the same message whichever implementation is called. Only metadata (shape and
dtype name) is needed for q, k, v, mask and bias; sequence lengths are small and are checked by
value, so backends pass them in as NumPy arrays.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.dtypes import FLOAT_DTYPES, compute_dtype_name, round_to
from attnspec.spec.options import ARRAY_NAMES, VALUE_NAMES, VARIANT_ARRAYS

INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
CAUSAL_CHOICES = ("upper_left", "lower_right", "lower_right_lengths")


@dataclass(frozen=True)
class ArrayInfo:
    """What validation needs to know about an array: its shape and canonical dtype name."""

    shape: tuple[int, ...]
    dtype: str


def numpy_info(fn: str, name: str, x: object) -> ArrayInfo:
    if not isinstance(x, np.ndarray):
        raise SpecError(f"{fn}: {name} must be a numpy.ndarray, got {type(x).__name__}")
    return ArrayInfo(tuple(x.shape), x.dtype.name)


@dataclass(frozen=True)
class SDPAPlan:
    """A validated sdpa call: the sizes every implementation needs, and normalized options."""

    batch: tuple[int, ...]
    hq: int
    hkv: int
    n: int
    m: int
    dk: int
    dv: int
    squeeze_head: bool  # q had rank 2: the output drops the head axis again
    dtype: str
    scale: float
    causal: str | None
    window: tuple[int, int] | None
    q_lengths: np.ndarray | None  # int64, broadcast to `batch`
    kv_lengths: np.ndarray | None
    # The variants (issue #15). Only scalars live here, so `static_plan` stays hashable; the arrays
    # (alibi_slopes, sinks, segment ids, dropout_mask) travel beside the plan.
    softcap: float | None = None
    dropout_p: float = 0.0  # meaningful only when a dropout_mask is given
    return_lse: bool = False

    @property
    def group(self) -> int:
        return self.hq // self.hkv

    @property
    def lse_shape(self) -> tuple[int, ...]:
        """(*batch, Hq, n), or (*batch, n) when q had rank 2, like the output without its dv."""
        head = () if self.squeeze_head else (self.hq,)
        return (*self.batch, *head, self.n)

    @property
    def lse_dtype(self) -> str:
        """float64 for float64 inputs, else float32 (FlashAttention and flex return float32)."""
        return compute_dtype_name(self.dtype)

    @property
    def out_shape(self) -> tuple[int, ...]:
        head = () if self.squeeze_head else (self.hq,)
        return (*self.batch, *head, self.n, self.dv)

    @property
    def weights_shape(self) -> tuple[int, ...]:
        head = () if self.squeeze_head else (self.hq,)
        return (*self.batch, *head, self.n, self.m)

    @property
    def full_weights_shape(self) -> tuple[int, ...]:
        """(*batch, Hq, n, m), the shape mask and bias must broadcast to."""
        return (*self.batch, self.hq, self.n, self.m)


@dataclass(frozen=True, eq=False)
class SDPAExtras:
    """The array arguments of the sdpa variants, as given (NumPy arrays or None).

    They travel beside the `SDPAPlan` rather than in it, so the plan stays hashable.
    """

    alibi_slopes: np.ndarray | None = None  # (Hq,) or (..., Hq)
    sinks: np.ndarray | None = None  # (Hq,)
    q_segment_ids: np.ndarray | None = None  # (..., n)
    kv_segment_ids: np.ndarray | None = None  # (..., m)
    dropout_mask: np.ndarray | None = None  # bool, broadcastable to (..., Hq, n, m)

    @property
    def segments(self) -> bool:
        return self.q_segment_ids is not None

    @classmethod
    def of(cls, options: dict[str, Any]) -> SDPAExtras:
        """The variants' arrays of a call's keywords (those missing are None)."""
        return cls(*(options.get(name) for name in VARIANT_ARRAYS))


NO_EXTRAS = SDPAExtras()


def finish(plan: SDPAPlan, out, weights, dtype, return_weights: bool, lse=None):
    """The results as sdpa returns them: out, then weights if asked for, then lse if planned.

    out (*batch, Hq, n, dv) and weights (*batch, Hq, n, m) are cast to ``dtype``; lse
    (*batch, Hq, n) to the plan's lse dtype; each is reshaped as the plan says (rank-2 q: no head
    axis).
    """
    results = [round_to(out, dtype).reshape(plan.out_shape)]
    if return_weights:
        results.append(round_to(weights, dtype).reshape(plan.weights_shape))
    if plan.return_lse:
        results.append(np.asarray(lse).astype(plan.lse_dtype).reshape(plan.lse_shape))
    return results[0] if len(results) == 1 else tuple(results)


def is_int(x: object) -> TypeGuard[numbers.Integral]:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def check_causal(fn: str, causal: object) -> str | None:
    if causal is None or (isinstance(causal, str) and causal in CAUSAL_CHOICES):
        return causal
    raise SpecError(
        f"{fn}: causal={causal!r} is not supported; expected None, 'upper_left' "
        "(key j visible from query i iff j <= i), 'lower_right' (iff j <= i + m - n) or "
        "'lower_right_lengths' (iff j <= i + kv_length - q_length, per sequence)"
    )


def check_window(fn: str, window: object) -> tuple[int, int] | None:
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2 or not all(map(is_int, window)):
        raise SpecError(f"{fn}: window={window!r} must be None or a pair of ints (left, right)")
    left, right = int(window[0]), int(window[1])
    if left < 0 or right < 0:
        raise SpecError(f"{fn}: window={window!r} must have left >= 0 and right >= 0")
    return left, right


def check_scale(fn: str, scale: object, dk: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(dk)
    if not isinstance(scale, numbers.Real) or isinstance(scale, (bool, np.bool_)):
        raise SpecError(f"{fn}: scale must be a real number or None, got {type(scale).__name__}")
    value = float(scale)
    if not math.isfinite(value) or value <= 0:
        raise SpecError(f"{fn}: scale={value!r} must be finite and > 0")
    return value


def check_lengths(
    fn: str, name: str, lengths: object, batch: tuple[int, ...], limit: int, limit_name: str
) -> np.ndarray | None:
    if lengths is None:
        return None
    if is_int(lengths):
        lengths = np.asarray(lengths, dtype=np.int64)
    if not isinstance(lengths, np.ndarray):
        raise SpecError(f"{fn}: {name} must be an integer array or int, got {type(lengths).__name__}")
    if lengths.dtype.kind not in "iu":
        raise SpecError(f"{fn}: {name}.dtype={lengths.dtype.name} must be an integer dtype")
    if not broadcasts_to(lengths.shape, batch):
        raise SpecError(
            f"{fn}: {name}.shape={tuple(lengths.shape)} must broadcast to the batch shape {batch}"
        )
    if lengths.size and (lengths.min() < 0 or lengths.max() > limit):
        raise SpecError(
            f"{fn}: {name} must lie in [0, {limit_name}={limit}], got values in "
            f"[{int(lengths.min())}, {int(lengths.max())}]"
        )
    return np.broadcast_to(lengths.astype(np.int64), batch)


def _is_real(x: object) -> TypeGuard[numbers.Real]:
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def check_softcap(fn: str, softcap: object) -> float | None:
    if softcap is None:
        return None
    if not _is_real(softcap):
        raise SpecError(
            f"{fn}: softcap must be a real number or None, got {type(softcap).__name__} {softcap!r}"
        )
    value = float(softcap)
    if not math.isfinite(value) or value <= 0:
        raise SpecError(
            f"{fn}: softcap={value!r} must be finite and > 0 (logits become softcap * tanh(s / softcap))"
        )
    return value


def check_dropout(fn: str, dropout_p: object, mask: ArrayInfo | None, target: tuple[int, ...]) -> float:
    if dropout_p is not None:
        if not _is_real(dropout_p):
            raise SpecError(
                f"{fn}: dropout_p must be a real number or None, got {type(dropout_p).__name__} {dropout_p!r}"
            )
        if not 0.0 <= float(dropout_p) < 1.0:  # NaN fails too
            raise SpecError(f"{fn}: dropout_p={float(dropout_p)!r} must lie in [0, 1)")
    if mask is None:
        if dropout_p is not None and float(dropout_p) > 0:
            raise SpecError(
                f"{fn}: dropout_p={float(dropout_p)!r} needs a dropout_mask (bool, True = keep): "
                "the spec never draws random numbers"
            )
        return 0.0
    if dropout_p is None:
        raise SpecError(
            f"{fn}: dropout_mask was given without dropout_p; expected dropout_p in [0, 1) "
            "(kept weights are divided by 1 - dropout_p)"
        )
    if mask.dtype != "bool":
        raise SpecError(f"{fn}: dropout_mask.dtype={mask.dtype} must be bool (True = keep)")
    if not broadcasts_to(mask.shape, target):
        raise SpecError(f"{fn}: dropout_mask.shape={mask.shape} must broadcast to (..., Hq, n, m)={target}")
    return float(dropout_p)


def check_per_head(
    fn: str, name: str, info: ArrayInfo, batch: tuple[int, ...], hq: int, q_dtype: str | None
) -> None:
    """alibi_slopes ((Hq,) or (..., Hq) over the batch dims, any float dtype) and sinks ((Hq,),
    q's dtype: a sink is a logit, like bias). ``q_dtype`` None means any float dtype, batched."""
    if q_dtype is None and info.dtype not in FLOAT_DTYPES:
        raise SpecError(f"{fn}: {name}.dtype={info.dtype} must be one of {', '.join(FLOAT_DTYPES)}")
    if q_dtype is not None and info.dtype != q_dtype:
        raise SpecError(f"{fn}: {name}.dtype={info.dtype} must equal q.dtype={q_dtype}")
    batched = q_dtype is None
    expected = f"(Hq,)=({hq},)" + (f" or (..., Hq) broadcasting to {(*batch, hq)}" if batched else "")
    shape = info.shape
    ok = (
        len(shape) >= 1
        and shape[-1] == hq
        and (len(shape) == 1 or (batched and broadcasts_to(shape[:-1], batch)))
    )
    if not ok:
        raise SpecError(f"{fn}: {name}.shape={shape} must be {expected}")


def check_segments(
    fn: str, q_ids: ArrayInfo | None, kv_ids: ArrayInfo | None, batch: tuple[int, ...], n: int, m: int
) -> None:
    if (q_ids is None) != (kv_ids is None):
        given, missing = (
            ("q_segment_ids", "kv_segment_ids") if kv_ids is None else ("kv_segment_ids", "q_segment_ids")
        )
        raise SpecError(f"{fn}: {given} was given without {missing}; expected both or neither")
    if q_ids is None:
        return
    assert kv_ids is not None  # given together with q_ids (checked above)
    for name, info, length, letter in (("q_segment_ids", q_ids, n, "n"), ("kv_segment_ids", kv_ids, m, "m")):
        if info.dtype not in INT_DTYPES:
            raise SpecError(f"{fn}: {name}.dtype={info.dtype} must be an integer dtype")
        if len(info.shape) < 1 or info.shape[-1] != length or not broadcasts_to(info.shape[:-1], batch):
            raise SpecError(
                f"{fn}: {name}.shape={info.shape} must be (..., {letter})=(..., {length}) with "
                f"leading dims broadcasting to the batch shape {batch}"
            )


def check_flag(fn: str, name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise SpecError(f"{fn}: {name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _heads(info: ArrayInfo) -> int:
    return info.shape[-3] if len(info.shape) >= 3 else 1


def _batch(info: ArrayInfo) -> tuple[int, ...]:
    return info.shape[:-3]


def check_inputs(fn: str, infos: dict[str, ArrayInfo], layout: str) -> None:
    """Each input array has at least two axes (laid out as ``layout`` says) and a float dtype the
    spec defines; raise `SpecError` naming the first that does not."""
    for name, info in infos.items():
        if len(info.shape) < 2:
            raise SpecError(
                f"{fn}: {name}.ndim={len(info.shape)} must be >= 2 (expected {layout}), got shape {info.shape}"
            )
        if info.dtype not in FLOAT_DTYPES:
            raise SpecError(f"{fn}: {name}.dtype={info.dtype} must be one of {', '.join(FLOAT_DTYPES)}")


def validate_sdpa(
    fn: str,
    q: ArrayInfo,
    k: ArrayInfo,
    v: ArrayInfo,
    *,
    mask: ArrayInfo | None = None,
    bias: ArrayInfo | None = None,
    causal: object = None,
    window: object = None,
    scale: object = None,
    q_lengths: object = None,
    kv_lengths: object = None,
    softcap: object = None,
    alibi_slopes: ArrayInfo | None = None,
    sinks: ArrayInfo | None = None,
    q_segment_ids: ArrayInfo | None = None,
    kv_segment_ids: ArrayInfo | None = None,
    dropout_mask: ArrayInfo | None = None,
    dropout_p: object = None,
    return_lse: object = False,
) -> SDPAPlan:
    """Check one sdpa call and return its plan; raise `SpecError` naming the first problem.

    Arrays are described by their `ArrayInfo` (shape and dtype name); only the lengths are read by
    value. Segment ids are never checked by value: any integer is an id, a negative one padding.
    """
    check_inputs(fn, {"q": q, "k": k, "v": v}, "(..., H, L, d) or (L, d)")
    if not q.dtype == k.dtype == v.dtype:
        raise SpecError(
            f"{fn}: q, k and v must share one dtype, got q.dtype={q.dtype}, "
            f"k.dtype={k.dtype}, v.dtype={v.dtype}"
        )
    n, dk = q.shape[-2:]
    m = k.shape[-2]
    if k.shape[-1] != dk:
        raise SpecError(f"{fn}: k.shape[-1]={k.shape[-1]} must equal q.shape[-1]={dk}")
    if dk < 1:
        raise SpecError(f"{fn}: q.shape[-1]={dk} (the head dim dk) must be >= 1")
    if v.shape[-2] != m:
        raise SpecError(f"{fn}: v.shape[-2]={v.shape[-2]} must equal k.shape[-2]={m} (one value per key)")
    hq, hkv = _heads(q), _heads(k)
    if _heads(v) != hkv:
        raise SpecError(f"{fn}: v has {_heads(v)} heads (shape {v.shape}) but k has {hkv} (shape {k.shape})")
    if hkv < 1 or hq % hkv:
        raise SpecError(
            f"{fn}: q heads Hq={hq} must be a multiple of k/v heads Hkv={hkv} "
            "(query head h reads kv head h // (Hq // Hkv))"
        )
    try:
        batch = tuple(np.broadcast_shapes(_batch(q), _batch(k), _batch(v)))
    except ValueError:
        raise SpecError(
            f"{fn}: leading batch dims do not broadcast: q {_batch(q)}, k {_batch(k)}, v {_batch(v)}"
        ) from None
    scale_value = check_scale(fn, scale, dk)
    causal_value = check_causal(fn, causal)
    window_value = check_window(fn, window)
    target = (*batch, hq, n, m)
    if mask is not None:
        if mask.dtype != "bool":
            raise SpecError(f"{fn}: mask.dtype={mask.dtype} must be bool (True = may attend)")
        if not broadcasts_to(mask.shape, target):
            raise SpecError(f"{fn}: mask.shape={mask.shape} must broadcast to (..., Hq, n, m)={target}")
    if bias is not None:
        if bias.dtype != q.dtype:
            raise SpecError(f"{fn}: bias.dtype={bias.dtype} must equal q.dtype={q.dtype}")
        if not broadcasts_to(bias.shape, target):
            raise SpecError(f"{fn}: bias.shape={bias.shape} must broadcast to (..., Hq, n, m)={target}")
    softcap_value = check_softcap(fn, softcap)
    if alibi_slopes is not None:
        check_per_head(fn, "alibi_slopes", alibi_slopes, batch, hq, None)
    if sinks is not None:
        check_per_head(fn, "sinks", sinks, batch, hq, q.dtype)
    check_segments(fn, q_segment_ids, kv_segment_ids, batch, n, m)
    dropout_value = check_dropout(fn, dropout_p, dropout_mask, target)
    lse_flag = check_flag(fn, "return_lse", return_lse)
    return SDPAPlan(
        batch=batch,
        hq=hq,
        hkv=hkv,
        n=n,
        m=m,
        dk=dk,
        dv=v.shape[-1],
        squeeze_head=len(q.shape) == 2,
        dtype=q.dtype,
        scale=scale_value,
        causal=causal_value,
        window=window_value,
        q_lengths=check_lengths(fn, "q_lengths", q_lengths, batch, n, "n"),
        kv_lengths=check_lengths(fn, "kv_lengths", kv_lengths, batch, m, "m"),
        softcap=softcap_value,
        dropout_p=dropout_value,
        return_lse=lse_flag,
    )


def plan_options(
    fn: str, q: np.ndarray, k: np.ndarray, v: np.ndarray, o: dict[str, Any]
) -> tuple[SDPAPlan, SDPAExtras]:
    """Validate an sdpa call on NumPy arrays, its keywords a dict as `attnspec.spec.options.take`
    gives them, and return its plan and the variants' arrays (return_weights is not read; a
    keyword the dict lacks is at its default, None)."""

    def info(name: str, x: object) -> ArrayInfo | None:
        return None if x is None else numpy_info(fn, name, x)

    arrays = {name: info(name, o.get(name)) for name in ARRAY_NAMES}
    values = {name: o.get(name) for name in VALUE_NAMES}
    plan = validate_sdpa(
        fn,
        numpy_info(fn, "q", q),
        numpy_info(fn, "k", k),
        numpy_info(fn, "v", v),
        **arrays,
        **values,
        return_lse=o.get("return_lse", False),
    )
    return plan, SDPAExtras.of(o)
