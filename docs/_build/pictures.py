"""The picture of every clause whose worked example draws no visibility mask, computed when the
site is built by calling the spec: weights from ``return_weights`` or from one-hot values (the
output row of ``v = I`` is the weight row), the query-head to kv-head map of `spec.sdpa`, the
tolerance budget of `attnspec.spec.tolerance`... Each function returns an `svg.Picture`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from attnspec import spec

from .examples import lsh_inputs, params, qkv, visible
from .svg import Picture, heat

PICTURES: dict[str, Callable[[], Picture]] = {}


def picture(cid: str) -> Callable:
    def register(fn: Callable[[], Picture]) -> Callable[[], Picture]:
        PICTURES[cid] = fn
        return fn

    return register


def _side_by_side(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, int, list[str]]:
    ticks = [str(j) for j in range(a.shape[1])] + [str(j) for j in range(b.shape[1])]
    return np.concatenate([a, b], axis=1), a.shape[1], ticks


def _pair(a: np.ndarray, b: np.ndarray, caption: str, **options) -> Picture:
    """Two weight grids side by side, each keeping its own column numbers, on 0 to 1."""
    cells, split, ticks = _side_by_side(a, b)
    return heat(cells, caption, "0", "1", split=split, col_ticks=ticks, **options)


def _weights(q, k, **options) -> tuple[np.ndarray, np.ndarray]:
    """The first head's weights of ``spec.sdpa`` and which keys it sees."""
    v = np.zeros(k.shape[:-1] + (1,), k.dtype)
    _, w = spec.sdpa(q, k, v, return_weights=True, **options)
    return np.asarray(w, np.float64).reshape(-1, *w.shape[-2:])[0], visible(q, k, v, **options)


def _out_beside_visibility(q, k, v, caption: str, **options) -> Picture:
    """The visibility grid and, after a gap, the output row: exactly-0 entries marked."""
    out = np.asarray(spec.sdpa(q, k, v, **options), np.float64).reshape(-1, q.shape[-2], v.shape[-1])[0]
    vis = visible(q, k, v, **options) if k.shape[-2] else np.zeros((q.shape[-2], 0), bool)
    m = vis.shape[1]
    cells = np.concatenate([np.where(vis, "seen", "hidden"), np.where(out == 0, "zero", "heat")], axis=1)
    shade = np.concatenate([np.zeros(vis.shape), np.abs(out) / max(float(np.abs(out).max()), 1e-300)], axis=1)
    text = np.concatenate([np.full(vis.shape, ""), np.vectorize(lambda x: f"{x:.2f}")(out)], axis=1)
    return Picture(
        cells.astype(str),
        caption,
        [
            ("seen", "visible key"),
            ("hidden", "not visible"),
            ("heat", "output o_i"),
            ("zero", "output exactly 0"),
        ],
        cols=f"key j (left), output feature (right, {v.dtype.name})",
        col_ticks=[str(j) for j in range(m)] + [f"o{c}" for c in range(out.shape[1])],
        shade=shade,
        text=text,
        split=m,
    )


# -- the definition -------------------------------------------------------------------------------


@picture("sdpa.definition")
def _definition():
    w, vis = _weights(*qkv(n=2, m=3)[:2])
    return heat(w, "The weights w_ij of the example, each row summing to 1.", "0", "1", hidden=~vis)


@picture("sdpa.scale")
def _scale():
    q, k, _ = qkv(n=2, m=3, d=4)
    return _pair(
        _weights(q, k)[0],
        _weights(q, k, scale=2.0)[0],
        "Left: the weights at the default scale 1/√dk = 0.5; right: at scale=2.0, sharper.",
    )


@picture("sdpa.tiled")
def _tiled():
    q, k, _ = qkv(n=7, m=9, d=3)
    vis = spec.causal_mask(7, 9, "lower_right")
    pic = heat(
        _weights(q, k, causal="lower_right")[0],
        "The weights of the example (causal lower_right, 7 queries, 9 keys); sdpa_blocked with "
        "block_q=2, block_k=3 visits them tile by tile (row and column labels: row / tile) "
        "and gives the same output to rounding.",
        "0",
        "1",
        hidden=~vis,
        digits=1,
        row_ticks=[f"{i}/{i // 2}" for i in range(7)],
        col_ticks=[f"{j}/{j // 3}" for j in range(9)],
    )
    return pic


