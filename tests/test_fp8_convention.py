"""FP8 through `attnspec check` (#27 item 3): conventions that pass descales, on the worked example.

`examples/fp8/fp8_attention.py`'s ``fa3_style`` conforms on the FP8 property; each of its three
mutants fails with a cause that names the bug; the P-rounding one passes once its user claims
e4m3 P. The CLI runs as a user runs it (a subprocess, the ``dev`` profile, ``-k test_fp8``: the
FP8 property alone), five runs in two threads (about a minute each).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from check_runs import check_all

from attnspec.backends import from_function
from attnspec.backends.conventions import get_convention

ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "fp8" / "fp8_attention.py"
CONVENTION = f"{EXAMPLE}:FLASH3_FP8_F32"

RUNS = {
    "control": ("fa3_style", ()),
    "forget_descale": ("forget_descale", ()),
    "descale_twice": ("descale_twice", ()),
    "p_e4m3": ("p_e4m3", ()),
    "p_e4m3_claimed": ("p_e4m3", ("--fp8-p-precision", "float8_e4m3fn")),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    args = {
        name: (f"{EXAMPLE}:{fn}", "--convention", CONVENTION, "-k", "test_fp8", *extra)
        for name, (fn, extra) in RUNS.items()
    }
    return {
        name: proc
        for name, (proc, _) in check_all(tmp_path_factory.mktemp("fp8check"), args, cwd=ROOT).items()
    }


@pytest.mark.proof
@pytest.mark.parametrize("name", ["control", "p_e4m3_claimed"])
def test_conforms(runs, name):
    proc = runs[name]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CONFORMS (on the properties selected by -k 'test_fp8' only)" in proc.stderr
    # the FP8 property ran, and its cases count their sdpa needs too (gqa, windows, lse...)
    assert re.search(r"needs run \(\d+ of 28\), cases each: .*\bfp8 [1-9]", proc.stderr), proc.stderr[-2000:]
    assert "fp8_kv_cache" in proc.stderr.split("not expressible", 1)[1]  # FA3 takes an FP8 q


#: what each failing run's FAIL line must say
CAUSES = {
    "forget_descale": "golden with q_descale and k_descale left out of the softmax scale",
    "descale_twice": "golden with v_descale applied twice",
    "p_e4m3": "within the budget of P rounded to e4m3",
}


@pytest.mark.proof
@pytest.mark.parametrize("name", sorted(CAUSES))
def test_mutant_fails_naming_its_bug(runs, name):
    proc = runs[name]
    assert proc.returncode == 1, proc.stderr[-3000:]
    fails = [line for line in proc.stderr.splitlines() if line.startswith("FAIL sdpa_fp8:")]
    assert fails and CAUSES[name] in fails[0], proc.stderr[-3000:]
    assert "\nFAILS: " in proc.stderr


@pytest.fixture(autouse=True)
def _example_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))


def test_refusals_and_claims():
    import fp8_attention as ex

    plain = from_function(ex.fa3_style, "flash")
    assert "sdpa_fp8" not in plain.implements
    why = plain.supports(
        "sdpa_fp8", dtype="float8_e4m3fn", q_shape=(1, 2, 3, 4), k_shape=(1, 2, 3, 4), v_shape=(1, 2, 3, 4)
    )
    assert why and "passes no descales" in why[0]
    fa3 = from_function(ex.fa3_style, "flash3_fp8+p_e4m3")
    assert "sdpa_fp8" in fa3.implements and fa3.fp8_p_precision == "float8_e4m3fn"
    assert fa3.fp8_dtypes == ("float8_e4m3fn",)
    # a float32 out is not expressible through FA3's bfloat16-only output
    why = fa3.supports(
        "sdpa_fp8",
        dtype="float8_e4m3fn",
        q_shape=(1, 2, 3, 4),
        k_shape=(1, 2, 3, 4),
        v_shape=(1, 2, 3, 4),
        q_dtype="float8_e4m3fn",
        out_dtype="float32",
        q_descale=1.0,
    )
    assert any("returns bfloat16 for FP8 inputs" in w for w in why)
    with pytest.raises(Exception, match="descales="):
        get_convention("flash").extend("bad", descales="q")


def test_paged_fp8_kv_cache_with_descales():
    """flash_kvcache_paged_fp8: FP8 q and pools reach the function paged, descales (B, Hkv)."""
    import ml_dtypes
    import torch

    seen = {}

    def paged(
        q,
        k_cache,
        v_cache,
        cache_seqlens=None,
        block_table=None,
        softmax_scale=None,
        causal=False,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        **kw,
    ):
        seen.update(q=q.dtype, k=k_cache.dtype, qd=tuple(q_descale.shape), table=block_table.dtype)
        B, W = block_table.shape
        size = k_cache.shape[1]
        k = k_cache[block_table.long()].reshape(B, W * size, *k_cache.shape[2:])  # (B, W*size, Hkv, d)
        v = v_cache[block_table.long()].reshape(B, W * size, *v_cache.shape[2:])
        out = []
        for b in range(B):
            L = int(cache_seqlens[b])
            out.append(
                fp8_attention_reference(
                    q[b : b + 1],
                    k[b : b + 1, :L],
                    v[b : b + 1, :L],
                    softmax_scale,
                    causal,
                    q_descale[b : b + 1],
                    k_descale[b : b + 1],
                    v_descale[b : b + 1],
                )
            )
        return torch.cat(out)

    def fp8_attention_reference(*args):
        import fp8_attention as ex

        return ex.fa3_style(*args)

    b = from_function(paged, "flash_kvcache_paged_fp8")
    rng = np.random.default_rng(0)
    e4 = ml_dtypes.float8_e4m3fn
    q, k, v = (rng.standard_normal(s).astype(e4) for s in ((2, 2, 1, 8), (2, 1, 9, 8), (2, 1, 9, 8)))
    d = np.array([[0.5], [3.0]], np.float32)  # (B, Hkv)
    lengths = np.array([9, 4])
    out = b.sdpa_fp8(
        b.asarray(q),
        b.asarray(k),
        b.asarray(v),
        q_descale=b.asarray(d),
        k_descale=b.asarray(d),
        v_descale=b.asarray(d),
        kv_lengths=b.asarray(lengths),
        causal="lower_right_lengths",
    )
    assert seen == {"q": torch.float8_e4m3fn, "k": torch.float8_e4m3fn, "qd": (2, 1), "table": torch.int32}
    from attnspec.spec.tolerance_fp8 import fp8_golden

    g = fp8_golden(
        q, k, v, q_descale=d, k_descale=d, v_descale=d, kv_lengths=lengths, causal="lower_right_lengths"
    )
    err = np.abs(b.to_numpy(out).astype(np.float64) - g.out).max()
    assert err <= g.allowed_out, (err, g.allowed_out)
