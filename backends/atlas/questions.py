"""The semantic questions of the atlas, asked of any backend on tiny cases.

Each `Question` builds one sdpa call where implementations are known to disagree, runs it
through a backend, and classifies what came back in a word or two ("0", "NaN", "mean(V)",
"upper-left", "h // G", "raises TypeError"...), next to what the spec answers. With a
`FunctionBackend` the exact arguments the framework received are kept, and `reproducer` turns
them into a standalone snippet that calls the framework directly, with no attnspec in it.

    python -m attnspec.backends.atlas.questions NAME --out FILE    # one backend -> atlas JSON
"""

from __future__ import annotations

import argparse
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.backends.base import Backend, Unsupported
from attnspec.backends.deviation_cases import with_empty_row
from attnspec.backends.function import FunctionBackend
from attnspec.spec import sdpa

__all__ = ["QUESTIONS", "Question", "ask", "reproducer"]

Case = tuple  # (q, k, v, options) as float32 NumPy


def _qkv(hq=2, hkv=2, n=3, m=4, dk=4, dv=4, seed=0):
    r = np.random.default_rng(seed)
    return (
        r.standard_normal((1, hq, n, dk)),
        r.standard_normal((1, hkv, m, dk)),
        r.standard_normal((1, hkv, m, dv)),
    )


def _empty_row(by: str) -> Callable[[], Case]:
    return lambda: with_empty_row(*_qkv(), by=by)


def _nan_hidden(which: str) -> Callable[[], Case]:
    def case() -> Case:
        q, k, v = _qkv()
        (k if which == "k" else v)[..., 3, :] = np.nan  # key 3 is hidden from every row
        return q, k, v, {"mask": np.arange(4) < 3}

    return case


def _causal(n: int, m: int, align: str) -> Callable[[], Case]:
    def case() -> Case:
        q, k, v = _qkv(n=n, m=m)
        return q, k, v, {"causal": align}

    return case


def _window() -> Case:
    q, k, v = _qkv(n=3, m=6)
    return q, k, v, {"window": (1, 0)}


def _gqa() -> Case:
    q, k, v = _qkv(hq=4, hkv=2)
    return q, k, v, {}


def _dk_ne_dv() -> Case:
    q, k, v = _qkv(dv=6)
    return q, k, v, {}


def _bias_and_mask() -> Case:
    q, k, v = _qkv()
    return q, k, v, {"bias": np.linspace(-1, 1, 12).reshape(3, 4), "mask": np.array([[1, 1, 0, 1]] * 3, bool)}


def _kv_lengths() -> Case:
    q, k, v = _qkv()
    return q, k, v, {"kv_lengths": np.array([2])}


def _finite_floor() -> Case:
    q, k, v = _qkv()
    q[..., 1, :] = 0.0  # query 1's logits are its bias alone
    bias = np.zeros((3, 4))
    bias[1] = float(np.finfo(np.float32).min)  # below every finite fill an implementation may use
    return q, k, v, {"bias": bias, "mask": np.arange(4) < 3}  # key 3 is hidden from every row


def _floor_answer(out, case: Case) -> str:
    """Row 1 sees keys 0-2 at logit finfo.min: the spec gives it their mean value; a finite fill
    F > finfo.min hands the hidden key 3 the weight instead."""
    got, golden, v = out[..., 1, :], _golden(case)[..., 1, :], case[2]
    if _close(got, golden):
        return "as the spec"
    if _close(got, v[..., 3, :]):
        return "hidden key takes the weight"
    return "NaN" if np.isnan(got).any() else "differs"


def _causal_floor() -> Case:
    q, k, v = _qkv(n=3, m=3)
    k[..., :, 0] = 0.0
    k[..., 0, :] = np.eye(4)[0]  # key 0 is e0; keys 1 and 2 are orthogonal to it
    q[..., 0, :] = (
        -6e4 * np.eye(4)[0]
    )  # query 0's one visible logit: -6e4 / sqrt(4) = -3e4; the hidden two: 0
    return q, k, v, {"causal": "flag"}


