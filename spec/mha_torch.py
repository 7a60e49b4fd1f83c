"""torch.nn.MultiheadAttention's state dicts to and from `MHAParams`, without importing torch.

`MHAParams.from_torch_state_dict` and `MHAParams.to_torch_state_dict` are the public names; they
call these functions, which hold torch's two layouts: packed (``in_proj_weight`` (3E, E), used when
kdim == vdim == E) and separate (``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.mha_params import MHAParams, _check_heads, _expect_shape
from attnspec.spec.validate import numpy_info

__all__ = ["params_from_torch_state_dict", "params_to_torch_state_dict"]

_PACKED_KEYS = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")
_SEPARATE_KEYS = (
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "in_proj_bias",
    "out_proj.weight",
    "out_proj.bias",
)


def params_from_torch_state_dict(
    cls: type[MHAParams],
    state_dict: Mapping[str, np.ndarray],
    *,
    num_heads: int | None = None,
    add_zero_attn: bool = False,
) -> MHAParams:
    """`MHAParams.from_torch_state_dict`, which documents it."""
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


def params_to_torch_state_dict(params: MHAParams, packed: bool | None = None) -> dict[str, np.ndarray]:
    """`MHAParams.to_torch_state_dict`, which documents it."""
    fn = "MHAParams.to_torch_state_dict"
    e = params.embed_dim
    if params.kv_dim != e:
        raise SpecError(
            f"{fn}: kv_dim=w_k.shape[0]={params.kv_dim} must equal embed_dim={e}: "
            "torch.nn.MultiheadAttention has no grouped key/value heads"
        )
    biases = {"b_q": params.b_q, "b_k": params.b_k, "b_v": params.b_v, "b_o": params.b_o}
    present = [k for k, b in biases.items() if b is not None]
    if present and len(present) != 4:
        absent = [k for k in biases if k not in present]
        raise SpecError(
            f"{fn}: torch.nn.MultiheadAttention has biases on all four projections or none; "
            f"got {', '.join(present)} set and {', '.join(absent)} None"
        )
    same_dims = params.kdim == e and params.vdim == e
    if packed is None:
        packed = same_dims
    if packed and not same_dims:
        raise SpecError(
            f"{fn}: packed=True needs kdim == vdim == embed_dim={e}, "
            f"got kdim={params.kdim}, vdim={params.vdim}"
        )
    out: dict[str, np.ndarray] = {}
    if packed:
        out["in_proj_weight"] = np.concatenate([params.w_q, params.w_k, params.w_v])  # (3E, E)
    else:
        out["q_proj_weight"] = params.w_q.copy()
        out["k_proj_weight"] = params.w_k.copy()
        out["v_proj_weight"] = params.w_v.copy()
    if present:
        out["in_proj_bias"] = np.concatenate([params.b_q, params.b_k, params.b_v])  # (3E,)
    out["out_proj.weight"] = params.w_o.copy()
    if present:
        assert params.b_o is not None  # present: all four biases are set (checked above)
        out["out_proj.bias"] = params.b_o.copy()
    return out
