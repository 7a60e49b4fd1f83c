"""The worked example of every clause, run at build time against the spec's own functions.

Each example is a function registered under its clause id. Its body is what the page shows (after
``import numpy as np`` and ``from attnspec import spec``); the dict it returns is what the page
prints below it, and its ``picture`` entry, when present, a boolean (n, m) visibility array made by
the spec's mask code, drawn as a grid. A changed definition changes the page on the next build.
"""

from __future__ import annotations

import inspect
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec import spec
from attnspec.backends.authoring import attend_mask, plan_sdpa
from attnspec.backends.compare import sdpa_golden

EXAMPLES: dict[str, Callable[[], dict[str, Any]]] = {}


def example(cid: str) -> Callable:
    def register(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        EXAMPLES[cid] = fn
        return fn

    return register


@dataclass
class Worked:
    source: str  # the body of the example, as the page shows it
    values: dict[str, Any]  # name -> value, printed under the source
    picture: np.ndarray | None  # (n, m) bool
    caption: str


def run(cid: str) -> Worked | None:
    """The example of clause ``cid``, run now; None when it has none."""
    fn = EXAMPLES.get(cid)
    if fn is None:
        return None
    lines = inspect.getsource(fn).splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def ")) + 1
    body = textwrap.dedent("\n".join(lines[start:]))
    if body.lstrip().startswith(('"""', "'''")):  # drop the docstring
        quote = body.lstrip()[:3]
        body = body.split(quote, 2)[2].lstrip("\n")
    with warnings.catch_warnings():  # NaN compared on purpose (tolerance.nonfinite) warns
        warnings.simplefilter("ignore", RuntimeWarning)
        values = fn()
    picture = values.pop("picture", None)
    caption = values.pop("caption", "")
    if picture is not None:
        picture = np.asarray(picture, bool)
        while picture.ndim > 2:  # (..., 1, n, m) from the per-sequence builders: one sequence
            picture = picture[0]
    return Worked(body.rstrip(), values, picture, caption)


def show(name: str, value: Any) -> str:
    """How the page prints ``name = value``: arrays to 4 decimals, their rows aligned."""
    prefix = f"{name} = "
    if isinstance(value, np.ndarray):
        shown = value
        if (
            value.dtype.kind == "V"
            or value.dtype.name in ("bfloat16", "float16")
            or "float8" in value.dtype.name
        ):
            shown = value.astype(np.float32)  # ml_dtypes' types print their reprs
        text = np.array2string(shown, precision=4, suppress_small=True, prefix=prefix)
        return f"{prefix}{text}  # {value.dtype.name} {value.shape}"
    if isinstance(value, float):
        return f"{prefix}{value:.6g}"
    return f"{prefix}{value!r}"


def visible(q: np.ndarray, k: np.ndarray, v: np.ndarray, **options: Any) -> np.ndarray:
    """Which keys each query row of ``spec.sdpa(q, k, v, **options)`` sees, (n, m): the spec's
    visibility rules (`attnspec.spec.masks.visibility`) with the mask and bias folded in, by the
    authoring API's `attend_mask`; the first head of the first batch element."""
    plan = plan_sdpa("sdpa", q, k, v, **options)
    segments = {name: options.get(name) for name in ("q_segment_ids", "kv_segment_ids")}
    vis = attend_mask(plan, options.get("mask"), options.get("bias"), full=True, **segments)
    return vis.reshape(-1, plan.n, plan.m)[0]


def qkv(n: int = 3, m: int = 4, d: int = 2, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(s).round(1) for s in ((n, d), (m, d), (m, d)))


# -- masking and visibility ---------------------------------------------------------------------


@example("sdpa.visibility")
def _visibility():
    q, k, v = qkv()
    mask = np.array([[True, True, False, False]] * 3)
    k_fill = k.copy()
    k_fill[2:] = 1e4  # what a hidden key holds does not matter
    out = spec.sdpa(q, k, v, mask=mask)
    out_fill, w = spec.sdpa(q, k_fill, v, mask=mask, return_weights=True)
    return {"w": w, "same": np.array_equal(out, out_fill), "picture": visible(q, k, v, mask=mask)}


@example("sdpa.mask")
def _mask():
    q, k, v = qkv()
    mask = np.array([[True, False, True, False]])  # (1, m): broadcast over the 3 query rows
    _, w = spec.sdpa(q, k, v, mask=mask, return_weights=True)
    return {"w": w, "picture": visible(q, k, v, mask=mask)}


@example("sdpa.bias")
def _bias():
    q, k, v = qkv()
    bias = np.array([[0.0, 0.5, -np.inf, 0.0]] * 3)
    out_bias = spec.sdpa(q, k, v, bias=np.where(np.isinf(bias), 0.0, bias), mask=~np.isinf(bias))
    out = spec.sdpa(q, k, v, bias=bias)  # -inf hides the key, as a mask would
    return {"out": out, "same": np.array_equal(out, out_bias), "picture": visible(q, k, v, bias=bias)}


@example("sdpa.empty_row")
def _empty_row():
    q, k, v = qkv()
    mask = np.array([[True, True, False, False], [False] * 4, [True] * 4])
    out, w = spec.sdpa(q, k, v, mask=mask, return_weights=True)
    return {"out": out, "w": w, "picture": visible(q, k, v, mask=mask)}


@example("sdpa.hidden_nonfinite")
def _hidden_nonfinite():
    q, k, v = qkv()
    k[3], v[3] = np.nan, np.inf  # key 3 is padding: uninitialised memory
    out = spec.sdpa(q, k, v, kv_lengths=3)
    return {"out": out, "picture": visible(q, k, v, kv_lengths=3)}


@example("sdpa.visible_nonfinite")
def _visible_nonfinite():
    q, k, v = qkv()
    v[0] = np.nan  # key 0 is visible from rows 0 and 1 only
    out = spec.sdpa(q, k, v, window=(0, 1))
    return {"out": out, "picture": spec.window_mask(3, 4, 0, 1)}


# -- causal alignments and windows ----------------------------------------------------------------


@example("sdpa.causal.upper_left")
def _upper_left():
    q, k, v = qkv(n=3, m=5)
    out = spec.sdpa(q, k, v, causal="upper_left")
    return {"out": out, "picture": spec.causal_mask(3, 5, "upper_left")}


@example("sdpa.causal.lower_right")
def _lower_right():
    q, k, v = qkv(n=3, m=5)
    out = spec.sdpa(q, k, v, causal="lower_right")  # 3 new queries after a cache of 2 keys
    return {"out": out, "picture": spec.causal_mask(3, 5, "lower_right")}


@example("sdpa.causal.lower_right_lengths")
def _lower_right_lengths():
    q, k, v = qkv(n=2, m=6)
    kv_lengths = np.array([4])  # decision 17's measured case: 4 of the 6 keys are real
    q, k, v = q[None, None], k[None, None], v[None, None]  # (batch 1, head 1, n, d)
    out = spec.sdpa(q, k, v, causal="lower_right_lengths", kv_lengths=kv_lengths)
    vis = spec.causal_mask(2, 6, "lower_right_lengths", kv_lengths=kv_lengths)
    vis = vis & spec.padding_mask(kv_lengths, 6)
    return {"out": out, "picture": vis}


@example("sdpa.window")
def _window():
    q, k, v = qkv(n=5, m=5)
    out = spec.sdpa(q, k, v, window=(2, 0), causal="upper_left")  # HF sliding_window=3
    return {"out": out, "picture": spec.window_mask(5, 5, 2, 0) & spec.causal_mask(5, 5)}


# -- GQA ------------------------------------------------------------------------------------------


@example("sdpa.gqa")
def _gqa():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 2, 2)).round(1)  # Hq = 4 query heads
    k = rng.standard_normal((2, 3, 2)).round(1)  # Hkv = 2 kv heads: G = 2
    v = rng.standard_normal((2, 3, 2)).round(1)
    out = spec.sdpa(q, k, v)
    repeated = spec.sdpa(q, np.repeat(k, 2, axis=0), np.repeat(v, 2, axis=0))  # head h -> h // 2
    tiled = spec.sdpa(q, np.tile(k, (2, 1, 1)), np.tile(v, (2, 1, 1)))  # head h -> h % 2
    return {"same_as_repeat": np.array_equal(out, repeated), "same_as_tile": np.array_equal(out, tiled)}