def _causal_floor_answer(out, case: Case) -> str:
    """Query 0 sees key 0 alone, at logit -3e4: the spec gives it v[0]. A causal flag that adds
    or fills a finite F > -3e4 (paddle's -1e4) hands hidden keys 1 and 2 the weight instead."""
    got, golden, v = out[..., 0, :], _golden(case)[..., 0, :], case[2]
    if _close(got, golden):
        return "as the spec"
    if _close(got, v[..., 1:, :].mean(axis=-2)):
        return "hidden keys take the weight"
    return "NaN" if np.isnan(got).any() else "differs"


def _weights() -> Case:
    q, k, v = _qkv()
    return q, k, v, {"return_weights": True}


@dataclass(frozen=True)
class Question:
    id: str
    title: str  # the atlas column
    case: Callable[[], Case]
    classify: Callable[[np.ndarray, Case], str]  # the float64 output (or (out, w)) -> answer
    spec: str  # the spec's own answer
    #: the spec options the call is about, and so whether the framework's own argument carried it
    #: (recorded in the JSON: a convention with no such argument expresses it as a mask)
    note: str = ""


def _golden(case: Case, **override):
    q, k, v, opts = case
    return sdpa(q, k, v, **{**opts, **override, "return_weights": False})


def _close(a, b) -> bool:
    # float32 inputs through a float32 kernel against the float64 golden: within 1e-4 relative is
    # "the same answer"; a categorical label, not a conformance verdict (the suite judges those)
    return a.shape == b.shape and bool(
        np.all(np.isclose(a, b, rtol=1e-4, atol=1e-4) | (np.isnan(a) & np.isnan(b)))
    )


def _row_answer(out, case: Case, row: int = 1) -> str:
    got = out[..., row, :]
    if np.isnan(got).any():
        return "NaN"
    if np.all(got == 0):
        return "0"
    v = case[2]
    if np.allclose(got, v.mean(axis=-2), rtol=1e-3, atol=1e-3):
        return "mean(V)"
    return f"other (max |x| {np.abs(got).max():.3g})"


def _leak(out, case: Case) -> str:
    golden = _golden(case)
    if _close(out, golden):
        return "ignored"
    return "leaks NaN" if np.isnan(out).any() else "changes the output"


def _alignment(out, case: Case) -> str:
    """Which alignment the rows that have keys follow; and what rows with no key get."""
    q, k, _, _ = case
    n, m = q.shape[-2], k.shape[-2]
    for align in ("upper_left", "lower_right"):
        shift = m - n if align == "lower_right" else 0
        has_key = np.arange(n) + shift >= 0  # rows with at least key 0 visible
        golden = _golden(case, causal=align)
        if _close(out[..., has_key, :], golden[..., has_key, :]):
            label = align.replace("_", "-")
            if not has_key.all():
                empty = _row_answer(out[..., ~has_key, :], case, row=0)
                label += f" (rows with no key: {empty})"
            return label
    return "NaN rows" if np.isnan(out).any() else "neither"


def _window_anchor(out, case: Case) -> str:
    if _close(out, _golden(case)):
        return "at i (spec)"
    q, k, v, opts = case
    n, m = q.shape[-2], k.shape[-2]
    left, right = opts["window"]
    shifted = np.arange(m)[None, :] - (np.arange(n)[:, None] + m - n)
    mask = (shifted >= -left) & (shifted <= right)
    if _close(out, sdpa(q, k, v, mask=mask)):
        return "at i + m - n"
    return "neither"


def _gqa_order(out, case: Case) -> str:
    q, k, v, _ = case
    if _close(out, _golden(case)):
        return "h // G"
    tiled = np.arange(q.shape[-3]) % k.shape[-3]
    if _close(out, sdpa(q, k[..., tiled, :, :], v[..., tiled, :, :])):
        return "h % Hkv (tiled)"
    return "neither"


def _matches(out, case: Case) -> str:
    return "as the spec" if _close(out, _golden(case)) else "differs"