@picture("sdpa.deterministic")
def _deterministic():
    q, k, _ = (x.astype(np.float16) for x in qkv(n=4, m=6, d=3))
    w1, _ = _weights(q, k)
    w2, _ = _weights(q, k)
    same = np.array_equal(w1, w2)
    return heat(
        w1, f"The float16 weights of one call; a second call gives them bit for bit ({same}).", "0", "1"
    )


# -- GQA ------------------------------------------------------------------------------------------


def _head_map(hq: int, hkv: int, fn=spec.sdpa, cast=lambda x: x, **options) -> np.ndarray:
    """(Hq, Hkv): 1 where query head h reads kv head g, from one call of ``fn`` whose values hold
    the one-hot vector of their kv head (every weight row sums to 1, so out[h] is that vector)."""
    rng = np.random.default_rng(0)
    q = cast(rng.standard_normal((hq, 2, 2)))
    k = cast(rng.standard_normal((hkv, 3, 2)))
    v = cast(np.broadcast_to(np.eye(hkv)[:, None, :], (hkv, 3, hkv)).copy())
    out = np.asarray(fn(q, k, v, **options), np.float64)
    return out[:, 0, :]


def _head_picture(read: np.ndarray, caption: str, text=None) -> Picture:
    cells = np.where(np.isclose(read, 1.0), "seen", "hidden")
    return Picture(
        cells,
        caption,
        [("seen", "query head reads this kv head"), ("hidden", "does not")],
        rows="query head h",
        cols="kv head g",
        text=text,
    )


@picture("sdpa.gqa")
def _gqa():
    read = _head_map(6, 2)
    return _head_picture(
        read,
        "Hq = 6 query heads over Hkv = 2 kv heads (G = 3), from spec.sdpa with each kv head's values "
        "set to its one-hot vector: query head h reads kv head ⌊h / 3⌋, contiguous groups.",
    )


# -- variants -------------------------------------------------------------------------------------


@picture("sdpa.softcap")
def _softcap():
    q, k, _ = qkv(n=3, m=4)
    q = q * 4  # large logits, where the cap shows
    plain, _ = _weights(q, k, scale=1.0)
    capped, _ = _weights(q, k, scale=1.0, softcap=2.0)
    return _pair(
        plain,
        capped,
        "Left: the weights of large logits without a cap; right: with softcap=2.0, logits in "
        "(-2, 2), so the weights are flatter.",
    )


@picture("sdpa.sinks")
def _sinks():
    q, k, v = qkv(n=2, m=3)
    sinks = np.array([1.0])
    _, w, lse = spec.sdpa(q[None], k[None], v[None], sinks=sinks, return_weights=True, return_lse=True)
    share = np.exp(sinks[0] - lse[0])[:, None]
    cells, split, _ = _side_by_side(w[0], share)
    return heat(
        cells,
        "The weights of the 3 keys and, after the gap, the sink's share exp(sink - lse): together 1 per row.",
        "0",
        "1",
        split=split,
        col_ticks=["0", "1", "2", "sink"],
    )


# -- dropout --------------------------------------------------------------------------------------


@picture("sdpa.dropout")
def _dropout():
    q, k, v = qkv(n=4, m=4)
    keep = np.array([[1, 0, 1, 1], [1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 0]], bool)
    p = 0.25
    _, w = spec.sdpa(q, k, v, causal="upper_left", dropout_mask=keep, dropout_p=p, return_weights=True)
    vis = visible(q, k, v, causal="upper_left")
    pic = heat(w, "", "0", "max", hidden=~vis)
    pic.cells = np.where(vis & ~keep, "dropped", pic.cells)
    pic.text = np.where(vis & ~keep, "0", pic.text)
    pic.legend = [("heat", ""), ("dropped", "visible, dropped: 0"), ("hidden", "not visible (causal)")]
    pic.caption = (
        f"spec.sdpa's weights with causal='upper_left', a keep mask and dropout_p={p}: kept weights are "
        f"scaled by 1/(1-p) = {1 / (1 - p):.3g} (a row of kept weights sums to more "
        "than 1), dropped ones are "
        "0 though the key stays visible."
    )
    pic.heat_range = ("kept w/(1-p): 0", "max")
    return pic


# -- outputs and dtypes ---------------------------------------------------------------------------