# -- lengths and segments -------------------------------------------------------------------------


@example("sdpa.lengths")
def _lengths():
    q, k, v = qkv(n=3, m=4)
    out = spec.sdpa(q, k, v, q_lengths=2, kv_lengths=3)
    vis = spec.query_padding_mask(2, 3) & spec.padding_mask(3, 4)
    return {"out": out, "picture": vis}


@example("sdpa.segments")
def _segments():
    q, k, v = qkv(n=5, m=6)
    q_ids = np.array([0, 0, 1, 1, -1])  # the last query is padding
    kv_ids = np.array([0, 0, 0, 1, 1, -1])
    out = spec.sdpa(q, k, v, q_segment_ids=q_ids, kv_segment_ids=kv_ids)
    return {"out": out, "picture": spec.segment_mask(q_ids, kv_ids)}


# -- variants -------------------------------------------------------------------------------------


@example("sdpa.softcap")
def _softcap():
    q = np.array([[2.0, 1.0]])
    k = np.array([[2.0, 1.0], [-1.0, 1.0]])
    v = np.array([[1.0, 0.0], [0.0, 1.0]])
    bias = np.array([[0.0, -1.0]])
    _, w = spec.sdpa(q, k, v, scale=1.0, softcap=2.0, bias=bias, return_weights=True)
    t = 2.0 * np.tanh(q @ k.T / 2.0) + bias  # the cap first, then the bias
    return {"w": w, "by_hand": np.exp(t) / np.exp(t).sum(-1, keepdims=True)}


