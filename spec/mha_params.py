"""The parameters of a multi-head attention layer: `MHAParams` and the checks on their shapes.

Shape letters as in `attnspec.spec.mha`: E embed_dim, kdim and vdim the key and value features,
P = Hkv * head_dim the key and value projections' size. The conversion from and to torch's state
dicts is in `attnspec.spec.mha_torch`; the layer itself is `attnspec.spec.mha`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.validate import FLOAT_DTYPES, ArrayInfo, is_int, numpy_info

__all__ = ["MHAParams", "ParamDims", "ParamSizes", "check_param_infos"]


def _size(weight: str, axis: int, doc: str) -> Any:
    return property(lambda self: int(getattr(self, weight).shape[axis]), doc=doc)


class ParamSizes:
    """The layer's sizes, read from its weights' shapes (torch.nn.Linear's (out_features,
    in_features) layout): shared by `MHAParams` and a backend's arrays of them."""

    embed_dim = _size("w_q", 0, "E: query features, query projection size and output features.")
    kdim = _size("w_k", 1, "Key input features.")
    vdim = _size("w_v", 1, "Value input features.")
    kv_dim = _size("w_k", 0, "P = num_kv_heads * head_dim: the size keys and values are projected to.")


@dataclass(frozen=True, kw_only=True, eq=False)
class MHAParams(ParamSizes):
    """The parameters of one multi-head attention layer, as NumPy arrays.

    Weights use torch.nn.Linear's (out_features, in_features) layout: w_q (E, E), w_k (P, kdim),
    w_v (P, vdim), w_o (E, E), with P = Hkv * head_dim (P = E without grouped key/value heads).
    Biases have out_features entries, or are None (zero). Any float dtype among float16,
    bfloat16, float32 and float64; `mha` reads them in float64 whatever the inputs' dtype.
    The head counts are not stored: they are arguments of `mha`.
    """

    w_q: np.ndarray
    b_q: np.ndarray | None = None
    w_k: np.ndarray
    b_k: np.ndarray | None = None
    w_v: np.ndarray
    b_v: np.ndarray | None = None
    w_o: np.ndarray
    b_o: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_param_infos("MHAParams", lambda name: _param_info("MHAParams", name, getattr(self, name)))

    @classmethod
    def init(
        cls,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        seed: int,
        dtype=np.float64,
    ) -> MHAParams:
        """Random parameters for tests and demos, a pure function of the arguments.

        Weights are uniform in +-sqrt(6 / (fan_in + fan_out)) (Xavier/Glorot uniform, per matrix).
        Biases are uniform in +-1 / sqrt(fan_in), not zero as torch initializes them, so that a
        test which ignores a bias fails. kdim and vdim default to embed_dim; num_kv_heads to
        num_heads.
        """
        fn = "MHAParams.init"
        kdim = embed_dim if kdim is None else kdim
        vdim = embed_dim if vdim is None else vdim
        hkv = num_heads if num_kv_heads is None else num_kv_heads
        _, head_dim = _check_heads(fn, embed_dim, num_heads, hkv)
        for name, value in (("kdim", kdim), ("vdim", vdim)):
            if not is_int(value) or value < 0:
                raise SpecError(f"{fn}: {name}={value!r} must be an int >= 0")
        name = np.dtype(dtype).name
        if name not in FLOAT_DTYPES:
            raise SpecError(f"{fn}: dtype={name} must be one of {', '.join(FLOAT_DTYPES)}")
        rng = np.random.default_rng(seed)
        p = hkv * head_dim

        def weight(out_f: int, in_f: int) -> np.ndarray:
            limit = np.sqrt(6.0 / max(1, out_f + in_f))
            return rng.uniform(-limit, limit, (out_f, in_f)).astype(dtype)

        def bias_of(out_f: int, in_f: int) -> np.ndarray | None:
            if not bias:
                return None
            return (rng.uniform(-1.0, 1.0, out_f) / np.sqrt(max(1, in_f))).astype(dtype)

        return cls(
            w_q=weight(embed_dim, embed_dim),
            b_q=bias_of(embed_dim, embed_dim),
            w_k=weight(p, kdim),
            b_k=bias_of(p, kdim),
            w_v=weight(p, vdim),
            b_v=bias_of(p, vdim),
            w_o=weight(embed_dim, embed_dim),
            b_o=bias_of(embed_dim, embed_dim),
        )

    @classmethod
    def from_torch_state_dict(
        cls,
        state_dict: Mapping[str, np.ndarray],
        *,
        num_heads: int | None = None,
        add_zero_attn: bool = False,
    ) -> MHAParams:
        """Parameters from a torch.nn.MultiheadAttention state dict whose values are NumPy arrays.

        Accepts both of torch's layouts: packed (``in_proj_weight`` (3E, E), used when
        kdim == vdim == E) and separate (``q_proj_weight``, ``k_proj_weight``,
        ``v_proj_weight``); plus ``in_proj_bias`` (3E,), ``out_proj.weight`` and
        ``out_proj.bias``. Arrays are copied. ``num_heads``, when given, is checked to divide E
        (a state dict does not record it).

        Refused with `SpecError`: ``bias_k``/``bias_v`` (add_bias_kv=True appends a learned key
        and value to every sequence, which the spec does not define); ``add_zero_attn=True`` (the
        same for an all-zero key and value; the flag is not in the state dict, so the caller says
        it); unknown keys; missing keys; shapes that are not torch's.
        """
        from attnspec.spec.mha_torch import params_from_torch_state_dict  # it imports this module

        return params_from_torch_state_dict(cls, state_dict, num_heads=num_heads, add_zero_attn=add_zero_attn)

    def to_torch_state_dict(self, packed: bool | None = None) -> dict[str, np.ndarray]:
        """A state dict (NumPy arrays, copies) that torch.nn.MultiheadAttention loads.

        ``packed=None`` picks torch's own layout: packed ``in_proj_weight`` when
        kdim == vdim == embed_dim, separate ``q/k/v_proj_weight`` otherwise. ``packed=True`` is
        refused when kdim or vdim differs from embed_dim. ``packed=False`` always works, but torch
        only builds modules with that layout when kdim or vdim differs from embed_dim.

        Refused with `SpecError`: grouped key/value heads (kv_dim != embed_dim; torch has none),
        and biases on some projections but not all (torch's ``bias`` flag covers all four).
        """
        from attnspec.spec.mha_torch import params_to_torch_state_dict

        return params_to_torch_state_dict(self, packed)


