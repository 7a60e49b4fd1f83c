"""`attnspec check` and the public authoring API: checking functions nobody registered.

The CLI runs as a user runs it (a subprocess, the ``dev`` profile) on functions written by hand
in `check_subjects` (correct ones and broken ones), on the tutorials' functions in
``examples/tutorial``, and on torch's and JAX's own primitives wrapped in a line each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from check_runs import check, check_all, results_of
from suite_runs import suite_command

from attnspec.backends.conventions import VARIANT_FEATURES
from attnspec.conformance.profiles import DEFAULT_PROFILE
from attnspec.conformance.serving_cases import SERVING_FEATURES

HERE = Path(__file__).parent


#: Each run takes the dtypes its tests read: the CLI's verdict, causes and reports do not change
#: with the dtype, and every dtype of every built-in backend runs in `nox -s conformance`. Each
#: dtype costs a run about a minute on two cores.
F32 = ("--dtype", "float32")
RUNS = {
    "correct": (
        "check_subjects:correct_torch_sdpa",
        "--convention",
        "torch_sdpa",
        *F32,
        "--dtype",
        "bfloat16",
    ),
    "tiled_gqa": ("check_subjects:tiled_gqa_sdpa", "--convention", "torch_sdpa", *F32),
    "flash_numpy": ("check_subjects:flash_numpy", "--convention", "flash", "--arrays", "numpy", *F32),
    "torch_raw": (
        "torch.nn.functional:scaled_dot_product_attention",
        "--convention",
        "torch_sdpa",
        "-k",
        "matches_golden or masked_keys",
    ),
    "torch_declared": ("check_subjects:torch_sdpa_backend", *F32, "--dtype", "float64"),
    "jax_declared": (
        "check_subjects:jax_sdpa_backend",
        "--dtype",
        "float32",
        "--dtype",
        "float64",
        "-k",
        "matches_golden or masked_keys",
    ),
    "float32_only": ("check_subjects:float32_only", "--convention", "torch_sdpa", "-k", "matches_golden"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return check_all(tmp_path_factory.mktemp("check"), RUNS)


def failing_features(results: dict) -> set[str]:
    return {r["feature"] for r in results["rows"] if r["failed"]}


@pytest.mark.proof
def test_correct_function_conforms_and_writes_its_report(runs):
    proc, out = runs["correct"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = results_of(out)
    assert sum(r["passed"] for r in results["rows"]) > 150  # the suite really ran
    assert (out / "index.md").exists() and (out / "accuracy.md").exists()
    # the probe's findings are in the results: the convention cannot return weights, and has none
    # of the #15 variants that change values (torch's SDPA signature has no softcap, ALiBi, sinks,
    # lse...); lengths-aligned causal and segment ids only decide visibility: its mask carries them
    folded = ("segments", "causal_lower_right_lengths")
    refused = {c["need"]: c["reason"] for c in results["capabilities"] if c["status"] != "ok"}
    assert {c["status"] for c in results["capabilities"]} == {"ok", "convention"}
    assert list(refused) == ["return_weights", *(f for f in VARIANT_FEATURES if f not in folded)]
    assert "torch_sdpa convention returns no attention weights" in refused["return_weights"]
    assert all("torch_sdpa" in refused[f] for f in VARIANT_FEATURES if f not in folded)
    ran = {r["feature"] for r in results["rows"] if r["passed"]}
    assert {"segments", "causal_lower_right_lengths", "chunked_prefill", "decode_gqa"} <= ran
    assert results["implementation"]["convention"] == "torch_sdpa"
    assert "CONFORMS" in proc.stderr and "feature" in proc.stderr  # the summary table


@pytest.mark.proof
def test_tiled_gqa_fails_and_names_gqa(runs):
    proc, out = runs["tiled_gqa"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "gqa" in failing_features(results_of(out))
    # nothing else is blamed: the serving cases with several query heads per kv head fail too
    assert failing_features(results_of(out)) <= {"gqa", "combined", *SERVING_FEATURES}
    fails = [line for line in proc.stderr.splitlines() if line.startswith("FAIL ")]
    assert fails and all("GQA heads tiled" in line for line in fails)
    line = next(line for line in proc.stderr.splitlines() if line.startswith("FAIL gqa"))  # gqa failed first
    assert "GQA heads tiled" in line and "repro: " in line
    repro = Path(line.split("repro: ")[1])
    assert repro.exists() and "resolve_backend" in repro.read_text()


@pytest.mark.proof
@pytest.mark.parametrize(
    "run,got", [("fill_neg_1e9_nan_to_num", "mean(V)"), ("fill_neg_inf", "NaN"), ("fill_neg_1e9", "mean(V)")]
)
def test_each_seed_fails_naming_the_empty_row_rule(tutorial_seed_checks, run, got):
    proc, out = tutorial_seed_checks[run]  # tests/conftest.py: shared with tests/test_new_users.py
    assert proc.returncode == 1, proc.stderr[-3000:]
    results = results_of(out)
    failing = failing_features(results)
    # every failing feature is named on a FAIL line (one line per distinct cause, its features listed)
    fail_lines = [line.split(" (")[0] for line in proc.stderr.splitlines() if line.startswith("FAIL ")]
    assert failing and all(
        any(f in line.removeprefix("FAIL ").split(", ") for line in fail_lines) for f in failing
    ), (failing, fail_lines)
    # the first line of a message names the rule (another failure may come first: -1e9 does not
    # fit float16, which torch refuses with an overflow error)
    causes = [f["message"].splitlines()[0] for f in results["failures"]]
    assert any(f"row with no visible key: expected 0, got {got}" in c for c in causes), causes


@pytest.mark.proof
def test_a_reproducer_written_by_check_reproduces(tutorial_seed_checks):
    _, out = tutorial_seed_checks["fill_neg_inf"]
    repro = sorted((out / "repro").glob("*.py"))[0]
    ran = subprocess.run(
        [sys.executable, str(repro)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() not in ("0.0", "")  # it prints the max error against the golden: not zero


@pytest.mark.proof
def test_flash_style_numpy_function_conforms_where_the_convention_reaches(runs):
    proc, out = runs["flash_numpy"]
    # nothing failed, but the function takes none of softcap, alibi_slopes, return_attn_probs, which
    # the flash convention passes: not a verdict of conformance until it declares them (#25)
    assert proc.returncode == 1 and "\nINCOMPLETE: " in proc.stderr, proc.stderr[-3000:]
    assert all(
        f"NOT RUN {need}: refused by the function" in proc.stderr for need in ("softcap", "alibi", "lse")
    )
    assert "unexpected keyword argument 'softcap'" in proc.stderr
    results = results_of(out)
    reasons = {r for row in results["rows"] for r in row["unsupported_reasons"]}
    assert any("the flash convention has no mask argument" in r for r in reasons)
    passed = {r["feature"] for r in results["rows"] if r["passed"]}
    assert {"plain", "gqa", "causal_lower_right", "window_lower_right", "dk_ne_dv"} <= passed


@pytest.mark.proof
def test_torch_sdpa_raw_fails_only_where_torch_is_known_to_deviate(runs):
    proc, out = runs["torch_raw"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    results = results_of(out)
    # every failure is NaN/inf from hidden keys reaching rows (torch.masked-nonfinite-k/v)
    for f in results["failures"]:
        assert "NaN/inf" in f["message"].splitlines()[0] or "got NaN" in f["message"].splitlines()[0], f[
            "message"
        ][:500]


@pytest.mark.proof
def test_torch_sdpa_with_torchs_declared_deviations_conforms(runs):
    proc, out = runs["torch_declared"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    observed = {d["id"] for d in results_of(out)["deviations"] if d["status"] == "observed"}
    assert observed >= {"torch.masked-nonfinite-k", "torch.masked-nonfinite-v"}


@pytest.mark.proof
def test_jax_dot_product_attention_with_jaxs_declared_deviations_conforms(runs):
    proc, out = runs["jax_declared"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = results_of(out)
    observed = {d["id"] for d in results["deviations"] if d["status"] == "observed"}
    # JAX's known deviations show up, on the cases they are declared for (a failing case no
    # declared deviation covers would have failed the run)
    assert observed & {"jax.empty-row-mean-v", "jax.masked-nonfinite-v", "jax.neg-inf-bias-row-nan"}, observed
    assert not [d for d in results["deviations"] if d["status"] == "stale"]
    assert {r["dtype"] for r in results["rows"]} == {"float32", "float64"}  # --dtype narrowed the run


@pytest.mark.proof
def test_probe_finds_refused_dtypes_and_the_suite_reports_them(runs):
    proc, out = runs["float32_only"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = results_of(out)
    refused = {c["dtype"] for c in results["capabilities"] if c["need"] == "dtype" and c["status"] != "ok"}
    assert refused == {"float16", "bfloat16", "float64"}
    row = next(
        r
        for r in results["rows"]
        if r["dtype"] == "float16" and r["function"] == "sdpa" and r["property"] == "matches_golden"
    )
    assert row["unsupported"] == row["run"]
    assert any("float32_only: got torch.float16" in reason for reason in row["unsupported_reasons"])


#: the n > m calls that crash or hang in a run (check_subjects.FAULTS_ENV): more than one, so a
#: restarted child meets a fault again; not every one, which restarted the child 20 times (~4 min)
FAULTS = 2


@pytest.mark.proof
@pytest.mark.parametrize("fn,status", [("aborts_when_n_gt_m", "crashed"), ("hangs_when_n_gt_m", "timeout")])
def test_a_function_that_crashes_or_hangs_is_recorded_and_the_run_completes(tmp_path, fn, status):
    calls = tmp_path / "n_gt_m_calls"  # one byte per call with n > m, across the run's processes
    # sdpa's own forward properties: their cases take milliseconds, so 4 s without progress is a hang
    # (the serving and gradient properties' larger cases took over 4 s on a loaded machine: restarts)
    proc = check(
        "check",
        f"check_subjects:{fn}",
        "--convention",
        "torch_sdpa",
        "--dtype",
        "float32",
        "-k",
        "test_sdpa and (matches_golden or masked_keys)",
        "--case-timeout",
        "4",
        "--out",
        str(tmp_path / "out"),
        env={"CHECK_SUBJECTS_FAULTS": f"{calls}:{FAULTS}"},
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    rows = results_of(tmp_path / "out")["rows"]
    assert sum(r[status] for r in rows) >= 1, proc.stderr[-3000:]
    assert sum(r["passed"] for r in rows) > 5
    # the run went on past the faults: the function met n > m again after its last fault
    assert calls.stat().st_size > FAULTS, proc.stderr[-3000:]


@pytest.mark.parametrize(
    "args,says",
    [
        (("no_such_module_xyz:fn", "--convention", "torch_sdpa"), "does not import"),
        (("check_subjects:missing", "--convention", "torch_sdpa"), "has no attribute 'missing'"),
        (("check_subjects:NOT_CALLABLE", "--convention", "torch_sdpa"), "not a callable"),
        (("check_subjects:correct_torch_sdpa", "--convention", "nope"), "convention='nope' is not one of"),
        (("no_such_backend",), "unknown backend 'no_such_backend'"),
        (("check_subjects:correct_torch_sdpa",), "for a plain function, give --convention NAME"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(tmp_path, args, says):
    proc = check("check", *args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_out_inside_the_package_is_refused(tmp_path):
    import attnspec.reports

    proc = check(
        "check",
        "check_subjects:correct_torch_sdpa",
        "--convention",
        "torch_sdpa",
        "--out",
        str(Path(attnspec.reports.__file__).parent / "x"),
    )
    assert proc.returncode == 2 and "inside the installed attnspec package" in proc.stderr


def test_backends_lists_every_builtin_installed_or_not():
    import attnspec.backends as ab

    proc = check("backends")
    assert proc.returncode == 0
    for name, a in ab.available().items():
        line = next(line for line in proc.stdout.splitlines() if line.split()[0] == name)
        assert ("yes" if a.installed else "no") in line.split()


def test_a_reader_that_goes_away_gets_no_traceback():
    """`attnspec backends | head -1`: stdout's reader is gone before the table is written."""
    code = (
        "import os, sys; r, w = os.pipe(); os.close(r); os.dup2(w, 1); "
        "sys.stdout = os.fdopen(1, 'w', buffering=1); from attnspec.cli import main; "
        "sys.exit(main(['backends']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=HERE)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, (
        proc.stderr
    )