@example("sdpa.alibi")
def _alibi():
    q, k, v = np.zeros((3, 2)), np.zeros((5, 2)), np.eye(5, 2)
    slopes = np.array([0.5])  # one head; equal logits, so the weights are ALiBi's alone
    _, w = spec.sdpa(
        q[None], k[None], v[None], alibi_slopes=slopes, causal="lower_right", return_weights=True
    )
    anchor = spec.query_anchor(3, 5, "lower_right")  # i' = i + m - n
    return {"anchor": anchor, "w": w[0], "picture": spec.causal_mask(3, 5, "lower_right")}


@example("sdpa.sinks")
def _sinks():
    q, k, v = qkv(n=2, m=3)
    sinks = np.array([1.0])
    _, w, lse = spec.sdpa(q[None], k[None], v[None], sinks=sinks, return_weights=True, return_lse=True)
    return {"w": w[0], "row_sums": w[0].sum(-1), "sink_share": np.exp(sinks[0] - lse[0])}


# -- dropout --------------------------------------------------------------------------------------


@example("sdpa.dropout")
def _dropout():
    q, k, v = qkv(n=2, m=3)
    keep = np.array([[True, False, True], [True, True, True]])
    _, w0, lse0 = spec.sdpa(q, k, v, return_weights=True, return_lse=True)
    out, w, lse = spec.sdpa(q, k, v, dropout_mask=keep, dropout_p=0.5, return_weights=True, return_lse=True)
    return {
        "w_no_dropout": w0,
        "w": w,
        "lse_unchanged": np.array_equal(lse, lse0),
        "out_is_w_at_v": np.allclose(out, w @ v, rtol=0, atol=1e-15),
    }


# -- lse ------------------------------------------------------------------------------------------


@example("sdpa.lse")
def _lse():
    q, k, v = qkv(n=3, m=4)
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    mask = np.array([[True] * 4, [True, True, False, False], [False] * 4])
    _, lse = spec.sdpa(q32, k32, v32, mask=mask, return_lse=True)
    return {"lse": lse, "picture": visible(q32, k32, v32, mask=mask)}


# -- sdpa: the definition ------------------------------------------------------------------------


