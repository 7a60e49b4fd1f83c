"""Multi-head attention: input projections, `sdpa` per head, output projection.

Shape letters, used in every shape comment below:
    ...   leading batch dims (broadcast like NumPy between query, key and value)
    n     queries;  m  keys
    E     embed_dim: query features, the query projection's size and the output's features
    H     query heads;  Hkv  key/value heads (H % Hkv == 0);  G = H // Hkv
    hd    head_dim = E // H, for queries, keys and values alike
    kdim  key features;  vdim  value features (both E unless the module says otherwise)
    P     Hkv * hd, the key and value projections' size (E for plain multi-head attention)

Definition, with weights in torch.nn.Linear's (out_features, in_features) layout:

    q = query @ w_q.T + b_q                       (..., n, E)
    k = key   @ w_k.T + b_k                       (..., m, P)
    v = value @ w_v.T + b_v                       (..., m, P)
    head h of q is columns h*hd : (h+1)*hd       (..., H, n, hd); likewise k, v with Hkv heads
    o = sdpa(q, k, v, <visibility keywords>)      (..., H, n, hd)   query head h reads kv head h // G
    out = merge(o) @ w_o.T + b_o                  (..., n, E)       merge puts head h back at h*hd

A missing bias is zero. b_k adds the same scale * (q . b_k) to every logit of a query row, so it
never changes the result (softmax ignores a shift); it is kept because torch stores it. Everything
is computed in float64 and the result is cast to the inputs' dtype. A query row with no visible
key gets attention output 0 (sdpa's decision 1), so its mha output is b_o, the output projection
of zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from attnspec._errors import SpecError
from attnspec.spec._validate import FLOAT_DTYPES, ArrayInfo, SDPAPlan, is_int, numpy_info, validate_sdpa
from attnspec.spec.sdpa import sdpa

__all__ = ["MHAParams", "merge_heads", "mha", "split_heads"]

_PACKED_KEYS = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
_SEPARATE_KEYS = (
    "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias",
)


@dataclass(frozen=True, kw_only=True, eq=False)
class MHAParams:
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

    @property
    def embed_dim(self) -> int:
        """E: query features, query projection size and output features."""
        return self.w_q.shape[0]

    @property
    def kdim(self) -> int:
        """Key input features."""
        return self.w_k.shape[1]

    @property
    def vdim(self) -> int:
        """Value input features."""
        return self.w_v.shape[1]

    @property
    def kv_dim(self) -> int:
        """P = num_kv_heads * head_dim: the size keys and values are projected to."""
        return self.w_k.shape[0]

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
            w_q=weight(embed_dim, embed_dim), b_q=bias_of(embed_dim, embed_dim),
            w_k=weight(p, kdim), b_k=bias_of(p, kdim),
            w_v=weight(p, vdim), b_v=bias_of(p, vdim),
            w_o=weight(embed_dim, embed_dim), b_o=bias_of(embed_dim, embed_dim),
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
        fn = "MHAParams.from_torch_state_dict"
        if add_zero_attn:
            raise SpecError(
                f"{fn}: add_zero_attn=True is not supported: it appends an all-zero key and value "
                "to every sequence, which mha does not define"
            )
        if not isinstance(state_dict, Mapping):
            raise SpecError(
                f"{fn}: state_dict must be a mapping of names to numpy arrays, got {type(state_dict).__name__}"
            )
        keys = set(state_dict)
        if keys & {"bias_k", "bias_v"}:
            raise SpecError(
                f"{fn}: bias_k and bias_v (from add_bias_kv=True) are not supported: they append a "
                "learned key and value to every sequence, which mha does not define"
            )
        packed = "in_proj_weight" in keys
        allowed = _PACKED_KEYS if packed else _SEPARATE_KEYS
        unknown = sorted(keys - set(allowed))
        if unknown:
            layout = "packed (in_proj_weight)" if packed else "separate (q/k/v_proj_weight)"
            raise SpecError(
                f"{fn}: unknown keys {unknown} for the {layout} layout; expected keys among {list(allowed)}"
            )
        required = [k for k in allowed if k.endswith("weight")]
        missing = [k for k in required if k not in keys]
        if missing:
            raise SpecError(f"{fn}: missing keys {missing}; got {sorted(keys)}")
        for k, v in state_dict.items():
            info = numpy_info(fn, k, v)  # torch tensors are refused: convert with .numpy() first
            want = 2 if k.endswith("weight") else 1
            if len(info.shape) != want:
                raise SpecError(f"{fn}: {k}.ndim={len(info.shape)} must be {want}, got shape {info.shape}")
        sd = {k: np.array(v, copy=True) for k, v in state_dict.items()}

        if packed:
            w_in = sd["in_proj_weight"]
            e = w_in.shape[1]
            _expect_shape(fn, "in_proj_weight", w_in, (3 * e, e), "(3 * embed_dim, embed_dim)")
            w_q, w_k, w_v = w_in[:e], w_in[e : 2 * e], w_in[2 * e :]  # 3 x (E, E)
        else:
            w_q, w_k, w_v = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
            e = w_q.shape[0]
            _expect_shape(fn, "q_proj_weight", w_q, (e, e), "(embed_dim, embed_dim)")
            _expect_shape(fn, "k_proj_weight", w_k, (e, w_k.shape[1]), f"(embed_dim={e}, kdim)")
            _expect_shape(fn, "v_proj_weight", w_v, (e, w_v.shape[1]), f"(embed_dim={e}, vdim)")
        _expect_shape(fn, "out_proj.weight", sd["out_proj.weight"], (e, e), f"(embed_dim={e}, embed_dim={e})")
        b_q = b_k = b_v = None
        if "in_proj_bias" in sd:
            b_in = sd["in_proj_bias"]
            _expect_shape(fn, "in_proj_bias", b_in, (3 * e,), f"(3 * embed_dim,) with embed_dim={e}")
            b_q, b_k, b_v = b_in[:e], b_in[e : 2 * e], b_in[2 * e :]  # 3 x (E,)
        b_o = sd.get("out_proj.bias")
        if b_o is not None:
            _expect_shape(fn, "out_proj.bias", b_o, (e,), f"(embed_dim={e},)")
        if num_heads is not None:
            _check_heads(fn, e, num_heads, num_heads)
        w_o = sd["out_proj.weight"]
        return cls(w_q=w_q, b_q=b_q, w_k=w_k, b_k=b_k, w_v=w_v, b_v=b_v, w_o=w_o, b_o=b_o)

    def to_torch_state_dict(self, packed: bool | None = None) -> dict[str, np.ndarray]:
        """A state dict (NumPy arrays, copies) that torch.nn.MultiheadAttention loads.

        ``packed=None`` picks torch's own layout: packed ``in_proj_weight`` when
        kdim == vdim == embed_dim, separate ``q/k/v_proj_weight`` otherwise. ``packed=True`` is
        refused when kdim or vdim differs from embed_dim. ``packed=False`` always works, but torch
        only builds modules with that layout when kdim or vdim differs from embed_dim.

        Refused with `SpecError`: grouped key/value heads (kv_dim != embed_dim; torch has none),
        and biases on some projections but not all (torch's ``bias`` flag covers all four).
        """
        fn = "MHAParams.to_torch_state_dict"
        e = self.embed_dim
        if self.kv_dim != e:
            raise SpecError(
                f"{fn}: kv_dim=w_k.shape[0]={self.kv_dim} must equal embed_dim={e}: "
                "torch.nn.MultiheadAttention has no grouped key/value heads"
            )
        biases = {"b_q": self.b_q, "b_k": self.b_k, "b_v": self.b_v, "b_o": self.b_o}
        present = [k for k, b in biases.items() if b is not None]
        if present and len(present) != 4:
            absent = [k for k in biases if k not in present]
            raise SpecError(
                f"{fn}: torch.nn.MultiheadAttention has biases on all four projections or none; "
                f"got {', '.join(present)} set and {', '.join(absent)} None"
            )
        same_dims = self.kdim == e and self.vdim == e
        if packed is None:
            packed = same_dims
        if packed and not same_dims:
            raise SpecError(
                f"{fn}: packed=True needs kdim == vdim == embed_dim={e}, "
                f"got kdim={self.kdim}, vdim={self.vdim}"
            )
        out: dict[str, np.ndarray] = {}
        if packed:
            out["in_proj_weight"] = np.concatenate([self.w_q, self.w_k, self.w_v])  # (3E, E)
        else:
            out["q_proj_weight"] = self.w_q.copy()
            out["k_proj_weight"] = self.w_k.copy()
            out["v_proj_weight"] = self.w_v.copy()
        if present:
            out["in_proj_bias"] = np.concatenate([self.b_q, self.b_k, self.b_v])  # (3E,)
        out["out_proj.weight"] = self.w_o.copy()
        if present:
            out["out_proj.bias"] = self.b_o.copy()
        return out


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
    own arrays (`attnspec.backends._base.MHAArrays`) with it. ``prefix`` goes before every field
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
    e, p, vdim = infos["w_q"].shape[0], infos["w_k"].shape[0], infos["w_v"].shape[1]
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
    return ParamDims(e, infos["w_k"].shape[1], vdim, p)


def _expect_shape(fn: str, name: str, x: np.ndarray, shape: tuple[int, ...], what: str) -> None:
    if x.shape != shape:
        raise SpecError(f"{fn}: {name}.shape={x.shape} must be {what}")


def _check_heads(fn: str, embed_dim: object, num_heads: object, num_kv_heads: object) -> tuple[int, int]:
    """(num_kv_heads, head_dim) after checking the head counts against embed_dim."""
    for name, value in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads)):
        if not is_int(value) or value < 1:
            raise SpecError(f"{fn}: {name}={value!r} must be an int >= 1")
    if not is_int(embed_dim) or embed_dim < 1 or embed_dim % num_heads:
        raise SpecError(
            f"{fn}: embed_dim={embed_dim!r} must be a positive multiple of num_heads={num_heads} "
            "(head_dim = embed_dim // num_heads)"
        )
    if num_heads % num_kv_heads:
        raise SpecError(
            f"{fn}: num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads} "
            "(query head h reads kv head h // (num_heads // num_kv_heads))"
        )
    return int(num_kv_heads), int(embed_dim) // int(num_heads)


def split_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(..., L, H * hd) -> (..., H, L, hd): head h is columns h*hd : (h+1)*hd."""
    fn = "split_heads"
    info = numpy_info(fn, "x", x)
    if len(info.shape) < 2:
        raise SpecError(f"{fn}: x.ndim={len(info.shape)} must be >= 2 (expected (..., L, H * hd))")
    if not is_int(num_heads) or num_heads < 1 or x.shape[-1] % num_heads:
        raise SpecError(
            f"{fn}: x.shape[-1]={x.shape[-1]} must be a multiple of num_heads={num_heads!r} >= 1"
        )
    x = x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)  # (..., L, H, hd)
    return np.swapaxes(x, -2, -3)  # (..., H, L, hd)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(..., H, L, hd) -> (..., L, H * hd): the inverse of `split_heads`."""
    fn = "merge_heads"
    info = numpy_info(fn, "x", x)
    if len(info.shape) < 3:
        raise SpecError(f"{fn}: x.ndim={len(info.shape)} must be >= 3 (expected (..., H, L, hd))")
    x = np.swapaxes(x, -2, -3)  # (..., L, H, hd)
    return x.reshape(*x.shape[:-2], x.shape[-2] * x.shape[-1])  # (..., L, H*hd)


