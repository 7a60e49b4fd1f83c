"""The bad-input catalogue: every call the spec refuses, as data.

Each entry builds a call from NumPy arrays; the spec's own tests run it against `sdpa`, and the
conformance suite converts the arrays with a backend's ``asarray`` and runs it against that
backend. Every entry must raise `SpecError` whose message matches ``match`` (a regex that leaves
out the function name, so it holds for ``sdpa``, ``torch.sdpa`` and the rest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
    BadInput("batch_not_broadcast", r"batch dims do not broadcast", q=(3, 2, 5, 8), k=(4, 2, 7, 8), v=(4, 2, 7, 4)),
    BadInput("int_dtype", r"q\.dtype=int32 must be one of", dtypes=("int32", "int32", "int32")),
    BadInput("mixed_dtypes", r"must share one dtype", dtypes=("float32", "float64", "float32")),
    BadInput("mask_not_bool", r"mask\.dtype=float32 must be bool", options={"mask": np.ones((5, 7), _f32)}),
    BadInput("mask_not_broadcast", r"mask\.shape=\(5, 6\) must broadcast", options={"mask": np.ones((5, 6), bool)}),
    BadInput("mask_adds_batch", r"mask\.shape=\(3, 2, 5, 7\) must broadcast", options={"mask": np.ones((3, 2, 5, 7), bool)}),
    BadInput("bias_not_broadcast", r"bias\.shape=\(4, 7\) must broadcast", options={"bias": np.zeros((4, 7), _f32)}),
    BadInput("bias_dtype", r"bias\.dtype=float64 must equal q\.dtype=float32", options={"bias": np.zeros((5, 7))}),
    BadInput("kv_lengths_negative", r"kv_lengths must lie in \[0, m=7\]", options={"kv_lengths": np.array(-1)}),
    BadInput("kv_lengths_too_long", r"kv_lengths must lie in \[0, m=7\]", options={"kv_lengths": np.array(8)}),
    BadInput("q_lengths_too_long", r"q_lengths must lie in \[0, n=5\]", options={"q_lengths": np.array(6)}),
    BadInput("lengths_float", r"kv_lengths\.dtype=float64 must be an integer dtype", options={"kv_lengths": np.array(3.0)}),
    BadInput("lengths_not_broadcast", r"kv_lengths\.shape=\(3,\) must broadcast to the batch shape \(2,\)",
             q=(2, 2, 5, 8), k=(2, 2, 7, 8), v=(2, 2, 7, 4), options={"kv_lengths": np.array([1, 2, 3])}),
    BadInput("causal_true", r"causal=True is not supported; expected None, 'upper_left'", options={"causal": True}),
    BadInput("causal_typo", r"causal='lower-right' is not supported", options={"causal": "lower-right"}),
    BadInput("window_negative", r"window=\(-1, 2\) must have left >= 0", options={"window": (-1, 2)}),
    BadInput("window_not_pair", r"window=3 must be None or a pair of ints", options={"window": 3}),
    BadInput("scale_nan", r"scale=nan must be finite and > 0", options={"scale": float("nan")}),
    BadInput("scale_inf", r"scale=inf must be finite and > 0", options={"scale": float("inf")}),
    BadInput("scale_zero", r"scale=0.0 must be finite and > 0", options={"scale": 0.0}),
    BadInput("scale_negative", r"scale=-0.5 must be finite and > 0", options={"scale": -0.5}),
    BadInput("scale_str", r"scale must be a real number or None, got str", options={"scale": "0.5"}),
)