@example("sdpa.definition")
def _definition():
    q, k, v = qkv(n=2, m=3)
    out = spec.sdpa(q, k, v)
    s = q @ k.T / np.sqrt(2)  # scale 1 / sqrt(dk)
    w = np.exp(s - s.max(-1, keepdims=True))
    by_hand = (w / w.sum(-1, keepdims=True)) @ v
    return {"out": out, "max_abs_diff": float(np.abs(out - by_hand).max())}


@example("sdpa.scale")
def _scale():
    q, k, v = qkv(n=2, m=3, d=4)
    default = spec.sdpa(q, k, v)
    explicit = spec.sdpa(q, k, v, scale=0.5)  # 1 / sqrt(4)
    return {"same": np.array_equal(default, explicit)}


@example("sdpa.weights")
def _weights():
    q, k, v = qkv(n=3, m=4)
    mask = np.array([[True] * 4, [True, False, True, False], [False] * 4])
    _, w = spec.sdpa(q, k, v, mask=mask, return_weights=True)
    return {"row_sums": w.sum(-1), "picture": visible(q, k, v, mask=mask)}


@example("sdpa.tiled")
def _tiled():
    q, k, v = qkv(n=7, m=9, d=3)
    out = spec.sdpa(q, k, v, causal="lower_right")
    tiles = spec.sdpa_blocked(q, k, v, causal="lower_right", block_q=2, block_k=3)
    return {"max_abs_diff": float(np.abs(out - tiles).max())}


@example("sdpa.deterministic")
def _deterministic():
    q, k, v = qkv(n=4, m=6, d=3)
    a = spec.sdpa(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    b = spec.sdpa(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    return {"bit_identical": a.tobytes() == b.tobytes()}


# -- outputs and dtypes ---------------------------------------------------------------------------


@example("sdpa.broadcast")
def _broadcast():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 3, 4))  # batch 2, one head
    k = rng.standard_normal((1, 1, 5, 4))  # batch 1: broadcast over q's batch
    v = rng.standard_normal((1, 1, 5, 4))
    out = spec.sdpa(q, k, v)
    out_rank2 = spec.sdpa(q[0, 0], k[0, 0], v[0, 0])  # rank 2: one head, rank-2 output
    return {
        "out_shape": out.shape,
        "rank2_shape": out_rank2.shape,
        "same": np.array_equal(out[0, 0], out_rank2),
    }


@example("sdpa.output_dtype")
def _output_dtype():
    q, k, v = (x.astype(np.float16) for x in qkv())
    out, w, lse = spec.sdpa(q, k, v, return_weights=True, return_lse=True)
    return {"dtypes": (out.dtype.name, w.dtype.name, lse.dtype.name)}


@example("sdpa.zero_sizes")
def _zero_sizes():
    q, k, v = qkv(n=2, m=3)
    no_queries = spec.sdpa(q[:0], k, v)
    no_keys = spec.sdpa(q, k[:0], v[:0])
    return {"no_queries": no_queries, "no_keys": no_keys}


@example("sdpa.bad_input")
def _bad_input():
    q, k, v = qkv(n=2, m=3)
    try:
        spec.sdpa(q, k[:, :1], v, causal="upper_left")
    except spec.SpecError as e:
        message = str(e)
    try:
        spec.sdpa(q, k, v, causal=True)
    except spec.SpecError as e:
        message_causal = str(e)
    return {"message": message, "message_causal": message_causal}


# -- FP8 ------------------------------------------------------------------------------------------


@example("sdpa_fp8.definition")
def _fp8_definition():
    import ml_dtypes

    q, k, v = (x.astype(ml_dtypes.float8_e4m3fn) for x in qkv())
    out = spec.sdpa_fp8(q, k, v, q_descale=0.5, k_descale=2.0, v_descale=0.25)
    wide = [x.astype(np.float64) * s for x, s in ((q, 0.5), (k, 2.0), (v, 0.25))]
    golden = spec.sdpa(*wide).astype(ml_dtypes.bfloat16)  # one rounding, from float64
    return {"out": out, "same": np.array_equal(out, golden)}


