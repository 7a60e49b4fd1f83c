"""Paged KV caches (issue #27): the ``flash_kvcache_paged`` and ``vllm_paged`` conventions.

The paging itself (a shuffled pool, NaN wherever no key of a sequence lives, trap blocks behind
every unused table entry, block sizes 1, 5 and 16), a torch paged function written from
FlashAttention's and vLLM's documented semantics (``examples/paged/paged_attention.py``) that
conforms through both conventions, and three wrong ones that fail ``attnspec check`` with the
cause named.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from attnspec.backends.conventions.paged import BLOCK_SIZES, page, paging_for

torch = pytest.importorskip("torch")

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "paged" / "paged_attention.py"
sys.path.insert(0, str(EXAMPLE.parent))
import paged_attention as pa  # noqa: E402
from check_runs import check_all  # noqa: E402


# -- the paging ------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_paging_puts_each_key_once_and_nan_everywhere_else(seed):
    rng = np.random.default_rng(seed)
    B, m = int(rng.integers(1, 5)), int(rng.integers(0, 40))
    lengths = rng.integers(0, m + 1, B)
    x = rng.standard_normal((B, m, 2, 3)).astype(np.float32)
    paging = paging_for(lengths, m, seed)
    pool = page(x, paging)
    P, table = paging.block_size, paging.table
    assert P in BLOCK_SIZES and table.dtype == np.int32 and pool.shape == (paging.num_blocks, P, 2, 3)
    live = np.zeros(pool.shape[:2], bool)
    for b in range(B):
        used = -(-int(lengths[b]) // P)
        assert table.shape[1] > -(-m // P)  # at least one unused entry, always
        assert set(table[b, used:].tolist()) <= set(paging.traps)  # unused entries: traps, never -1
        for j in range(int(lengths[b])):
            np.testing.assert_array_equal(pool[table[b, j // P], j % P], x[b, j])
            live[table[b, j // P], j % P] = True
    assert np.isnan(pool[~live]).all()  # tails, unused blocks and traps
    assert all(np.isnan(pool[t]).all() for t in paging.traps) and len(paging.traps) >= 2


def test_every_block_size_is_drawn_and_the_pool_is_shuffled():
    sizes, in_order = set(), 0
    for seed in range(60):
        paging = paging_for(np.array([20, 7]), 20, seed)
        sizes.add(paging.block_size)
        in_order += paging.table[0, 0] == 0
    assert sizes == set(BLOCK_SIZES)
    assert in_order < 30  # the first key's block is rarely block 0


# -- the torch functions through the conventions, in process ---------------------------------------
def _cases():
    rng = np.random.default_rng(27)
    for t in range(8):
        B, hkv, g = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.choice([1, 2, 4]))
        n, m, dk, dv = int(rng.choice([1, 3, 7])), int(rng.integers(1, 40)), 8, int(rng.choice([8, 6]))
        q = rng.standard_normal((B, hkv * g, n, dk))
        k, v = rng.standard_normal((B, hkv, m, dk)), rng.standard_normal((B, hkv, m, dv))
        opts = {"causal": "lower_right_lengths", "kv_lengths": rng.integers(0, m + 1, B)}
        if t % 2:
            opts.update(window=(int(rng.integers(0, 5)), 0), softcap=4.0)
        yield q, k, v, opts


@pytest.mark.parametrize(
    "convention, fn", [("flash_kvcache_paged", pa.flash_style), ("vllm_paged", pa.vllm_style)]
)
def test_paged_functions_match_the_spec_through_every_block_size(convention, fn):
    from attnspec.backends import from_function
    from attnspec.spec import sdpa

    sizes = set()

    def recording(*args, **kwargs):
        sizes.add(args[1].shape[1])  # k_cache / key_cache (num_blocks, block_size, Hkv, d)
        return fn(*args, **kwargs)

    be = from_function(recording, convention=convention, dtypes=("float64",), name="paged")
    for q, k, v, opts in _cases():
        if convention == "vllm_paged":  # packed queries: q_lengths too, some rows with no key
            opts = {**opts, "q_lengths": np.minimum(opts["kv_lengths"] + 1, q.shape[-2])}
        got = be.sdpa(*(torch.tensor(x) for x in (q, k, v)), **opts)
        np.testing.assert_allclose(got.numpy(), sdpa(q, k, v, **opts), rtol=0, atol=1e-12)
        assert be.last_causes == []
    assert sizes == set(BLOCK_SIZES)


def test_refusals_name_the_convention():
    from attnspec.backends.conventions import CONVENTIONS, call_needs

    shapes = ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4))
    flash, vllm = CONVENTIONS["flash_kvcache_paged"], CONVENTIONS["vllm_paged"]
    lengths = {"causal": "lower_right_lengths", "kv_lengths": np.array([4])}
    assert flash.refusals(call_needs(*shapes, lengths)) == []
    assert vllm.refusals(call_needs(*shapes, {**lengths, "q_lengths": np.array([2])})) == []
    assert (
        "the flash_kvcache_paged convention has no query lengths (cache_seqlens are the keys')"
        in flash.refusals(call_needs(*shapes, {**lengths, "q_lengths": np.array([2])}))
    )
    assert "the vllm_paged convention has no mask argument" in vllm.refusals(
        call_needs(*shapes, {"mask": np.ones((3, 5), bool), "causal": "lower_right"})
    )
    assert vllm.refusals(call_needs(*shapes, {})) == [
        "the vllm_paged convention is always causal (lower-right on each sequence's lengths): a call "
        "without causal differs when n > 1"
    ]
    assert vllm.refusals(call_needs((1, 2, 1, 4), shapes[1], shapes[2], {})) == []  # decode: the same
    for conv in (flash, vllm):  # the padded anchor is not the lengths' one
        assert any(
            "i + sk - sq" in r
            for r in conv.refusals(
                call_needs(*shapes, {"causal": "lower_right", "kv_lengths": np.array([4])})
            )
        )


# -- attnspec check --------------------------------------------------------------------------------
#: run -> (the example's function, its convention): the two correct ones, then each one's three bugs
CONVENTION = {"flash": "flash_kvcache_paged", "vllm": "vllm_paged"}
RUNS = {
    **{style: (f"{style}_style", conv) for style, conv in CONVENTION.items()},
    **{
        f"{style}_{bug}": (f"{style}_{bug}", conv)
        for style, conv in CONVENTION.items()
        for bug in ("ignores_block_table", "reads_past_seqlens", "causal_on_padded")
    },
}


#: the wrong functions' runs are unshrunk (tests/suite_runs.py): every failure still judged and
#: swept, each reported as drawn, at about half the time; the causes named are the same
UNSHRUNK = {"ATTNSPEC_SHRINK": "0"}


@pytest.fixture(scope="module")
def paged_runs(tmp_path_factory):
    runs = {
        name: (f"{EXAMPLE}:{fn}", "--convention", conv, "--dtype", "float32")
        for name, (fn, conv) in RUNS.items()
    }
    envs = {name: UNSHRUNK for name in RUNS if name not in ("flash", "vllm")}
    return {
        name: proc
        for name, (proc, _) in check_all(tmp_path_factory.mktemp("check_paged"), runs, 4, envs).items()
    }


def _fail_lines(proc) -> list[str]:
    return [line for line in proc.stderr.splitlines() + proc.stdout.splitlines() if line.startswith("FAIL ")]


@pytest.mark.proof
@pytest.mark.parametrize("run", ["flash", "vllm"])
def test_correct_paged_function_conforms(paged_runs, run):
    proc = paged_runs[run]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CONFORMS: " in proc.stdout + proc.stderr


@pytest.mark.proof
@pytest.mark.parametrize(
    "run",
    [
        "flash_ignores_block_table",
        "flash_reads_past_seqlens",
        "vllm_ignores_block_table",
        "vllm_reads_past_seqlens",
    ],
)
def test_reading_outside_the_table_or_past_the_length_fails_with_the_nan_named(paged_runs, run):
    proc = paged_runs[run]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "FAILS: " in proc.stdout + proc.stderr
    named = [
        line
        for line in _fail_lines(proc)
        if "a hidden key's NaN/inf reached rows" in line
        and "through the paged cache" in line
        and "sdpa.hidden_nonfinite" in line
    ]
    assert named, _fail_lines(proc)


@pytest.mark.proof
@pytest.mark.parametrize("run", ["flash_causal_on_padded", "vllm_causal_on_padded"])
def test_causal_on_the_padded_cache_fails_on_a_causal_feature(paged_runs, run):
    proc = paged_runs[run]
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = _fail_lines(proc)
    assert any(
        "causal_lower_right" in line.partition("(")[0] and ("sdpa.empty_row" in line or "sdpa.causal" in line)
        for line in lines
    ), lines
    assert not any("a hidden key's NaN/inf" in line for line in lines)  # it reads nothing it should not