@picture("sdpa.broadcast")
def _broadcast():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 3, 4))  # batch 2
    k = rng.standard_normal((1, 1, 5, 4))  # batch 1, broadcast
    out = spec.sdpa(q, k, np.eye(5)[None, None])  # one-hot values: each output row is a weight row
    w = out.reshape(6, 5)
    return heat(
        w,
        "q of batch 2 against k and v of batch 1: the rows of both batch elements (b/i) weigh the one "
        "batch of keys (spec.sdpa with one-hot values, whose output rows are the weights).",
        "0",
        "1",
        row_ticks=[f"{b}/{i}" for b in range(2) for i in range(3)],
        rows="batch b / query row i",
    )


@picture("sdpa.output_dtype")
def _output_dtype():
    q, k, v = (x.astype(np.float16) for x in qkv())
    mask = np.array([[True, True, False, False], [False] * 4, [True] * 4])
    return _out_beside_visibility(
        q, k, v, "A float16 call: the output, in float16, beside the keys each row sees.", mask=mask
    )


@picture("sdpa.zero_sizes")
def _zero_sizes():
    q, k, v = qkv(n=2, m=3)
    return _out_beside_visibility(
        q, k[:0], v[:0], "m = 0: no key columns, so no row sees a key and every output is exactly 0."
    )


@picture("sdpa.bad_input")
def _bad_input():
    q, k, v = qkv(n=2, m=3)
    mask = np.array([[True, False, True], [False, False, False]])
    return _out_beside_visibility(
        q,
        k,
        v,
        "Input inside the definition has an output, even a row that sees nothing (exactly 0); input "
        "outside it, as in the example, raises SpecError and has none.",
        mask=mask,
    )


# -- FP8 ------------------------------------------------------------------------------------------


def _fp8_weights(**options) -> np.ndarray:
    import ml_dtypes

    q, k, _ = (x.astype(ml_dtypes.float8_e4m3fn) for x in qkv())
    v = np.zeros((4, 2), ml_dtypes.float8_e4m3fn)
    _, w = spec.sdpa_fp8(q, k, v, return_weights=True, **options)
    return np.asarray(w, np.float64)


@picture("sdpa_fp8.definition")
def _fp8_definition():
    return heat(
        _fp8_weights(q_descale=0.5, k_descale=2.0, v_descale=0.25),
        "The weights of the example's call, in bfloat16: softmax of the dequantised float64 logits, "
        "rounded once.",
        "0",
        "1",
    )


@picture("sdpa_fp8.descale")
def _fp8_descale():
    import ml_dtypes

    descale = np.array([0.5, 4.0], np.float32)
    cast = lambda x: x.astype(ml_dtypes.float8_e4m3fn)  # noqa: E731
    read = _head_map(4, 2, spec.sdpa_fp8, cast, q_descale=descale, out_dtype="float64")
    text = np.where(
        np.isclose(read, 1.0), np.vectorize(lambda g: f"{descale[g]:g}")(np.arange(2))[None, :], ""
    )
    return _head_picture(
        read,
        "Which kv head each of 4 query heads reads in spec.sdpa_fp8 (one-hot values), and the q_descale "
        "entry it takes: q_descale is indexed by kv head, ⌊h / G⌋.",
        text=text,
    )


@picture("sdpa_fp8.out_dtype")
def _fp8_out_dtype():
    import ml_dtypes

    q, k, v = (x.astype(ml_dtypes.float8_e5m2) for x in qkv())
    out = np.asarray(spec.sdpa_fp8(q, k, v), np.float64)
    out32 = np.asarray(spec.sdpa_fp8(q, k, v, out_dtype="float32"), np.float64)
    diff = np.abs(out - out32)
    return heat(
        diff,
        "|bfloat16 output − float32 output| of the example per element: the default out_dtype's "
        "one rounding.",
        "0",
        "max",
        digits=4,
        cols="output feature",
    )


@picture("tolerance.fp8")
def _tolerance_fp8():
    from attnspec.spec.dtypes import eps

    ms, logits = (16, 128, 1024), (1.0, 4.0, 16.0)
    dk = 64
    accumulation = np.array(
        [[eps("float32") * (np.sqrt(m) + 2 * np.sqrt(dk) * L + 1) for L in logits] for m in ms]
    )
    return heat(
        accumulation * 1e6,
        f"The floor's float32 term ×10⁶ (V = 1, dk = {dk}) by keys m and largest logit L, from "
        f"attnspec.spec.dtypes.eps; the output rounding term, ε_bfloat16 · V = {eps('bfloat16'):.2g}, is added "
        "to every cell and dominates it.",
        "small",
        "large",
        digits=1,
        rows="keys m",
        cols="largest logit L",
        row_ticks=[str(m) for m in ms],
        col_ticks=[f"{L:g}" for L in logits],
    )