@example("sdpa_fp8.descale")
def _fp8_descale():
    import ml_dtypes

    rng = np.random.default_rng(0)
    q = rng.standard_normal((4, 2, 2)).astype(ml_dtypes.float8_e4m3fn)  # Hq = 4
    k = rng.standard_normal((2, 3, 2)).astype(ml_dtypes.float8_e4m3fn)  # Hkv = 2, G = 2
    v = rng.standard_normal((2, 3, 2)).astype(ml_dtypes.float8_e4m3fn)
    q_descale = np.array([0.5, 4.0], np.float32)  # one per kv head: q head h takes h // 2
    out = spec.sdpa_fp8(q, k, v, q_descale=q_descale, out_dtype="float64")
    q_hat = q.astype(np.float64) * np.repeat(q_descale, 2)[:, None, None]
    same = np.array_equal(out, spec.sdpa(q_hat, k.astype(np.float64), v.astype(np.float64)))
    return {"same": same}


@example("sdpa_fp8.out_dtype")
def _fp8_out_dtype():
    import ml_dtypes

    q, k, v = (x.astype(ml_dtypes.float8_e5m2) for x in qkv())
    out, lse = spec.sdpa_fp8(q, k, v, return_lse=True)
    out32 = spec.sdpa_fp8(q, k, v, out_dtype="float32")
    return {"dtypes": (out.dtype.name, lse.dtype.name, out32.dtype.name)}


# -- gradients ------------------------------------------------------------------------------------


@example("sdpa_vjp.definition")
def _vjp_definition():
    q, k, v = qkv(n=2, m=3)
    d_out = np.ones((2, 2))
    dq, _dk, _dv = spec.sdpa_vjp(q, k, v, d_out)
    h = 1e-6  # a central difference of sum(out * d_out) in q[0, 0]
    qp, qm = q.copy(), q.copy()
    qp[0, 0] += h
    qm[0, 0] -= h
    fd = ((spec.sdpa(qp, k, v) - spec.sdpa(qm, k, v)) * d_out).sum() / (2 * h)
    return {"dq": dq, "dq00_finite_difference": float(fd)}


@example("sdpa_vjp.empty_row")
def _vjp_empty_row():
    q, k, v = qkv(n=3, m=4)
    mask = np.array([[True] * 4, [False] * 4, [True, True, False, False]])
    dq, _dk, _dv = spec.sdpa_vjp(q, k, v, np.ones((3, 2)), mask=mask)
    return {"dq": dq, "picture": visible(q, k, v, mask=mask)}


@example("sdpa_vjp.hidden_keys")
def _vjp_hidden_keys():
    q, k, v = qkv(n=3, m=4)
    k[3], v[3] = np.nan, 1e4  # key 3 is past kv_lengths
    _dq, dk, dv = spec.sdpa_vjp(q, k, v, np.ones((3, 2)), kv_lengths=3)
    return {"dk": dk, "dv": dv, "picture": visible(q, k, v, kv_lengths=3)}


@example("sdpa_vjp.variants")
def _vjp_variants():
    q, k, v = qkv(n=2, m=3)
    sinks = np.array([0.5])
    d_out = np.ones((1, 2, 2))
    *_, dsinks = spec.sdpa_vjp(q[None], k[None], v[None], d_out, softcap=2.0, sinks=sinks)
    _, w = spec.sdpa(q[None], k[None], v[None], softcap=2.0, sinks=sinks, return_weights=True)
    out = w @ v
    sink_w = 1 - w.sum(-1)  # the sink's share of each row
    by_hand = -(sink_w * (out * d_out).sum(-1)).sum()  # d lse-shift of a zero-value logit
    return {"dsinks": dsinks, "by_hand": float(by_hand)}


@example("mha_vjp.definition")
def _mha_vjp():
    rng = np.random.default_rng(0)
    e = 4
    p = params(e)
    x = rng.standard_normal((3, e)).round(1)
    *_d_inputs, d_params = spec.mha_vjp(x, x, x, p, np.ones((3, e)), num_heads=2)
    return {"d_b_k": d_params.b_k, "d_b_o": d_params.b_o}


