"""The atlas: its native backends return exactly what their framework returns, its deviations are
checked both ways, and its page renders from results JSON.

The backends whose framework is not installed are skipped (``pip install .[atlas]`` installs them
all; ``nox -s tests`` does).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import attnspec.backends as ab
from attnspec.backends.atlas.deviations import ATLAS_DEVIATIONS, check
from attnspec.backends.atlas.natives import ATLAS
from attnspec.backends.atlas.questions import QUESTIONS

CALLS = {  # spec calls that reach the framework's own arguments
    "gqa_mask": ((1, 4, 5, 8), (1, 2, 7, 8), {"mask": np.arange(7) < 5}),
    "causal": ((2, 2, 6, 8), (2, 2, 6, 8), {"causal": "upper_left"}),
    "plain": ((1, 2, 8, 8), (1, 2, 8, 8), {}),
    # the variants of issue #15 an implementation takes as its own arguments (flex: softcap and
    # ALiBi as score_mod, lse through return_aux; MLX: sinks)
    "softcap_alibi_lse": (
        (1, 4, 5, 8),
        (1, 2, 7, 8),
        {
            "softcap": 5.0,
            "causal": "lower_right",
            "return_lse": True,
            "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625]),
        },
    ),
    "sinks": ((1, 4, 5, 8), (1, 2, 7, 8), {"sinks": np.array([0.5, -1.0, 2.0, 0.0], np.float32)}),
}


def _backend(name):
    if not ab.available()[name].installed:
        pytest.skip(f"{name}: {ab.available()[name].reason}")
    return ab.get(name)


def _values(x) -> np.ndarray:
    x = np.asarray(x, np.float64).ravel()
    return np.sort(np.where(np.isnan(x), np.inf, x))


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("name", sorted(ATLAS))
def test_native_output_is_the_frameworks_own(name, call):
    # Keras runs on one backend per process, and Pallas without JAX's 64-bit mode (which the other
    # JAX backends switch on): each in a process of its own
    if name.startswith("keras-") or name.startswith("pallas-"):
        import os
        import subprocess
        import sys
        from pathlib import Path

        here = str(Path(__file__).parent)
        env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
        code = f"import test_atlas as t; t.same_as_framework({name!r}, {call!r})"
        proc = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            cwd=here,
            env={**env, "PYTHONPATH": here},
            timeout=600,
        )
        if "Skipped" in proc.stderr:
            pytest.skip(proc.stderr.strip().splitlines()[-1])
        assert proc.returncode == 0, proc.stderr[-3000:]
        return
    same_as_framework(name, call)


def same_as_framework(name, call):
    b = _backend(name)
    q_shape, k_shape, opts = CALLS[call]
    rng = np.random.default_rng(0)
    q, k, v = (b.asarray(rng.standard_normal(s), "float32") for s in (q_shape, k_shape, k_shape))
    conv = {o: b.asarray(x) if isinstance(x, np.ndarray) else x for o, x in opts.items()}
    if b.supports("sdpa", dtype="float32", q_shape=q_shape, k_shape=k_shape, v_shape=k_shape, **opts):
        pytest.skip(f"{name} cannot express {call}")
    b.record_calls = True
    out = b.sdpa(q, k, v, **conv)
    args, kwargs = b.last_call
    direct = b.fn(*args, **kwargs)  # the framework called directly, with the same arguments
    direct = direct[0] if isinstance(direct, tuple) else direct
    recorded = b.last_result[0] if isinstance(b.last_result, tuple) else b.last_result
    assert np.array_equal(b.to_numpy(direct), b.to_numpy(recorded), equal_nan=True)
    # what the backend returns is those values, only moved to the spec's layout
    got = b.to_numpy(out[0] if isinstance(out, tuple) else out)  # (out, lse) with return_lse
    assert got.size == math.prod(b.to_numpy(direct).shape)
    assert np.array_equal(_values(got), _values(b.to_numpy(direct)))


def test_every_declared_deviation_names_a_known_backend_and_question():
    questions = {q.id for q in QUESTIONS}
    for d in ATLAS_DEVIATIONS:
        assert d.backend in ATLAS, d.id
        assert d.question in questions, d.id
        assert d.tags, d.id  # the suite credits its failures by these tags
    assert len({d.id for d in ATLAS_DEVIATIONS}) == len(ATLAS_DEVIATIONS)


def test_check_reports_observed_stale_not_exercised_and_undeclared():
    d = next(d for d in ATLAS_DEVIATIONS if d.backend == "mlx-native" and d.question == "empty_row_mask")
    answers = [{"id": "empty_row_mask", "title": "t", "answer": d.answer, "spec": "0"}]
    entries, undeclared = check("mlx-native", answers)
    assert next(e for e in entries if e["id"] == d.id)["status"] == "observed"
    answers[0]["answer"] = "0"  # fixed upstream: the entry is stale
    entries, _ = check("mlx-native", answers)
    assert next(e for e in entries if e["id"] == d.id)["status"] == "stale"
    answers[0]["answer"] = "n/a: cannot be asked"
    entries, _ = check("mlx-native", answers)
    assert next(e for e in entries if e["id"] == d.id)["status"] == "not_exercised"
    new = [{"id": "gqa_order", "title": "GQA head order", "answer": "h % Hkv (tiled)", "spec": "h // G"}]
    _, undeclared = check("mlx-native", new)
    assert undeclared == new


def test_atlas_page_renders_cells_links_and_stale(tmp_path):
    from attnspec.reports.render import render

    answers = [
        {"id": q.id, "title": q.title, "answer": q.spec or "upper-left", "spec": q.spec, "reproducer": ""}
        for q in QUESTIONS
    ]
    answers[0] = {**answers[0], "answer": "mean(V)", "reproducer": "import mlx.core as mx\nprint(1)"}
    answers[1] = {**answers[1], "answer": "0"}  # mlx.empty-row-neg-inf-nan declared NaN: stale now
    answers[8] = {**answers[8], "answer": "h % Hkv (tiled)"}  # GQA: nothing declared
    doc = {
        "schema": "attnspec.atlas/1",
        "backend": "mlx-native",
        "answers": answers,
        "implementation": {"function": "mlx.core.fast.scaled_dot_product_attention", "convention": "mlx"},
        "environment": {"frameworks": {"mlx": "0.0-test"}},
    }
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "atlas-mlx-native.json").write_text(json.dumps(doc))
    render(tmp_path / "results", tmp_path / "out", plots=False)
    page = (tmp_path / "out" / "atlas.md").read_text()
    # the link's anchor is the id GitHub (and the docs site) gives the deviation's heading: the dot
    # is dropped, not turned into a dash (the page once made its own, and 55 links were dead)
    assert "**mean(V)** [mlx.empty-row-mean-v](#mlxempty-row-mean-v)" in page
    assert "\n### mlx.empty-row-mean-v\n" in page
    assert "status **stale**" in page and "**h % Hkv (tiled)** (undeclared)" in page
    assert "mlx 0.0-test" in page and "import mlx.core as mx" in page
    assert "[The attention atlas](atlas.md)" in (tmp_path / "out" / "index.md").read_text()


def _finite_fill_sdpa(q, k, v, bias, mask, fill):
    """Attention as code that masks with a finite fill computes it (not the spec's rule)."""
    logits = np.where(mask, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias, fill).astype(np.float32)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def test_finite_floor_question_tells_a_finite_fill_from_the_spec():
    from attnspec.spec import sdpa

    question = next(q for q in QUESTIONS if q.id == "finite_floor")
    q, k, v, opts = case = question.case()
    assert question.classify(sdpa(q, k, v, **opts), case) == question.spec == "as the spec"
    for fill in (-0.7 * float(np.finfo(np.float32).max), -1e9):  # JAX's fill; a common hand-written one
        out = _finite_fill_sdpa(q, k, v, opts["bias"], opts["mask"], fill).astype(np.float64)
        assert question.classify(out, case) == "hidden key takes the weight", fill


def test_flax_finite_mask_fill_is_observed_and_declared():
    from attnspec.backends.atlas.questions import ask

    b = _backend("flax-native")
    answer = ask(b, next(q for q in QUESTIONS if q.id == "finite_floor"))
    assert answer["answer"] == "hidden key takes the weight"
    entries, undeclared = check("flax-native", [answer])
    assert next(e for e in entries if e["id"] == "flax.finite-mask-fill")["status"] == "observed"
    assert undeclared == []


def _ask(name, question_id):
    from attnspec.backends.atlas.questions import ask

    return ask(_backend(name), next(q for q in QUESTIONS if q.id == question_id))


@pytest.mark.parametrize("name", ["onnx-ref-native", "onnxruntime-native"])
def test_onnx_empty_row_is_zero_and_no_deviation(name):
    # the operator's errata (onnx/onnx PR 8068): a row with no visible key is 0, as the spec says,
    # so the atlas must not call it a deviation
    for question in ("empty_row_mask", "empty_row_bias"):
        answer = _ask(name, question)
        assert answer["answer"] == "0"
        entries, undeclared = check(name, [answer])
        assert [e for e in entries if e["question"] == question] == [] and undeclared == []


@pytest.mark.parametrize("name", ["onnx-ref-native", "onnxruntime-native"])
def test_onnx_lower_right_causal_through_nonpad_kv_seqlen(name):
    b = _backend(name)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((1, 2, 2, 4), (1, 2, 5, 4), (1, 2, 5, 4)))
    b.record_calls = True
    out = b.sdpa(*(b.asarray(x, "float32") for x in (q, k, v)), causal="lower_right")
    _, kwargs = b.last_call
    assert kwargs["is_causal"] == 1 and list(kwargs["nonpad_kv_seqlen"]) == [5]  # offset m - n
    from attnspec.spec import sdpa

    golden = sdpa(*(x.astype(np.float32).astype(np.float64) for x in (q, k, v)), causal="lower_right")
    assert np.allclose(b.to_numpy(out), golden, atol=1e-5)


