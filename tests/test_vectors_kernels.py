"""The serving, paged and FP8 bundles (conformance/vectors_kernels.py) judge kernels as the suite does.

A kernel author runs a bundle with their own runner and only `verify` judges; so here a paged
runner written against the bundle's layout alone (the pool, the block table, cache_seqlens)
conforms, and two broken ones fail: one that ignores the block table and one that reads past
cache_seqlens, whose NaN is named. The FP8 kernel of tests/mutants_fp8.py conforms on the cases
of its P precision claim and fails with a forgotten descale; a serving mutant of
tests/mutants_serving.py (a key past a 64-tile dropped) fails the serving bundle, its control
passes. NumPy, the reference, conforms on every new bundle through `attnspec vectors run`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import mutants as M
import mutants_fp8 as MF
import mutants_serving as MS
import numpy as np
import pytest

from attnspec.backends import get as get_backend
from attnspec.conformance import tensorfile
from attnspec.conformance.vectors import export, families, load, run, verify, write_output
from attnspec.spec import sdpa
from attnspec.spec.dtypes import round_to
from attnspec.spec.fp8 import FP8_DTYPES

KERNEL_FAMILIES = ("sdpa_serving", "sdpa_paged", "sdpa_fp8")
DTYPES = ("float32", *FP8_DTYPES)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("vectors")
    export(out, "dev", KERNEL_FAMILIES, DTYPES)
    return out


@pytest.fixture(scope="module")
def bundles(folder):
    return {b.family: b for b in load(folder)}


def _verify(bundle, outputs, name="kernel"):
    results = verify([bundle], outputs, name)
    return results, results["vectors"]["bundles"][0]


# -- the bundles themselves ----------------------------------------------------------------------


def test_families_come_after_the_earlier_ones_and_name_their_function(folder):
    assert list(families())[:4] == ["sdpa", "sdpa_vjp", "mha", "lsh_attention"]
    assert list(families())[4:] == list(KERNEL_FAMILIES)
    index = json.loads((folder / "index.json").read_text())
    got = {(b["path"], b["function"], b.get("family")) for b in index["bundles"]}
    assert got == {
        ("sdpa_serving-float32", "sdpa", "sdpa_serving"),
        ("sdpa_paged-float32", "sdpa", "sdpa_paged"),
        ("sdpa_fp8-float8_e4m3fn", "sdpa_fp8", None),
        ("sdpa_fp8-float8_e5m2", "sdpa_fp8", None),
    }


def test_two_exports_are_byte_identical(folder, tmp_path):
    export(tmp_path, "dev", KERNEL_FAMILIES, DTYPES)
    mine = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    again = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert mine == again
    for rel in mine:
        assert (folder / rel).read_bytes() == (tmp_path / rel).read_bytes(), rel


def test_earlier_bundles_do_not_depend_on_the_new_families(tmp_path):
    """sdpa's bundle is the same bytes whether or not the kernel families are exported beside it,
    and its manifest has no family (the commit that added them compared all 16 dev bundles)."""
    export(tmp_path / "alone", "dev", ["sdpa"], ["float16"])
    export(tmp_path / "with", "dev", ["sdpa", *KERNEL_FAMILIES], ["float16"])
    for f in (tmp_path / "alone" / "sdpa-float16").iterdir():
        assert f.read_bytes() == (tmp_path / "with" / "sdpa-float16" / f.name).read_bytes(), f.name
    assert "family" not in json.loads((tmp_path / "alone" / "sdpa-float16" / "manifest.json").read_text())


def test_serving_bundle_holds_every_feature_and_the_fixed_kernel_cases(bundles):
    from attnspec.conformance.serving_cases import KERNEL_CASES, SERVING_FEATURES

    cases = list(bundles["sdpa_serving"].read_cases())
    assert {c.feature for c in cases} == set(SERVING_FEATURES)
    assert {t for c in cases for t in c.tags} >= set(KERNEL_CASES)
    assert {c.function for c in cases} == {"sdpa"} and {c.prop for c in cases} == {"matches_golden"}


def test_paged_layout_is_the_adversarial_pool(bundles):
    sizes = set()
    for c in bundles["sdpa_paged"].read_cases():
        x = c.inputs
        table, lengths, pool = x["block_table"], x["cache_seqlens"], x["k_cache"]
        assert table.dtype == lengths.dtype == x["cu_seqlens_q"].dtype == np.int32
        bs = pool.shape[1]
        sizes.add(bs)
        b, n, hq, _ = x["q"].shape
        assert c.expected["out"].golden.shape[:3] == (b, n, hq)  # out is (B, n, Hq, dv)
        live = np.zeros(pool.shape[:2], bool)  # (num_blocks, block_size): a slot holding a key
        for s in range(b):
            j = np.arange(int(lengths[s]))
            live[table[s, j // bs], j % bs] = True
            assert np.isfinite(pool[table[s, j // bs], j % bs]).all(), c.id  # its keys, where the table says
            unused = table[s, -(-int(lengths[s]) // bs) :]
            assert len(unused) >= 1 and np.isnan(pool[unused]).all(), c.id  # trap blocks
        assert np.isnan(pool[~live]).all() and np.isnan(x["v_cache"][~live]).all(), c.id
        q_len = x["q_lengths"] if "q_lengths" in x else np.full(b, n)
        assert x["cu_seqlens_q"].tolist() == [0, *np.cumsum(q_len).tolist()]
        packed = np.concatenate([x["q"][s, : q_len[s]] for s in range(b)])
        assert np.array_equal(x["query"], packed, equal_nan=True)
    assert sizes == {1, 5, 16}


def test_fp8_storage_descales_and_claims(folder):
    for dtype, code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
        b = next(x for x in load(folder) if x.manifest["dtype"] == dtype)
        entries = b.cases
        claims = [e["options"]["p_precision"] for e in entries]
        half = len(entries) // 2
        assert claims == ["float32"] * half + ["float8_e4m3fn"] * half
        raw = (b.path / entries[0]["file"]).read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        assert header["k"]["dtype"] == header["v"]["dtype"] == code
        assert header["k_descale"]["dtype"] == "F32"
        assert header["__metadata__"]["option.p_precision"] == "float32"
        assert header["__metadata__"]["option.out_dtype"] in ("float16", "bfloat16", "float32")


# -- numpy and torch through `vectors run` ------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("family", ["sdpa_serving", "sdpa_paged", "sdpa_fp8"])
def test_backend_conforms(folder, tmp_path, backend, family):
    if backend == "torch":
        pytest.importorskip("torch")
    for b in (x for x in load(folder) if x.family == family):
        counts = run(get_backend(backend), [b], tmp_path / b.path.name)
        results, row = _verify(b, tmp_path / b.path.name, backend)
        assert not results["failures"], results["failures"][0]["message"]
        assert counts["error"] == 0
        expected_run = len(b.cases) // 2 if family == "sdpa_fp8" else len(b.cases)  # one claim of two
        assert row["passed"] == expected_run and row["unsupported"] == len(b.cases) - expected_run


# -- paged runners written against the bundle's layout -------------------------------------------


def paged_kernel(case, bug: str | None = None) -> np.ndarray:
    """What a paged kernel's runner computes from the bundle alone: keys read through the block
    table up to cache_seqlens, out (B, n, Hq, dv) in the case dtype. ``bug``: ignores_block_table
    (assumes each sequence's blocks lie in order after the previous one's), reads_past_seqlens
    (reads every key its table reaches)."""
    x = case.inputs
    pool_k, pool_v, table = x["k_cache"], x["v_cache"], x["block_table"].astype(np.int64)
    lengths = x["cache_seqlens"].astype(np.int64)
    bs, width = pool_k.shape[1], table.shape[1]
    if bug == "ignores_block_table":
        start = np.concatenate([[0], np.cumsum(-(-lengths // bs))[:-1]])  # (B,)
        table = np.minimum(start[:, None] + np.arange(width)[None, :], pool_k.shape[0] - 1)
    if bug == "reads_past_seqlens":
        lengths = np.full_like(lengths, width * bs)
    j = np.arange(width * bs)
    k = pool_k[table[:, j // bs], j % bs].transpose(0, 2, 1, 3)  # (B, Hkv, W * bs, dk)
    v = pool_v[table[:, j // bs], j % bs].transpose(0, 2, 1, 3)
    q = x["q"].transpose(0, 2, 1, 3)  # (B, Hq, n, dk)
    opts = {k_: tuple(o) if isinstance(o, list) else o for k_, o in case.options.items()}
    if "q_lengths" in x:
        opts["q_lengths"] = x["q_lengths"].astype(np.int64)
    if "sinks" in x:
        opts["sinks"] = x["sinks"].astype(np.float64)
    wide = (a.astype(np.float64) for a in (q, k, v))
    with np.errstate(all="ignore"):
        out = sdpa(*wide, kv_lengths=lengths, **opts)  # (B, Hq, n, dv)
    return round_to(np.asarray(out), case.dtype).transpose(0, 2, 1, 3)  # (B, n, Hq, dv)


@pytest.mark.parametrize("bug", [None, "ignores_block_table", "reads_past_seqlens"])
def test_paged_runners(bundles, tmp_path, bug):
    b = bundles["sdpa_paged"]
    for c in b.read_cases():
        write_output(tmp_path, c.id, {"out": paged_kernel(c, bug)})
    results, row = _verify(b, tmp_path, f"paged-{bug}")
    if bug is None:
        assert not results["failures"] and row["passed"] == len(b.cases)
        return
    assert row["failed"] >= 1, f"{bug} passed every paged case"
    messages = [f["message"] for f in results["failures"]]
    if bug == "reads_past_seqlens":
        assert row["failed"] == len(b.cases)  # every table has a trap entry past its length
        for m in messages:
            assert "a hidden key's NaN/inf reached" in m.splitlines()[0], m.splitlines()[0]
            assert "[clause sdpa.hidden_nonfinite]" in m.splitlines()[0]
            assert "the kernel read past cache_seqlens or outside the block table" in m


# -- FP8 and serving mutants -----------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FP8_DTYPES)
def test_fp8_kernel_control_and_forgotten_descale(folder, tmp_path, dtype):
    b = next(x for x in load(folder) if x.family == "sdpa_fp8" and x.manifest["dtype"] == dtype)
    verdicts, messages = {}, {}
    for name, backend in {
        "control": MF.control(),
        "forget_descale": MF.mutant_forget_descale(),
        "p_e4m3_claimed": MF.mutant_p_e4m3_claimed(),
        "p_e4m3": MF.mutant_p_e4m3(),
    }.items():
        run(backend, [b], tmp_path / name)
        results, verdicts[name] = _verify(b, tmp_path / name, name)
        messages[name] = [f["message"].splitlines()[0] for f in results["failures"]]
    half = len(b.cases) // 2
    assert verdicts["control"]["passed"] == half and verdicts["control"]["failed"] == 0
    assert verdicts["forget_descale"]["failed"] >= half // 2
    # verify names the bug as the suite does (`causes.fp8_causes`), not only the error's size
    assert any("left out (within the allowed error): a descale bug" in m for m in messages["forget_descale"])
    assert any("within the budget of P rounded to e4m3" in m for m in messages["p_e4m3"])
    # FA3's P rounding conforms on the cases of its claim, and fails those that claim float32
    assert verdicts["p_e4m3_claimed"]["passed"] == half and verdicts["p_e4m3_claimed"]["failed"] == 0
    assert verdicts["p_e4m3"]["failed"] >= 1


def test_serving_mutant_fails_and_its_control_passes(bundles, tmp_path):
    b = bundles["sdpa_serving"]
    run(M.control(), [b], tmp_path / "control")
    results, row = _verify(b, tmp_path / "control", "naive")
    assert not results["failures"] and row["passed"] == len(b.cases)
    run(MS.mutant_tile_edge_drops_last_key(), [b], tmp_path / "bug")
    results, row = _verify(b, tmp_path / "bug", "tile-edge")
    assert row["failed"] >= 1
    # the fixed kernel cases of 65, 129 and 257 keys, and decode caches of 129 and 257 keys
    assert "kernel_shapes" in {r["feature"] for r in results["rows"] if r["failed"]}


def test_cli_exports_the_new_families(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnspec",
            "vectors",
            "export",
            "--out",
            str(tmp_path),
            "--function",
            "sdpa_fp8",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "2 bundles, 144 cases" in proc.stdout
    got, _ = tensorfile.read(next((tmp_path / "sdpa_fp8-float8_e5m2").glob("*.safetensors")))
    assert got["q"].dtype.name in ("float8_e5m2", "float16", "bfloat16", "float32")