# -- mha ------------------------------------------------------------------------------------------


def _mha_weights(**options) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    p = params(4, kv=options.pop("kv", None))
    x = rng.standard_normal((3, 4)).round(1)
    _, w = spec.mha(x, x, x, p, num_heads=2, return_weights=True, **options)
    return np.asarray(w[0], np.float64), np.asarray(w[1], np.float64)


@picture("mha.definition")
def _mha_definition():
    return _pair(*_mha_weights(), "The weights of head 0 (left) and head 1 (right): one sdpa per head.")


@picture("mha.kv_heads")
def _mha_kv_heads():
    return _pair(
        *_mha_weights(kv=2, num_kv_heads=1),
        "The weights of query heads 0 and 1, which both read the one kv head: different queries, same keys.",
    )


@picture("mha.variants")
def _mha_variants():
    heads = _mha_weights(
        sinks=np.array([0.5, -0.5]), alibi_slopes=np.array([0.25, 1.0]), softcap=5.0, causal="upper_left"
    )
    vis = np.concatenate([spec.causal_mask(3, 3)] * 2, axis=1)
    return _pair(
        *heads,
        "Heads 0 and 1 with sinks, ALiBi slopes (0.25, 1.0), softcap and causal: each head's sdpa keywords.",
        hidden=~vis,
    )


# -- lsh ------------------------------------------------------------------------------------------


def _lsh_weights(x, **options) -> np.ndarray:
    """(L, L): query i's weight on key j, the output of one-hot values."""
    return np.asarray(spec.lsh_attention(x, np.eye(len(x)), **options), np.float64)


_LSH_LEGEND = (
    "The weight each query (row) gives each key (column), from spec.lsh_attention with one-hot values"
)


def _lsh_heat(w: np.ndarray, caption: str, **options) -> Picture:
    """LSH weights on 0 to 1, a cell outside every window of its query left empty."""
    return heat(
        w, f"{_LSH_LEGEND}{caption}", "0", "1", hidden=w == 0, hidden_label="outside its windows", **options
    )


@picture("lsh.definition")
def _lsh_definition():
    x, _ = lsh_inputs()
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=1, n_buckets=4)
    _, buckets = spec.lsh_attention(x, np.eye(8), rotations=rotations, chunk_length=2, return_buckets=True)
    w = _lsh_weights(x, rotations=rotations, chunk_length=2)
    return _lsh_heat(
        w,
        "; the labels are position/bucket. A query attends the keys of its sorted chunk and "
        "the chunk before it, never itself while another key is there; empty cells: keys outside its window.",
        rows="query i / bucket",
        cols="key j / bucket",
        row_ticks=[f"{i}/{b}" for i, b in enumerate(buckets[0])],
        col_ticks=[f"{j}/{b}" for j, b in enumerate(buckets[0])],
    )


@picture("lsh.rounds")
def _lsh_rounds():
    x, _ = lsh_inputs(length=4)
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=1, n_buckets=2)
    w = _lsh_weights(x, rotations=rotations, chunk_length=2)
    return _lsh_heat(
        w, ": one round whose 2C = 4 keys cover the sequence is full attention without the self-key."
    )


@picture("lsh.dedup")
def _lsh_dedup():
    x, _ = lsh_inputs()
    rotations = spec.lsh_rotations(seed=1, d=4, n_hashes=3, n_buckets=4)
    plain = _lsh_weights(x, rotations=rotations, chunk_length=2)
    dedup = _lsh_weights(x, rotations=rotations, chunk_length=2, dedup=True)
    cells, split, ticks = _side_by_side(plain, dedup)
    return _lsh_heat(
        cells,
        ", 3 rounds: left plain, a key met in several windows weighs more; right dedup=True, "
        "the softmax over the union of the windows.",
        digits=1,
        split=split,
        col_ticks=ticks,
    )


@picture("lsh.causal")
def _lsh_causal():
    x, _ = lsh_inputs()
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=2, n_buckets=4)
    w = _lsh_weights(x, rotations=rotations, chunk_length=2, causal=True)
    return _lsh_heat(w, ", causal=True: nothing right of the diagonal.", digits=1)