def test_onnx_reproducer_runs_without_attnspec(tmp_path):
    import subprocess
    import sys

    answer = _ask("onnx-ref-native", "nan_hidden_value")
    assert not [line for line in answer["reproducer"].splitlines() if "import" in line and "attnspec" in line]
    script = tmp_path / "repro.py"
    script.write_text(answer["reproducer"])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "nan" in proc.stdout


def test_paddle_causal_flag_adds_a_finite_fill():
    answer = _ask("paddle-native", "causal_floor")
    assert answer["answer"] == "hidden keys take the weight"
    assert "is_causal=True" in answer["reproducer"]
    entries, undeclared = check("paddle-native", [answer])
    assert next(e for e in entries if e["id"] == "paddle.causal-fill-neg-1e4")["status"] == "observed"
    assert undeclared == []


def test_causal_floor_question_tells_a_finite_fill_from_the_spec():
    from attnspec.spec import sdpa

    question = next(q for q in QUESTIONS if q.id == "causal_floor")
    q, k, v, opts = question.case()
    case = (q, k, v, {**opts, "causal": "upper_left"})
    assert question.classify(sdpa(*case[:3], causal="upper_left"), case) == "as the spec"
    logits = q @ np.swapaxes(k, -1, -2) / 2 + np.triu(np.full((3, 3), -1e4), 1)  # paddle's CPU causal mask
    w = np.exp(logits - logits.max(-1, keepdims=True))
    assert question.classify((w / w.sum(-1, keepdims=True)) @ v, case) == "hidden keys take the weight"