@dataclass(frozen=True)
class ParamDims:
    """The sizes a layer's parameters fix: embed_dim E, kdim, vdim and kv_dim P = Hkv * hd."""

    embed_dim: int
    kdim: int
    vdim: int
    kv_dim: int


def _param_info(fn: str, name: str, x: object) -> ArrayInfo | None:
    return None if x is None and name.startswith("b_") else numpy_info(fn, name, x)


def check_param_infos(fn: str, info: Callable[[str], ArrayInfo | None], prefix: str = "") -> ParamDims:
    """`MHAParams`' rules on the parameters' ranks, dtypes and shapes; returns their sizes.

    ``info(name)`` gives the ArrayInfo of one field (None for a missing bias), or raises
    `SpecError` when the field is not an array. Only metadata is read, so backends check their
    own arrays (`attnspec.backends.base.MHAArrays`) with it. ``prefix`` goes before every field
    name in the messages (``"params."`` when the arrays are an argument of mha).
    """
    infos: dict[str, ArrayInfo | None] = {}
    for name in ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"):
        x = infos[name] = info(name)
        if x is None:
            continue
        want = 2 if name.startswith("w_") else 1
        if len(x.shape) != want:
            raise SpecError(f"{fn}: {prefix}{name}.ndim={len(x.shape)} must be {want}, got shape {x.shape}")
        if x.dtype not in FLOAT_DTYPES:
            raise SpecError(f"{fn}: {prefix}{name}.dtype={x.dtype} must be one of {', '.join(FLOAT_DTYPES)}")
    w_q, w_k, w_v = infos["w_q"], infos["w_k"], infos["w_v"]
    assert w_q is not None and w_k is not None and w_v is not None  # info gives None only for a missing bias
    e, p, vdim = w_q.shape[0], w_k.shape[0], w_v.shape[1]
    expected = {
        "w_q": (e, e),
        "w_v": (p, vdim),
        "w_o": (e, e),
        "b_q": (e,),
        "b_k": (p,),
        "b_v": (p,),
        "b_o": (e,),
    }
    why = {
        "w_q": "(embed_dim, embed_dim): the query projection is square",
        "w_v": f"({prefix}w_k.shape[0], vdim): keys and values are projected to the same size {p}",
        "w_o": f"(embed_dim, embed_dim) with embed_dim={prefix}w_q.shape[0]={e}",
    }
    for name, shape in expected.items():
        x = infos[name]
        if x is not None and x.shape != shape:
            hint = why.get(name, "(out_features,) of its weight")
            raise SpecError(f"{fn}: {prefix}{name}.shape={x.shape} must be {shape}, i.e. {hint}")
    return ParamDims(e, w_k.shape[1], vdim, p)


def _expect_shape(fn: str, name: str, x: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if x.shape != shape:
        raise SpecError(f"{fn}: {name}.shape={x.shape} must be {what}")


def _check_heads(fn: str, embed_dim: object, num_heads: object, num_kv_heads: object) -> tuple[int, int]:
    """(num_kv_heads, head_dim) after checking the head counts against embed_dim."""
    counts = []
    for name, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if not is_int(value) or value < 1:
            raise SpecError(f"{fn}: {name}={value!r} must be an int >= 1")
        counts.append(int(value))
    heads, kv_heads = counts
    if not is_int(embed_dim) or embed_dim < 1 or embed_dim % heads:
        raise SpecError(
            f"{fn}: embed_dim={embed_dim!r} must be a positive multiple of num_heads={num_heads} "
            "(head_dim = embed_dim // num_heads)"
        )
    if heads % kv_heads:
        raise SpecError(
            f"{fn}: num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads} "
            "(query head h reads kv head h // (num_heads // num_kv_heads))"
        )
    return kv_heads, int(embed_dim) // heads