@picture("lsh.padding")
def _lsh_padding():
    x, _ = lsh_inputs()
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=2, n_buckets=4)
    w = _lsh_weights(x, rotations=rotations, chunk_length=2, kv_lengths=6)
    return _lsh_heat(
        w, ", kv_lengths=6: positions 6 and 7 are neither attended nor attend (rows of 0).", digits=1
    )


# -- gradients ------------------------------------------------------------------------------------


def _dbias(**options) -> tuple[np.ndarray, np.ndarray]:
    q, k, v = qkv(n=3, m=4)
    grads = spec.sdpa_vjp(q, k, v, np.ones((3, 2)), bias=np.zeros((3, 4)), **options)
    return np.asarray(grads[3], np.float64), visible(q, k, v, bias=np.zeros((3, 4)), **options)


@picture("sdpa_vjp.definition")
def _vjp_definition():
    ds, vis = _dbias()
    return heat(
        np.abs(ds),
        "|dS_ij|, the logit gradient sdpa_vjp returns as dbias (d_out all ones): dq, dk and dv are "
        "built from it.",
        "0",
        "max",
        hidden=~vis,
    )


@picture("sdpa_vjp.variants")
def _vjp_variants():
    ds, vis = _dbias(softcap=2.0, causal="upper_left")
    return heat(
        np.abs(ds),
        "|dbias_ij| with softcap=2.0 and causal: the cap's derivative 1 - tanh² scales dS; hidden "
        "pairs get none.",
        "0",
        "max",
        hidden=~vis,
    )


@picture("mha_vjp.definition")
def _mha_vjp():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).round(1)
    *_, d_params = spec.mha_vjp(x, x, x, params(4), np.ones((3, 4)), num_heads=2)
    cells, split, ticks = _side_by_side(np.abs(d_params.w_k), np.abs(d_params.b_k)[:, None])
    return heat(
        cells,
        "|d W_k| and, after the gap, |d b_k|: exactly 0, since b_k shifts a whole row of logits.",
        "0",
        "max",
        digits=1,
        rows="output feature",
        cols="input feature",
        split=split,
        col_ticks=ticks[:-1] + ["b_k"],
    )


@picture("lsh_vjp.definition")
def _lsh_vjp():
    x, v = lsh_inputs(length=6)
    rotations = spec.lsh_rotations(seed=0, d=4, n_hashes=2, n_buckets=4)
    dx, _ = spec.lsh_attention_vjp(x, v, np.ones((6, 2)), rotations=rotations, chunk_length=2, kv_lengths=5)
    return heat(
        np.abs(dx),
        "|dx| per position and feature with kv_lengths=5: the padded position 5 gets exactly 0.",
        "0",
        "max",
        digits=1,
        rows="position i",
        cols="feature",
    )


# -- tolerance ------------------------------------------------------------------------------------


@picture("tolerance.rule")
def _tolerance_rule():
    from attnspec.backends.compare import sdpa_golden
    from attnspec.spec.tolerance import compare

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((8, 4)).astype(np.float16) for _ in range(3))
    golden = sdpa_golden(q, k, v)
    result = spec.sdpa(q, k, v)
    used = np.array(
        [
            [
                compare(result[i, j : j + 1], golden.out[i, j : j + 1], golden.allowed_out).budget_used
                for j in range(4)
            ]
            for i in range(8)
        ]
    )
    return heat(
        100 * used,
        f"The percent of the allowed error ({golden.allowed_out:.2g}, the rule's budget for this call) "
        "that each element of a float16 result uses, by attnspec.spec.tolerance.compare: 100 would be "
        "the limit.",
        "0 %",
        f"{100 * used.max():.2f} %",
        digits=2,
        cols="output feature",
    )


@picture("tolerance.nonfinite")
def _tolerance_nonfinite():
    from attnspec.spec.tolerance import compare

    golden = np.array([1.0, np.nan, np.inf])
    results = np.array([[1.0 + 1e-9, np.nan, np.inf], [1.0, 2.0, -np.inf]])
    ok = np.array([[compare(r[j : j + 1], golden[j : j + 1], 1e-6).ok for j in range(3)] for r in results])
    return Picture(
        np.where(ok, "pass", "fail"),
        "Each element of two results judged against the golden (columns) by attnspec.spec.tolerance.compare.",
        [("pass", "within tolerance"), ("fail", "fails")],
        rows="result",
        cols="golden",
        row_ticks=["ok", "bad"],
        col_ticks=["1", "nan", "inf"],
        text=np.vectorize(lambda x: f"{x:g}")(results),
    )
