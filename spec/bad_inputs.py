"""The bad-input catalogue: every call the spec refuses, as data.

Each entry builds a call from NumPy arrays; the spec's own tests run it against `sdpa`, and the
conformance suite converts the arrays with a backend's ``asarray`` and runs it against that
backend. Every entry must raise `SpecError` whose message matches ``match`` (a regex that leaves
out the function name, so it holds for ``sdpa``, ``torch.sdpa`` and the rest).

`SDPA_VARIANT_BAD_INPUTS` holds the entries for the variant keywords of issue #15 (softcap,
alibi_slopes, sinks, segment ids, dropout, return_lse), in the same format. They are a tuple of
their own so that a backend that does not take those keywords yet is not judged on them by the
suites that run `SDPA_BAD_INPUTS`; `ALL_SDPA_BAD_INPUTS` is both.

`MHA_BAD_INPUTS` are mha's (`MHABadInput`: a layer's parameters besides query, key and value),
the variants' included: mha checks them against its heads and names them as its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import Any

import numpy as np

from attnspec.spec.mha_params import MHAParams


@dataclass(frozen=True)
class BadInput:
    id: str
    match: str
    q: tuple[int, ...] = (2, 5, 8)  # shapes of q, k, v: (H, L, d)
    k: tuple[int, ...] = (2, 7, 8)
    v: tuple[int, ...] = (2, 7, 4)
    dtypes: tuple[str, str, str] = ("float32", "float32", "float32")
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> tuple[tuple[np.ndarray, ...], dict[str, Any]]:
        """(q, k, v) and keyword options, as NumPy values (arrays stay arrays)."""
        rng = np.random.default_rng(0)
        qkv = tuple(
            (rng.standard_normal(shape) * 3).astype(dt)
            for shape, dt in zip((self.q, self.k, self.v), self.dtypes)
        )
        return qkv, dict(self.options)


_f32 = np.float32
SDPA_BAD_INPUTS: tuple[BadInput, ...] = (
    BadInput("q_rank_1", r"q\.ndim=1 must be >= 2", q=(8,)),
    BadInput("v_rank_1", r"v\.ndim=1 must be >= 2", v=(4,)),
    BadInput("dk_mismatch", r"k\.shape\[-1\]=32 must equal q\.shape\[-1\]=64", q=(2, 5, 64), k=(2, 7, 32)),
    BadInput("dk_zero", r"q\.shape\[-1\]=0 .* must be >= 1", q=(2, 5, 0), k=(2, 7, 0)),
    BadInput("kv_length_mismatch", r"v\.shape\[-2\]=6 must equal k\.shape\[-2\]=7", v=(2, 6, 4)),
    BadInput("kv_heads_mismatch", r"v has 1 heads .* k has 2", v=(1, 7, 4)),
    BadInput("gqa_not_multiple", r"Hq=3 must be a multiple of .* Hkv=2", q=(3, 5, 8)),
    BadInput(
        "batch_not_broadcast", r"batch dims do not broadcast", q=(3, 2, 5, 8), k=(4, 2, 7, 8), v=(4, 2, 7, 4)
    ),
    BadInput("int_dtype", r"q\.dtype=int32 must be one of", dtypes=("int32", "int32", "int32")),
    BadInput("mixed_dtypes", r"must share one dtype", dtypes=("float32", "float64", "float32")),
    BadInput("mask_not_bool", r"mask\.dtype=float32 must be bool", options={"mask": np.ones((5, 7), _f32)}),
    BadInput(
        "mask_not_broadcast", r"mask\.shape=\(5, 6\) must broadcast", options={"mask": np.ones((5, 6), bool)}
    ),
    BadInput(
        "mask_adds_batch",
        r"mask\.shape=\(3, 2, 5, 7\) must broadcast",
        options={"mask": np.ones((3, 2, 5, 7), bool)},
    ),
    BadInput(
        "bias_not_broadcast", r"bias\.shape=\(4, 7\) must broadcast", options={"bias": np.zeros((4, 7), _f32)}
    ),
    BadInput(
        "bias_dtype", r"bias\.dtype=float64 must equal q\.dtype=float32", options={"bias": np.zeros((5, 7))}
    ),
    BadInput(
        "kv_lengths_negative", r"kv_lengths must lie in \[0, m=7\]", options={"kv_lengths": np.array(-1)}
    ),
    BadInput(
        "kv_lengths_too_long", r"kv_lengths must lie in \[0, m=7\]", options={"kv_lengths": np.array(8)}
    ),
    BadInput("q_lengths_too_long", r"q_lengths must lie in \[0, n=5\]", options={"q_lengths": np.array(6)}),
    BadInput(
        "lengths_float",
        r"kv_lengths\.dtype=float64 must be an integer dtype",
        options={"kv_lengths": np.array(3.0)},
    ),
    BadInput(
        "lengths_not_broadcast",
        r"kv_lengths\.shape=\(3,\) must broadcast to the batch shape \(2,\)",
        q=(2, 2, 5, 8),
        k=(2, 2, 7, 8),
        v=(2, 2, 7, 4),
        options={"kv_lengths": np.array([1, 2, 3])},
    ),
    BadInput(
        "causal_true", r"causal=True is not supported; expected None, 'upper_left'", options={"causal": True}
    ),
    BadInput("causal_typo", r"causal='lower-right' is not supported", options={"causal": "lower-right"}),
    BadInput("window_negative", r"window=\(-1, 2\) must have left >= 0", options={"window": (-1, 2)}),
    BadInput("window_not_pair", r"window=3 must be None or a pair of ints", options={"window": 3}),
    BadInput("scale_nan", r"scale=nan must be finite and > 0", options={"scale": float("nan")}),
    BadInput("scale_inf", r"scale=inf must be finite and > 0", options={"scale": float("inf")}),
    BadInput("scale_zero", r"scale=0.0 must be finite and > 0", options={"scale": 0.0}),
    BadInput("scale_negative", r"scale=-0.5 must be finite and > 0", options={"scale": -0.5}),
    BadInput("scale_str", r"scale must be a real number or None, got str", options={"scale": "0.5"}),
)

_i32 = np.int32
_Q4, _K4, _V4 = (2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 4)  # a batch of 2, for batch-shaped options
_KEEP = np.ones((5, 7), bool)
SDPA_VARIANT_BAD_INPUTS: tuple[BadInput, ...] = (
    BadInput("softcap_zero", r"softcap=0\.0 must be finite and > 0", options={"softcap": 0.0}),
    BadInput("softcap_negative", r"softcap=-2\.0 must be finite and > 0", options={"softcap": -2.0}),
    BadInput("softcap_nan", r"softcap=nan must be finite and > 0", options={"softcap": float("nan")}),
    BadInput("softcap_inf", r"softcap=inf must be finite and > 0", options={"softcap": float("inf")}),
    BadInput("softcap_bool", r"softcap must be a real number or None, got bool", options={"softcap": True}),
    BadInput(
        "alibi_slopes_shape",
        r"alibi_slopes\.shape=\(3,\) must be \(Hq,\)=\(2,\)",
        options={"alibi_slopes": np.ones(3, _f32)},
    ),
    BadInput(
        "alibi_slopes_int",
        r"alibi_slopes\.dtype=int32 must be one of float16",
        options={"alibi_slopes": np.ones(2, _i32)},
    ),
    BadInput(
        "alibi_slopes_batch",
        r"alibi_slopes\.shape=\(3, 2\) must be \(Hq,\)=\(2,\) or \(\.\.\., Hq\)",
        q=_Q4,
        k=_K4,
        v=_V4,
        options={"alibi_slopes": np.ones((3, 2), _f32)},
    ),
    BadInput("alibi_slopes_list", r"alibi_slopes must be a", options={"alibi_slopes": [0.5, 0.25]}),
    BadInput(
        "sinks_shape",
        r"sinks\.shape=\(2, 1\) must be \(Hq,\)=\(2,\)",
        options={"sinks": np.zeros((2, 1), _f32)},
    ),
    BadInput(
        "sinks_dtype", r"sinks\.dtype=float64 must equal q\.dtype=float32", options={"sinks": np.zeros(2)}
    ),
    BadInput(
        "segment_ids_float",
        r"q_segment_ids\.dtype=float32 must be an integer dtype",
        options={"q_segment_ids": np.zeros(5, _f32), "kv_segment_ids": np.zeros(7, _i32)},
    ),
    BadInput(
        "q_segment_ids_alone",
        r"q_segment_ids was given without kv_segment_ids",
        options={"q_segment_ids": np.zeros(5, _i32)},
    ),
    BadInput(
        "kv_segment_ids_alone",
        r"kv_segment_ids was given without q_segment_ids",
        options={"kv_segment_ids": np.zeros(7, _i32)},
    ),
    BadInput(
        "segment_ids_length",
        r"kv_segment_ids\.shape=\(6,\) must be \(\.\.\., m\)=\(\.\.\., 7\)",
        options={"q_segment_ids": np.zeros(5, _i32), "kv_segment_ids": np.zeros(6, _i32)},
    ),
    BadInput(
        "segment_ids_batch",
        r"q_segment_ids\.shape=\(3, 5\) must be \(\.\.\., n\)=\(\.\.\., 5\) with leading dims",
        q=_Q4,
        k=_K4,
        v=_V4,
        options={"q_segment_ids": np.zeros((3, 5), _i32), "kv_segment_ids": np.zeros(7, _i32)},
    ),
    BadInput(
        "dropout_p_negative",
        r"dropout_p=-0\.1 must lie in \[0, 1\)",
        options={"dropout_mask": _KEEP, "dropout_p": -0.1},
    ),
    BadInput(
        "dropout_p_one",
        r"dropout_p=1\.0 must lie in \[0, 1\)",
        options={"dropout_mask": _KEEP, "dropout_p": 1.0},
    ),
    BadInput(
        "dropout_p_nan",
        r"dropout_p=nan must lie in \[0, 1\)",
        options={"dropout_mask": _KEEP, "dropout_p": float("nan")},
    ),
    BadInput(
        "dropout_p_bool",
        r"dropout_p must be a real number or None, got bool",
        options={"dropout_mask": _KEEP, "dropout_p": True},
    ),
    BadInput("dropout_p_without_mask", r"dropout_p=0\.1 needs a dropout_mask", options={"dropout_p": 0.1}),
    BadInput(
        "dropout_mask_without_p", r"dropout_mask was given without dropout_p", options={"dropout_mask": _KEEP}
    ),
    BadInput(
        "dropout_mask_not_bool",
        r"dropout_mask\.dtype=float32 must be bool",
        options={"dropout_mask": np.ones((5, 7), _f32), "dropout_p": 0.1},
    ),
    BadInput(
        "dropout_mask_not_broadcast",
        r"dropout_mask\.shape=\(5, 6\) must broadcast",
        options={"dropout_mask": np.ones((5, 6), bool), "dropout_p": 0.1},
    ),
    BadInput("return_lse_int", r"return_lse must be a bool, got int", options={"return_lse": 1}),
    BadInput(
        "causal_lower_right_length_typo",
        r"causal='lower_right_length' is not supported",
        options={"causal": "lower_right_length"},
    ),
)
ALL_SDPA_BAD_INPUTS: tuple[BadInput, ...] = SDPA_BAD_INPUTS + SDPA_VARIANT_BAD_INPUTS


@dataclass(frozen=True)
class MHABadInput:
    """One mha call the spec refuses; ``match`` leaves out the function name.

    ``params`` names the layer: ``"p8"`` (E=8, kdim=vdim=8), ``"gqa"`` (E=8, 4 heads, 2 kv heads),
    ``"kv"`` (E=8, kdim=3, vdim=5), ``"dict"`` (a plain dict, not parameters); or ``"raw"``: the
    fields of ``p8`` with ``raw`` replacing some, handed to ``Backend.asparams`` (MHAParams would
    refuse them), so the backend's own check of an MHAArrays is what must refuse them.
    """

    id: str
    match: str
    query: tuple[int, ...] = (2, 4, 8)
    key: tuple[int, ...] = (2, 6, 8)
    value: tuple[int, ...] = (2, 6, 8)
    dtypes: tuple[str, str, str] = ("float32", "float32", "float32")
    params: str = "p8"
    raw: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def build(self) -> tuple[tuple[np.ndarray, ...], Any, dict[str, Any]]:
        """((query, key, value), params, options) as NumPy; params as described above."""
        rng = np.random.default_rng(0)
        qkv = tuple(
            rng.standard_normal(s).astype(dt)
            for s, dt in zip((self.query, self.key, self.value), self.dtypes)
        )
        layers = {
            "p8": lambda: MHAParams.init(8, 2, seed=0, dtype=np.float32),
            "gqa": lambda: MHAParams.init(8, 4, num_kv_heads=2, seed=0, dtype=np.float32),
            "kv": lambda: MHAParams.init(8, 2, kdim=3, vdim=5, seed=0, dtype=np.float32),
        }
        if self.params == "dict":
            params: Any = {"w_q": np.eye(8, dtype=np.float32)}
        elif self.params == "raw":
            base = layers["p8"]()
            params = SimpleNamespace(**{f.name: getattr(base, f.name) for f in fields(MHAParams)})
            for name, value in self.raw.items():
                setattr(params, name, value)
        else:
            params = layers[self.params]()
        return qkv, params, {"num_heads": 2, **self.options}


MHA_BAD_INPUTS: tuple[MHABadInput, ...] = (
    MHABadInput(
        "embed_dim_not_multiple",
        r"embed_dim=8 must be a positive multiple of num_heads=3",
        options={"num_heads": 3},
    ),
    MHABadInput("num_heads_zero", r"num_heads=0 must be an int >= 1", options={"num_heads": 0}),
    MHABadInput(
        "heads_not_multiple_of_kv",
        r"num_heads=4 must be a multiple of num_kv_heads=3",
        options={"num_heads": 4, "num_kv_heads": 3},
    ),
    MHABadInput(
        "kv_rows_vs_heads",
        r"params\.w_k\.shape\[0\]=4 must equal num_kv_heads \* head_dim = 4 \* 2",
        params="gqa",
        options={"num_heads": 4},
    ),
    MHABadInput("query_features", r"query\.shape\[-1\]=6 must equal params\.embed_dim=8", query=(2, 4, 6)),
    MHABadInput(
        "key_features", r"key\.shape\[-1\]=8 must equal params\.kdim=3", params="kv", value=(2, 6, 5)
    ),
    MHABadInput(
        "value_features", r"value\.shape\[-1\]=8 must equal params\.vdim=5", params="kv", key=(2, 6, 3)
    ),
    MHABadInput("key_value_lengths", r"value\.shape\[-2\]=5 must equal key\.shape\[-2\]=6", value=(2, 5, 8)),
    MHABadInput("query_rank_1", r"query\.ndim=1 must be >= 2", query=(8,)),
    MHABadInput(
        "mixed_dtypes",
        r"query, key and value must share one dtype, got query\.dtype=float64",
        dtypes=("float64", "float32", "float32"),
    ),
    MHABadInput("int_dtype", r"query\.dtype=int32 must be one of", dtypes=("int32", "int32", "int32")),
    MHABadInput(
        "batch_not_broadcast",
        r"leading batch dims do not broadcast: query \(3,\), key \(2,\)",
        query=(3, 4, 8),
    ),
    MHABadInput(
        "bias_dtype",
        r"bias\.dtype=float64 must equal query\.dtype=float32",
        options={"bias": np.zeros((4, 6))},
    ),
    MHABadInput(
        "mask_not_bool", r"mask\.dtype=float32 must be bool", options={"mask": np.ones((4, 6), _f32)}
    ),
    MHABadInput(
        "mask_shape",
        r"mask\.shape=\(3, 2, 4, 6\) must broadcast to \(\.\.\., Hq, n, m\)=\(2, 2, 4, 6\)",
        options={"mask": np.ones((3, 2, 4, 6), bool)},
    ),
    MHABadInput("causal_true", r"causal=True is not supported", options={"causal": True}),
    MHABadInput(
        "kv_lengths_too_long", r"kv_lengths must lie in \[0, m=6\]", options={"kv_lengths": np.array(7)}
    ),
    MHABadInput("scale_negative", r"scale=-1\.0 must be finite and > 0", options={"scale": -1.0}),
    MHABadInput("params_type", r"params must be an MHAParams.*got dict", params="dict"),
    MHABadInput(
        "w_q_not_square",
        r"params\.w_q\.shape=\(8, 6\) must be \(8, 8\)",
        params="raw",
        raw={"w_q": np.ones((8, 6), _f32)},
    ),
    MHABadInput(
        "w_v_rows",
        r"params\.w_v\.shape=\(4, 8\) must be \(8, 8\)",
        params="raw",
        raw={"w_v": np.ones((4, 8), _f32)},
    ),
    MHABadInput(
        "b_o_length",
        r"params\.b_o\.shape=\(7,\) must be \(8,\)",
        params="raw",
        raw={"b_o": np.zeros(7, _f32)},
    ),
    MHABadInput("weight_rank", r"params\.w_k\.ndim=1 must be 2", params="raw", raw={"w_k": np.ones(8, _f32)}),
    # the variants: checked against the layer's heads (H = 2 here), named as mha's arguments
    MHABadInput("softcap_zero", r"softcap=0\.0 must be finite and > 0", options={"softcap": 0.0}),
    MHABadInput(
        "sinks_per_kv_head",
        r"sinks\.shape=\(3,\) must be \(Hq,\)=\(2,\)",
        options={"sinks": np.ones(3, _f32)},
    ),
    MHABadInput(
        "alibi_slopes_shape",
        r"alibi_slopes\.shape=\(3, 2\) must be \(Hq,\)=\(2,\)",
        options={"alibi_slopes": np.ones((3, 2), _f32)},
    ),
    MHABadInput(
        "segment_ids_float",
        r"q_segment_ids\.dtype=float32 must be an integer dtype",
        options={"q_segment_ids": np.zeros((2, 4), _f32), "kv_segment_ids": np.zeros((2, 6), _f32)},
    ),
    MHABadInput(
        "dropout_mask_without_p",
        r"dropout_mask was given without dropout_p",
        options={"dropout_mask": np.ones((4, 6), bool)},
    ),
)