def test_a_drifted_signature_fails_its_own_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    cmd = suite_command("mutants:SignatureDrift", DEFAULT_PROFILE, "-k", "test_signatures")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 1
    assert "dropout_p" in proc.stdout and "signature" in proc.stdout
    control = [c if c != "mutants:SignatureDrift" else "mutants:control" for c in cmd]
    ok = subprocess.run(control, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout[-2000:]  # the correct control, same command: passes


# -- the authoring helpers, in-process ------------------------------------------------------------


def _plan(q, k, v, **opts):
    from attnspec.backends.authoring import plan_sdpa

    return plan_sdpa("t.sdpa", q, k, v, **opts)


def test_attend_mask_is_the_spec_visibility():
    from attnspec.backends.authoring import additive_mask, attend_mask
    from attnspec.spec import sdpa

    rng = np.random.default_rng(0)
    q, k, v = (
        rng.standard_normal((2, 4, 5, 8)),
        rng.standard_normal((2, 2, 7, 8)),
        rng.standard_normal((2, 2, 7, 8)),
    )
    mask = rng.random((5, 7)) < 0.8
    bias = np.where(rng.random((2, 4, 5, 7)) < 0.2, -np.inf, rng.standard_normal((2, 4, 5, 7)))
    opts = dict(causal="lower_right", window=(2, 1), kv_lengths=np.array([7, 4]), q_lengths=np.array([5, 3]))
    p = _plan(q, k, v, mask=mask, bias=bias, **opts)
    vis = attend_mask(p, mask, bias, full=True)
    assert vis.shape == (2, 4, 5, 7)
    # folding every rule into one mask changes nothing
    want = sdpa(q, k, v, mask=mask, bias=bias, **opts)
    assert np.allclose(sdpa(q, k, v, mask=vis, bias=np.where(vis, bias, 0)), want, atol=1e-14)
    add = additive_mask(p, mask, bias)
    assert np.array_equal(np.isneginf(np.broadcast_to(add, vis.shape)), ~vis)
    assert np.allclose(sdpa(q, k, v, bias=add), want, atol=1e-14)


def test_layout_and_gqa_helpers():
    import torch

    from attnspec.backends.authoring import expand_kv_heads, flatten_batch, to_bhld, to_blhd, unflatten_batch

    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    assert to_blhd(x).shape == (2, 4, 3, 5) and np.array_equal(to_bhld(to_blhd(x)), x)
    t = torch.from_numpy(x)
    assert torch.equal(to_blhd(t), torch.from_numpy(np.ascontiguousarray(to_blhd(x))))
    kv = np.arange(2)[None, :, None, None] * np.ones((1, 2, 3, 4))  # kv head j holds j
    assert expand_kv_heads(kv, 3)[0, :, 0, 0].tolist() == [0, 0, 0, 1, 1, 1]  # query head h reads h // G
    q = np.ones((3, 4))  # rank 2
    p = _plan(q, q, q)
    flat = flatten_batch(p, q, 1, 3)
    assert flat.shape == (1, 1, 3, 4) and unflatten_batch(p, flat).shape == (3, 4)
    qb, kb = np.ones((2, 3, 1, 5, 4)), np.ones((1, 1, 1, 6, 4))  # k broadcasts over the batch
    p = _plan(qb, kb, kb)
    assert flatten_batch(p, kb, 1, 6).shape == (6, 1, 6, 4)


def test_from_function_refuses_bad_arguments():
    from attnspec import SpecError
    from attnspec.backends import from_function

    with pytest.raises(SpecError, match="fn must be callable"):
        from_function(3, "torch_sdpa")
    with pytest.raises(SpecError, match="convention='x' is not one of"):
        from_function(print, "x")
    with pytest.raises(SpecError, match="arrays='y' is not one of"):
        from_function(print, "tutorial", arrays="y")
    with pytest.raises(SpecError, match="dtypes="):
        from_function(print, "tutorial", arrays="numpy", dtypes=("int8",))


def test_a_function_backend_validates_before_calling():
    from attnspec import SpecError
    from attnspec.backends import from_function

    calls = []
    b = from_function(lambda *a, **k: calls.append(1), "tutorial", arrays="numpy")
    q = np.ones((1, 2, 3, 4))
    with pytest.raises(SpecError, match=r"k\.shape\[-1\]=5 must equal q\.shape\[-1\]=4"):
        b.sdpa(q, np.ones((1, 2, 3, 5)), np.ones((1, 2, 3, 5)))
    with pytest.raises(SpecError, match=r"must be a numpy\.ndarray"):
        b.sdpa(q, q.tolist(), q)
    assert calls == []


def test_conventions_refuse_what_they_cannot_carry():
    from attnspec.backends.conventions import CONVENTIONS, call_needs

    lr = call_needs((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4), {"causal": "upper_left"})
    assert CONVENTIONS["flash"].refusals(lr) == [
        "the flash convention's causal is lower-right: upper-left differs when n != m"
    ]
    square = call_needs((1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4), {"causal": "upper_left"})
    assert CONVENTIONS["flash"].refusals(square) == []
    biased = call_needs((3, 4), (5, 4), (5, 4), {"bias": np.zeros((3, 5))})
    assert "the tutorial convention has no bias argument" in CONVENTIONS["tutorial"].refusals(biased)
    assert CONVENTIONS["torch_sdpa"].refusals(biased) == [] and CONVENTIONS["jax"].refusals(biased) == []


def test_readme_and_example_plugin_use_public_names_only():
    """An outside author never needs a module or name starting with "_" (the README's and the guide's promise)."""
    import re

    root = HERE.parent
    texts = {
        "README.md": (root / "README.md").read_text(),
        "CONTRIBUTING.md": (root / "CONTRIBUTING.md").read_text(),
    }
    for path in (root / "docs").rglob("*.md"):
        texts[str(path.relative_to(root))] = path.read_text()
    for path in (root / "examples").rglob("*.py"):
        texts[str(path.relative_to(root))] = path.read_text()
    for path in (root / "examples").rglob("README.md"):
        texts[str(path.relative_to(root))] = path.read_text()
    private = re.compile(r"attnspec(?:\.\w+)*\._\w+|from attnspec[\w.]* import [^\n]*\b_\w+")
    found = {name: private.findall(text) for name, text in texts.items()}
    assert not {k: v for k, v in found.items() if v}, found
    # and what they name exists
    from attnspec.backends import authoring

    for name in authoring.__all__:
        assert hasattr(authoring, name), name


# -- FlashAttention's varlen and KV-cache conventions ----------------------------------------------
# The subjects (`check_subjects_flash`) are written from FlashAttention's docstrings, per sequence,
# with no spec code; the wrong ones anchor causal upper-left per sequence, or on the padded cache.
FLASH_RUNS = {
    "varlen": ("check_subjects_flash:flash_varlen_numpy", "flash_varlen"),
    "varlen_upper_left": ("check_subjects_flash:flash_varlen_upper_left", "flash_varlen"),
    "kvcache": ("check_subjects_flash:flash_kvcache_numpy", "flash_kvcache"),
    "kvcache_padded": ("check_subjects_flash:flash_kvcache_padded", "flash_kvcache"),
}


@pytest.fixture(scope="module")
def flash_runs(tmp_path_factory):
    # float32 and float64: the NumPy references compute in the input's dtype (see RUNS on dtypes)
    runs = {
        name: (fn, "--convention", conv, "--arrays", "numpy", *F32, "--dtype", "float64")
        for name, (fn, conv) in FLASH_RUNS.items()
    }
    return check_all(tmp_path_factory.mktemp("check_flash"), runs)


@pytest.mark.proof
@pytest.mark.parametrize(
    "run, features",
    [
        (
            "varlen",
            {"segments", "causal_lower_right_lengths", "q_lengths", "kv_lengths", "alibi", "softcap", "lse"},
        ),
        ("kvcache", {"causal_lower_right_lengths", "alibi", "softcap", "lse", "window_lower_right"}),
    ],
)
def test_flash_varlen_and_kvcache_references_conform(flash_runs, run, features):
    proc, out = flash_runs[run]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    rows = results_of(out)["rows"]
    assert features <= {r["feature"] for r in rows if r["passed"]}
    assert not any(r["failed"] or r["crashed"] for r in rows)


@pytest.mark.proof
@pytest.mark.parametrize(
    "run, feature", [("varlen_upper_left", "causal_lower_right_lengths"), ("kvcache_padded", "alibi")]
)
def test_wrong_alignment_fails_check(flash_runs, run, feature):
    proc, out = flash_runs[run]
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert feature in failing_features(results_of(out))


def test_flash_kvcache_aligns_on_cache_seqlens_as_issue_15_measured():
    """n = 2, m = 6, kv_lengths = [4]: FlashAttention's query 0 sees keys 0-2 (j <= 0 + 4 - 2), the
    spec's "lower_right" keys 0-3. With v = identity the output row is the weight row."""
    import check_subjects_flash as subjects

    from attnspec.backends import from_function
    from attnspec.spec import sdpa

    rng = np.random.default_rng(15)
    q, k = rng.standard_normal((1, 2, 8)), rng.standard_normal((1, 6, 8))
    v = np.eye(6)[None]  # (1, 6, 6): out[i] = weights[i]
    opts = dict(causal="lower_right_lengths", kv_lengths=np.array([4]))
    right = from_function(subjects.flash_kvcache_numpy, convention="flash_kvcache", arrays="numpy", name="kv")
    padded = from_function(
        subjects.flash_kvcache_padded, convention="flash_kvcache", arrays="numpy", name="pad"
    )
    got = right.sdpa(q[None], k[None], v[None], **opts)[0, 0]  # (2, 6)
    assert np.flatnonzero(got[0]).tolist() == [0, 1, 2] and np.flatnonzero(got[1]).tolist() == [0, 1, 2, 3]
    np.testing.assert_allclose(got, sdpa(q[None], k[None], v[None], **opts)[0, 0], rtol=0, atol=1e-15)
    assert np.flatnonzero(padded.sdpa(q[None], k[None], v[None], **opts)[0, 0, 0]).tolist() == [0, 1, 2, 3]


def test_flash_varlen_packs_segments_and_matches_the_spec():
    import check_subjects_flash as subjects

    from attnspec.backends import Unsupported, from_function
    from attnspec.spec import sdpa, segment_ids_from_cu_seqlens

    rng = np.random.default_rng(16)
    q, k, v = (
        rng.standard_normal((4, 10, 8)),
        rng.standard_normal((2, 12, 8)),
        rng.standard_normal((2, 12, 8)),
    )
    opts = dict(
        causal="lower_right_lengths",
        window=(3, 1),
        softcap=3.0,
        alibi_slopes=2.0 ** -np.arange(1, 5),
        q_segment_ids=segment_ids_from_cu_seqlens([0, 3, 9], 10),  # row 9 is padding
        kv_segment_ids=segment_ids_from_cu_seqlens([0, 4, 12], 12),
        return_lse=True,
    )
    be = from_function(subjects.flash_varlen_numpy, convention="flash_varlen", arrays="numpy", name="v")
    (out, lse), (g_out, g_lse) = be.sdpa(q, k, v, **opts), sdpa(q, k, v, **opts)
    np.testing.assert_allclose(out, g_out, rtol=0, atol=1e-12)  # float64: rounding order only
    np.testing.assert_allclose(lse, g_lse, rtol=1e-12, atol=0)
    assert (out[:, 9] == 0).all() and np.isneginf(lse[:, 9]).all()  # padding: in no sequence
    split = dict(opts, q_segment_ids=np.array([0, 0, 1, 1, 0, 1, 1, 1, 1, -1]))
    with pytest.raises(Unsupported, match="segment 0 of batch element 0 is not contiguous"):
        be.sdpa(q, k, v, **split)


def test_flash_varlen_and_kvcache_refuse_other_alignments():
    from attnspec.backends.conventions import CONVENTIONS, call_needs

    shapes = ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    for name in ("flash_varlen", "flash_kvcache"):
        conv = CONVENTIONS[name]
        assert conv.refusals(call_needs(*shapes, {"causal": "lower_right"})) == []
        assert (
            conv.refusals(call_needs(*shapes, {"causal": "lower_right_lengths", "kv_lengths": np.array([4])}))
            == []
        )
        refused = conv.refusals(call_needs(*shapes, {"causal": "lower_right", "kv_lengths": np.array([4])}))
        assert refused == [
            f"the {name} convention anchors causal, window and ALiBi at i + sk - sq of each "
            "sequence's actual lengths (causal='lower_right_lengths'): the spec's "
            "causal_lower_right differs here"
        ]
        assert f"the {name} convention has no mask argument" in conv.refusals(
            call_needs(*shapes, {"mask": np.ones((3, 5), bool)})
        )