def _project(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x.astype(np.float64) @ w.astype(np.float64).T  # (..., L, in) @ (in, out) -> (..., L, out)
    return y if b is None else y + b.astype(np.float64)


def _validate(fn, query, key, value, params, num_heads, num_kv_heads, mask, bias, options) -> SDPAPlan:
    def dims() -> ParamDims:
        if not isinstance(params, MHAParams):
            raise SpecError(f"{fn}: params must be an MHAParams, got {type(params).__name__}")
        return ParamDims(params.embed_dim, params.kdim, params.vdim, params.kv_dim)

    return validate_mha(fn, numpy_info, query, key, value, dims, num_heads, num_kv_heads, mask, bias, options)


def _same(x: Any) -> Any:
    return x


def validate_mha(
    fn: str,
    info: Callable[[str, str, Any], ArrayInfo],
    query: Any,
    key: Any,
    value: Any,
    params_dims: Callable[[], ParamDims],
    num_heads: object,
    num_kv_heads: object,
    mask: Any,
    bias: Any,
    options: dict[str, Any],
    lengths_to_numpy: Callable[[Any], Any] = _same,
) -> SDPAPlan:
    """Check one mha call on metadata alone; return the plan of its per-head sdpa call.

    Shared by the spec and every backend, so a bad input raises the same `SpecError` wherever it
    is called. ``info(fn, name, x)`` returns the ArrayInfo of one array (raising SpecError for
    anything that is not the caller's array type); ``params_dims()`` checks the parameters and
    returns their sizes; ``lengths_to_numpy`` turns framework length arrays into NumPy (they are
    checked by value). The plan's q is (..., H, n, hd), its k and v (..., Hkv, m, hd).
    """
    infos = {}
    for name, x in (("query", query), ("key", key), ("value", value)):
        i = infos[name] = info(fn, name, x)
        if len(i.shape) < 2:
            raise SpecError(
                f"{fn}: {name}.ndim={len(i.shape)} must be >= 2 (expected (..., L, features)), "
                f"got shape {i.shape}"
            )
        if i.dtype not in FLOAT_DTYPES:
            raise SpecError(f"{fn}: {name}.dtype={i.dtype} must be one of {', '.join(FLOAT_DTYPES)}")
    qi, ki, vi = infos["query"], infos["key"], infos["value"]
    if not qi.dtype == ki.dtype == vi.dtype:
        raise SpecError(
            f"{fn}: query, key and value must share one dtype, got query.dtype={qi.dtype}, "
            f"key.dtype={ki.dtype}, value.dtype={vi.dtype}"
        )
    d = params_dims()
    e = d.embed_dim
    hkv, hd = _check_heads(fn, e, num_heads, num_heads if num_kv_heads is None else num_kv_heads)
    if d.kv_dim != hkv * hd:
        raise SpecError(
            f"{fn}: params.w_k.shape[0]={d.kv_dim} must equal num_kv_heads * head_dim = {hkv} * {hd} "
            f"(num_kv_heads defaults to num_heads; head_dim = embed_dim // num_heads = {e} // {num_heads})"
        )
    for name, x, want, what in (
        ("query", qi, e, "params.embed_dim"),
        ("key", ki, d.kdim, "params.kdim"),
        ("value", vi, d.vdim, "params.vdim"),
    ):
        if x.shape[-1] != want:
            raise SpecError(f"{fn}: {name}.shape[-1]={x.shape[-1]} must equal {what}={want}")
    if vi.shape[-2] != ki.shape[-2]:
        raise SpecError(
            f"{fn}: value.shape[-2]={vi.shape[-2]} must equal key.shape[-2]={ki.shape[-2]} "
            "(one value per key)"
        )
    try:
        np.broadcast_shapes(qi.shape[:-2], ki.shape[:-2], vi.shape[:-2])
    except ValueError:
        raise SpecError(
            f"{fn}: leading batch dims do not broadcast: query {qi.shape[:-2]}, "
            f"key {ki.shape[:-2]}, value {vi.shape[:-2]}"
        ) from None
    bias_info = None if bias is None else info(fn, "bias", bias)
    if bias_info is not None and bias_info.dtype != qi.dtype:
        raise SpecError(f"{fn}: bias.dtype={bias_info.dtype} must equal query.dtype={qi.dtype}")
    # The remaining keywords mean exactly what they mean to sdpa; checking them here, against the
    # head-split shapes, makes their messages name mha rather than the sdpa call inside it.
    n, m = qi.shape[-2], ki.shape[-2]
    opts = dict(options)
    for name in ("q_lengths", "kv_lengths"):
        opts[name] = lengths_to_numpy(opts.get(name))
    return validate_sdpa(
        fn,
        ArrayInfo((*qi.shape[:-2], int(num_heads), n, hd), qi.dtype),
        ArrayInfo((*ki.shape[:-2], hkv, m, hd), qi.dtype),
        ArrayInfo((*vi.shape[:-2], hkv, m, hd), qi.dtype),
        mask=None if mask is None else info(fn, "mask", mask),
        bias=bias_info,
        **opts,
    )


def mha(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: MHAParams,
    *,
    num_heads: int,
    num_kv_heads: int | None = None,
    mask: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    causal: str | None = None,
    window: tuple[int, int] | None = None,
    scale: float | None = None,
    q_lengths: np.ndarray | int | None = None,
    kv_lengths: np.ndarray | int | None = None,
    return_weights: bool = False,
):
    """Multi-head attention, exactly as defined in this module's docstring.

    Args:
        query: (..., n, E); key: (..., m, kdim); value: (..., m, vdim). Rank >= 2; leading batch
            dims broadcast like NumPy. One dtype among float16, bfloat16, float32, float64.
        params: the projections; any float dtype, always read in float64 (they are the layer's
            own parameters, not inputs, so they need not match the inputs' dtype).
        num_heads: H; embed_dim must be a multiple of it. head_dim = E // H.
        num_kv_heads: Hkv (default H); H must be a multiple of it, and params.kv_dim = Hkv * hd.
            Query head h reads key/value head h // (H // Hkv) (grouped-query attention; Hkv = 1
            is multi-query attention).
        mask, bias, causal, window, scale, q_lengths, kv_lengths: passed to `sdpa` unchanged, so
            they mean exactly what they mean there: mask is bool with True = may attend, bias is
            additive in the inputs' dtype with -inf = absent, both broadcast against
            (..., H, n, m); scale defaults to 1 / sqrt(head_dim).
        return_weights: also return the attention weights per head, (..., H, n, m).

    Returns:
        (..., n, E) in the inputs' dtype, and the weights when asked.

    Raises:
        SpecError: for any input outside the definition, naming ``mha`` and the argument.
    """
    fn = "mha"
    options = dict(
        causal=causal, window=window, scale=scale, q_lengths=q_lengths, kv_lengths=kv_lengths
    )
    _validate(fn, query, key, value, params, num_heads, num_kv_heads, mask, bias, options)
    hkv = num_heads if num_kv_heads is None else num_kv_heads

    q = split_heads(_project(query, params.w_q, params.b_q), num_heads)  # (..., n, E) -> (..., H, n, hd)
    k = split_heads(_project(key, params.w_k, params.b_k), hkv)  # (..., m, P) -> (..., Hkv, m, hd)
    v = split_heads(_project(value, params.w_v, params.b_v), hkv)  # (..., m, P) -> (..., Hkv, m, hd)
    bias64 = None if bias is None else bias.astype(np.float64)  # sdpa wants bias in q's dtype
    o, w = sdpa(q, k, v, mask=mask, bias=bias64, return_weights=True, **options)  # (..., H, n, hd)
    out = _project(merge_heads(o), params.w_o, params.b_o)  # (..., n, E)
    out = out.astype(query.dtype)
    if not return_weights:
        return out
    return out, w.astype(query.dtype)  # (..., H, n, m)

