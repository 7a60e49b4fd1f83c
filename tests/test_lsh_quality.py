"""The LSH study: its dense reference is the spec's LSH in the exact regime, and its JSON renders."""

import numpy as np

from attnspec.bench import lsh_quality
from attnspec.reports._io import load_results
from attnspec.spec import lsh_attention, lsh_rotations


def test_dense_reference_equals_lsh_when_every_key_is_in_the_window():
    # one round and L = 2C: each chunk sees itself and the other chunk, i.e. every key
    rng = np.random.default_rng(0)
    x, v = rng.standard_normal((16, 8)), rng.standard_normal((16, 3))
    out = lsh_attention(x, v, rotations=lsh_rotations(0, 8, 1, 4), chunk_length=8)
    np.testing.assert_allclose(out, lsh_quality.full_shared_qk(x, v), rtol=0, atol=1e-12)


def test_study_writes_a_renderable_file(tmp_path, monkeypatch):
    monkeypatch.setattr(lsh_quality, "L", 256)
    path = tmp_path / "lsh-quality.json"
    assert lsh_quality.main(["--out", str(path), "--seeds", "1"]) == 0
    loaded = load_results(tmp_path)
    rows = loaded.lsh_quality[0]["rows"]
    assert {r["n_hashes"] for r in rows} == {1, 2, 4, 8}
    assert all(np.isfinite(r["rel_err"]) and r["rel_err"] >= 0 for r in rows)