@example("lsh_vjp.definition")
def _lsh_vjp():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4))
    v = rng.standard_normal((6, 2))
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=2, n_buckets=4)
    dx, dv = spec.lsh_attention_vjp(x, v, np.ones((6, 2)), rotations=rotations, chunk_length=2, kv_lengths=5)
    return {"dx_row_5": dx[5], "dv_row_5": dv[5]}


# -- mha ------------------------------------------------------------------------------------------


def params(e: int = 4, seed: int = 0, kv: int | None = None):
    rng = np.random.default_rng(seed)
    kv = kv or e
    shapes = {
        "w_q": (e, e),
        "b_q": (e,),
        "w_k": (kv, e),
        "b_k": (kv,),
        "w_v": (kv, e),
        "b_v": (kv,),
        "w_o": (e, e),
        "b_o": (e,),
    }
    return spec.MHAParams(**{name: rng.standard_normal(s).round(1) for name, s in shapes.items()})


@example("mha.definition")
def _mha_definition():
    rng = np.random.default_rng(0)
    e, heads = 4, 2
    p = params(e)
    x = rng.standard_normal((3, e)).round(1)
    out = spec.mha(x, x, x, p, num_heads=heads)
    q, k, v = (
        spec.split_heads(x @ w.T + b, heads) for w, b in ((p.w_q, p.b_q), (p.w_k, p.b_k), (p.w_v, p.b_v))
    )  # (H, L, hd)
    by_hand = spec.merge_heads(spec.sdpa(q, k, v)) @ p.w_o.T + p.b_o
    return {"out": out, "max_abs_diff": float(np.abs(out - by_hand).max())}


@example("mha.empty_row")
def _mha_empty_row():
    rng = np.random.default_rng(0)
    p = params(4)
    x = rng.standard_normal((3, 4)).round(1)
    out = spec.mha(x, x, x, p, num_heads=2, q_lengths=2)
    return {"row_2": out[2], "b_o": p.b_o, "picture": visible(x, x, x, q_lengths=2)}


@example("mha.kv_heads")
def _mha_kv_heads():
    rng = np.random.default_rng(0)
    p = params(4, kv=2)  # 2 query heads of size 2, 1 kv head: k and v project to 2 features
    x = rng.standard_normal((3, 4)).round(1)
    out = spec.mha(x, x, x, p, num_heads=2, num_kv_heads=1)
    q = spec.split_heads(x @ p.w_q.T + p.b_q, 2)  # (2, L, 2)
    k = spec.split_heads(x @ p.w_k.T + p.b_k, 1)  # (1, L, 2): read by both query heads
    v = spec.split_heads(x @ p.w_v.T + p.b_v, 1)
    by_hand = spec.merge_heads(spec.sdpa(q, k, v)) @ p.w_o.T + p.b_o
    return {"max_abs_diff": float(np.abs(out - by_hand).max())}


@example("mha.variants")
def _mha_variants():
    rng = np.random.default_rng(0)
    p = params(4)
    x = rng.standard_normal((3, 4)).round(1)
    sinks, slopes = np.array([0.5, -0.5]), np.array([0.25, 1.0])
    out = spec.mha(
        x, x, x, p, num_heads=2, sinks=sinks, alibi_slopes=slopes, softcap=5.0, causal="upper_left"
    )
    q, k, v = (spec.split_heads(x @ w.T + b, 2) for w, b in ((p.w_q, p.b_q), (p.w_k, p.b_k), (p.w_v, p.b_v)))
    heads = spec.sdpa(q, k, v, sinks=sinks, alibi_slopes=slopes, softcap=5.0, causal="upper_left")
    by_hand = spec.merge_heads(heads) @ p.w_o.T + p.b_o
    return {"max_abs_diff": float(np.abs(out - by_hand).max())}


# -- lsh ------------------------------------------------------------------------------------------