def _weights_answer(result, case: Case) -> str:
    if not isinstance(result, tuple):
        return "not returned"
    q, k, v, opts = case
    w = sdpa(q, k, v, **{**opts, "return_weights": True})[1]
    return "returned, as the spec" if _close(result[1], w) else "returned, differ"


def _zero_batch() -> Case:
    """No batch element at all (the spec: an empty output), with a mask, as padded batches have."""
    q, k, v = (x[:0] for x in _qkv())
    mask = np.ones((3, 4), bool)
    mask[:, 0] = False
    return q, k, v, {"mask": mask}


def _plain() -> Case:
    q, k, v = _qkv()
    return q, k, v, {}


def _scaled() -> Case:
    q, k, v = _qkv()
    return q, k, v, {"scale": 0.3}


QUESTIONS = [
    Question("empty_row_mask", "row with no visible key (bool mask)", _empty_row("mask"), _row_answer, "0"),
    Question("empty_row_bias", "row with no visible key (-inf bias)", _empty_row("bias"), _row_answer, "0"),
    Question("nan_hidden_key", "NaN in a masked key", _nan_hidden("k"), _leak, "ignored"),
    Question("nan_hidden_value", "NaN in a masked value", _nan_hidden("v"), _leak, "ignored"),
    # the framework's own causal flag, called alone: what alignment does it mean? (the spec names
    # both, so there is no wrong answer, only a documented one; NaN rows or "neither" are wrong)
    Question(
        "causal_flag_n_lt_m",
        "its causal flag, n < m",
        _causal(2, 5, "flag"),
        _alignment,
        "",
        "the framework's causal argument alone",
    ),
    Question("causal_flag_n_gt_m", "its causal flag, n > m", _causal(5, 3, "flag"), _alignment, ""),
    Question("window", "window (1, 0), n < m", _window, _window_anchor, "at i (spec)"),
    Question("gqa_order", "GQA head order", _gqa, _gqa_order, "h // G"),
    Question("dk_ne_dv", "dk != dv", _dk_ne_dv, _matches, "as the spec"),
    Question("bias_and_mask", "bias with mask", _bias_and_mask, _matches, "as the spec"),
    Question("kv_lengths", "key lengths", _kv_lengths, _matches, "as the spec"),
    Question("weights", "returned weights", _weights, _weights_answer, "returned, as the spec"),
    Question(
        "finite_floor",
        "visible logits at finfo.min, a key masked",
        _finite_floor,
        _floor_answer,
        "as the spec",
    ),
    Question(
        "causal_floor",
        "its causal flag, a visible logit at -3e4",
        _causal_floor,
        _causal_floor_answer,
        "as the spec",
        "the framework's causal argument alone, n = m",
    ),
    Question("zero_batch", "a batch of 0, with a mask", _zero_batch, _matches, "as the spec"),
    Question("float64", "float64 in, what comes out", _plain, lambda out, case: "", "float64, as the spec"),
    # a scale float32 cannot hold (ONNX's attributes are float32): does the result keep float64's precision?
    Question("float64_scale", "float64 in, scale 0.3", _scaled, lambda out, case: "", "float64, as the spec"),
]


def _float64(backend, result, case: Case) -> str:
    got = backend.dtype_name(result)
    if got != "float64":
        return f"returns {got}"
    err = np.nanmax(np.abs(backend.to_numpy(result) - _golden(case)), initial=0.0)
    # float64 arithmetic errs by ~1e-16 here; float32 arithmetic inside by ~1e-7
    if err < 1e-12:
        return "float64, as the spec"
    return "float64 dtype, float32 precision inside" if err < 1e-5 else f"float64 dtype, error {err:.1e}"


#: question -> the conformance suite's case tags of the same behaviour: a built-in native's
#: deviation (attnspec.backends.deviations) declared under these tags answers for the question
QUESTION_TAGS = {
    "empty_row_mask": {"no_visible_row"},
    "empty_row_bias": {"bias_neg_inf", "no_visible_row"},
    "nan_hidden_key": {"masked_nonfinite"},
    "nan_hidden_value": {"masked_nonfinite"},
    "dk_ne_dv": {"dk_ne_dv"},
    "finite_floor": {"finite_floor"},
    "zero_batch": {"zero_batch"},
    "float64": {"float64"},
    "float64_scale": {"float64", "scale"},
}

