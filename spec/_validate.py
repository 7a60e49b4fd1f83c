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

import numpy as np

from attnspec._errors import SpecError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
CAUSAL_CHOICES = ("upper_left", "lower_right")


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

    @property
    def group(self) -> int:
        return self.hq // self.hkv

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


def is_int(x: object) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def check_causal(fn: str, causal: object) -> str | None:
    if causal is None or (isinstance(causal, str) and causal in CAUSAL_CHOICES):
        return causal
    raise SpecError(
        f"{fn}: causal={causal!r} is not supported; expected None, 'upper_left' "
        "(key j visible from query i iff j <= i) or 'lower_right' (iff j <= i + m - n)"
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


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _heads(info: ArrayInfo) -> int:
    return info.shape[-3] if len(info.shape) >= 3 else 1


def _batch(info: ArrayInfo) -> tuple[int, ...]:
    return info.shape[:-3]


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
) -> SDPAPlan:
    """Check one sdpa call and return its plan; raise `SpecError` naming the first problem."""
    for name, info in (("q", q), ("k", k), ("v", v)):
        if len(info.shape) < 2:
            raise SpecError(
                f"{fn}: {name}.ndim={len(info.shape)} must be >= 2 "
                f"(expected (..., H, L, d) or (L, d)), got shape {info.shape}"
            )
        if info.dtype not in FLOAT_DTYPES:
            raise SpecError(f"{fn}: {name}.dtype={info.dtype} must be one of {', '.join(FLOAT_DTYPES)}")
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
    )