def lsh_inputs(length: int = 8, d: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((length, d)), rng.standard_normal((length, 2))


@example("lsh.definition")
def _lsh_definition():
    x, v = lsh_inputs()
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=1, n_buckets=4)
    out, buckets = spec.lsh_attention(x, v, rotations=rotations, chunk_length=2, return_buckets=True)
    return {"buckets": buckets, "out": out}


@example("lsh.rounds")
def _lsh_rounds():
    x, v = lsh_inputs(length=4)
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=1, n_buckets=2)
    out = spec.lsh_attention(x, v, rotations=rotations, chunk_length=2)  # 2C = L keys: all of them
    k_hat = x / np.linalg.norm(x, axis=-1, keepdims=True)
    full = spec.sdpa(x, k_hat, v, scale=1.0, bias=np.where(np.eye(4, dtype=bool), -1e5, 0.0))
    return {"max_abs_diff": float(np.abs(out - full).max())}


@example("lsh.dedup")
def _lsh_dedup():
    x, v = lsh_inputs()
    rotations = spec.lsh_rotations(seed=1, d=4, n_hashes=3, n_buckets=4)
    plain = spec.lsh_attention(x, v, rotations=rotations, chunk_length=2)
    dedup = spec.lsh_attention(x, v, rotations=rotations, chunk_length=2, dedup=True)
    return {"plain": plain, "dedup": dedup}


@example("lsh.causal")
def _lsh_causal():
    x, v = lsh_inputs()
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=2, n_buckets=4)
    out = spec.lsh_attention(x, v, rotations=rotations, chunk_length=2, causal=True)
    v2 = v.copy()
    v2[5:] = 1e6  # later values: rows 0-4 must not move
    out2 = spec.lsh_attention(x, v2, rotations=rotations, chunk_length=2, causal=True)
    return {"rows_0_4_unchanged": np.array_equal(out[:5], out2[:5])}


@example("lsh.padding")
def _lsh_padding():
    x, v = lsh_inputs()
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=2, n_buckets=4)
    out = spec.lsh_attention(x, v, rotations=rotations, chunk_length=2, kv_lengths=6)
    x2 = x.copy()
    x2[6:] = 1e3  # padding: it changes neither buckets nor outputs
    out2 = spec.lsh_attention(x2, v, rotations=rotations, chunk_length=2, kv_lengths=6)
    return {"out": out, "same": np.array_equal(out, out2)}


# -- tolerance ------------------------------------------------------------------------------------


@example("tolerance.rule")
def _tolerance_rule():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((64, 16)).astype(np.float16) for _ in range(3))
    golden = sdpa_golden(q, k, v)  # float64 golden, reference error and the rule's budget
    result = spec.sdpa(q, k, v)  # a result rounded once to float16
    err = float(np.abs(result.astype(np.float64) - golden.out).max())
    return {
        "allowed_out": golden.allowed_out,
        "error_of_one_rounding": err,
        "budget_used": err / golden.allowed_out,
    }


@example("tolerance.nonfinite")
def _tolerance_nonfinite():
    from attnspec.spec.tolerance import compare

    golden = np.array([1.0, np.nan, np.inf])
    ok = compare(np.array([1.0 + 1e-9, np.nan, np.inf]), golden, allowed=1e-6)
    bad = compare(np.array([1.0, 2.0, -np.inf]), golden, allowed=1e-6)
    return {"ok": ok.ok, "bad": bad.ok, "bad_mismatches": bad.nonfinite_mismatch}


@example("tolerance.fp8")
def _tolerance_fp8():
    from attnspec.spec.dtypes import eps

    m, dk, V, L = 128, 64, 1.0, 4.0  # keys, head dim, largest |v|, largest logit
    floor = eps("bfloat16") * V + eps("float32") * V * (np.sqrt(m) + 2 * np.sqrt(dk) * L + 1)
    return {"floor_bfloat16_out": float(floor)}


#: the input helpers the examples call, shown once on the specification's index page
HELPERS = (qkv, params, lsh_inputs, visible)


def helpers_source() -> str:
    return "\n\n".join(textwrap.dedent(inspect.getsource(fn)).rstrip() for fn in HELPERS)