#: the questions asked in float64, answered by what comes out (`_float64`)
FLOAT64_QUESTIONS = frozenset({"float64", "float64_scale"})


def ask(backend: Backend, question: Question, dtype: str = "float32") -> dict[str, Any]:
    """One question through ``backend``: {"id", "answer", "spec", "reproducer"}; never raises."""
    if question.id in FLOAT64_QUESTIONS:
        dtype = "float64"
        if dtype not in getattr(backend, "dtypes", (dtype,)):
            return {
                "id": question.id,
                "title": question.title,
                "answer": "n/a: no float64 here",
                "spec": question.spec,
                "reproducer": "",
            }
    case = question.case()
    q, k, v, opts = case
    if opts.get("causal") == "flag":
        convention = getattr(backend, "convention", None)
        flag = (
            convention.causal_flag if convention is not None else "upper_left"
        )  # torch-/jax-native: is_causal
        if flag is None:  # a question the spec answers cannot be asked: n/a, not a difference
            answer = "n/a: no causal flag" if question.spec else "no causal flag"
            return {
                "id": question.id,
                "title": question.title,
                "answer": answer,
                "spec": question.spec,
                "reproducer": "",
            }
        opts = {**opts, "causal": flag}
    q, k, v = (x.astype(dtype).astype(np.float64) for x in (q, k, v))  # the values the backend sees
    case = (q, k, v, opts)
    if isinstance(backend, FunctionBackend):  # the backends that record their calls (record_calls)
        backend.record_calls, backend.last_call = True, None
    conv = {
        name: backend.asarray(x, dtype if x.dtype.kind == "f" else None) if isinstance(x, np.ndarray) else x
        for name, x in opts.items()
    }
    try:
        result = backend.sdpa(
            backend.asarray(q, dtype), backend.asarray(k, dtype), backend.asarray(v, dtype), **conv
        )
    except Unsupported as e:
        answer = f"n/a: {_short(e)}"
    except Exception as e:  # a refusal is an answer
        answer = f"raises {type(e).__name__}"
    else:
        if question.id in FLOAT64_QUESTIONS:
            repro = reproducer(backend) if getattr(backend, "last_call", None) else ""
            return {
                "id": question.id,
                "title": question.title,
                "answer": _float64(backend, result, case),
                "spec": question.spec,
                "reproducer": repro,
            }
        if isinstance(result, tuple):
            result = tuple(backend.to_numpy(r).astype(np.float64) for r in result)
            out = result[0]
        else:
            out = result = backend.to_numpy(result).astype(np.float64)
        answer = question.classify(result if question.id == "weights" else out, case)
    snippet = reproducer(backend) if getattr(backend, "last_call", None) is not None else ""
    return {
        "id": question.id,
        "title": question.title,
        "answer": answer,
        "spec": question.spec,
        "reproducer": snippet,
    }


def _short(e: Exception) -> str:
    text = " ".join(str(e).split())
    return text.split(": ", 1)[-1][:160]


# -- reproducers: the recorded call as standalone code -------------------------------------------


def _literal(backend, x) -> str:
    a = backend.to_numpy(x)
    dtype = a.dtype.name
    body = (
        np.array2string(
            a.astype(np.float64) if a.dtype.kind == "f" else a,
            separator=", ",
            threshold=10**6,
            max_line_width=10**6,
            floatmode="unique",
        )
        .replace("nan", "np.nan")
        .replace("inf", "np.inf")
    )
    np_expr = f"np.array({body}, dtype={'ml_dtypes.bfloat16' if dtype == 'bfloat16' else 'np.' + dtype})"
    plain, bfloat16 = _FROM_NUMPY.get(backend.arrays.name, ("{x}", None))
    return (bfloat16 if dtype == "bfloat16" and bfloat16 else plain).format(x=np_expr)


#: array library -> how a reproducer builds its array from a NumPy expression {x}, and how a
#: bfloat16 one (None: the same way)
_FROM_NUMPY = {
    "torch": ("torch.from_numpy({x})", "torch.from_numpy({x}.astype(np.float32)).to(torch.bfloat16)"),
    "jax": ("jnp.asarray({x})", None),
    "mlx": ("mx.array({x})", "mx.array({x}.astype(np.float32)).astype(mx.bfloat16)"),
    "tinygrad": ("Tensor({x})", None),
    "paddle": ("paddle.to_tensor({x})", "paddle.to_tensor({x}.astype(np.float32)).astype('bfloat16')"),
}

_IMPORTS = {
    "torch": "import torch",
    "jax": "import jax.numpy as jnp",
    "mlx": "import mlx.core as mx",
    "tinygrad": "from tinygrad import Tensor",
    "paddle": "import paddle",
    "numpy": "",
}


def _value(backend, x) -> str:
    if backend.arrays.is_array(x):
        return _literal(backend, x)
    if isinstance(x, types.SimpleNamespace):
        return "types.SimpleNamespace(" + ", ".join(f"{k}={v!r}" for k, v in vars(x).items()) + ")"
    if callable(x) or type(x).__module__.startswith("torch.nn.attention"):
        return f"...  # {type(x).__name__}: built from the call's visibility, see attnspec.backends.conventions.atlas"
    return repr(x)


def reproducer(backend) -> str:
    """The backend's last recorded call of its framework, as a standalone Python snippet."""
    args, kwargs = backend.last_call
    fn = backend.fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    head, _, rest = qualname.partition(".")
    lines = [*backend.preamble, "import numpy as np, ml_dtypes, types", _IMPORTS.get(backend.arrays.name, "")]
    inline = getattr(backend, "inline_source", None)  # the module that builds the framework's call, pasted
    lines.append(inline if inline else f"from {module} import {head}")
    lines.append(f"fn = {qualname}" if rest else f"fn = {head}")
    call = [_value(backend, a) for a in args] + [f"{k}={_value(backend, v)}" for k, v in kwargs.items()]
    lines.append("out = fn(\n    " + ",\n    ".join(call) + ",\n)")
    lines.append("print(out)")
    return "\n".join(line for line in lines if line)


def run(name: str) -> dict[str, Any]:
    """Every question through the backend ``name`` (as `attnspec.backends.load` takes it)."""
    import attnspec.backends

    backend = attnspec.backends.load(name)
    answers = [ask(backend, q) for q in QUESTIONS]
    if hasattr(backend, "describe"):
        describe = backend.describe()
    else:  # a built-in native backend: its class says what it calls
        describe = {
            "function": ((type(backend).__doc__ or "").strip().splitlines() or [""])[0],
            "convention": f"built-in ({type(backend).__module__})",
        }
    return {"schema": "attnspec.atlas/1", "backend": name, "implementation": describe, "answers": answers}


def _atlas_versions(name: str) -> dict[str, str]:
    """The versions of the modules an atlas backend needs (`attnspec.backends.atlas.natives.ATLAS`),
    which the kit's own list of frameworks may not name (onnx, onnxruntime, paddle)."""
    from attnspec.backends.atlas.natives import ATLAS

    modules = ATLAS.get(name, ("", ()))[1]
    return {m: str(getattr(sys.modules[m], "__version__", "?")) for m in modules if m in sys.modules}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnspec.backends.atlas.questions", description=__doc__.splitlines()[0]
    )
    ap.add_argument("backend")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    result = run(args.backend)
    from attnspec.results import framework_versions, write_json_atomic

    result["environment"] = {"frameworks": {**framework_versions(), **_atlas_versions(args.backend)}}
    write_json_atomic(args.out, result)
    for a in result["answers"]:
        flag = "" if a["answer"] == a["spec"] or not a["spec"] else "   <- differs from the spec"
        print(f"{a['title']:40} {a['answer']}{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
