"""Every available backend's lsh_attention against the spec in float64, and its memory bound.

Outputs are judged with the conformance suite's LSH tolerance (`attnspec.conformance.lsh_cases`);
the inputs are drawn so that no position has a low bucket margin, which the test asserts, so
the buckets must match exactly and no batch element is left out.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import attnspec.backends as registry
from attnspec import SpecError
from attnspec.backends import _lsh_xp
from attnspec.conformance import lsh_cases as lc
from attnspec.spec.lsh import lsh_rotations, validate_lsh
from attnspec.spec.validate import numpy_info

BACKENDS = [
    n
    for n in ("numpy", "torch", "jax", "array_api-numpy", "array_api-strict", "array_api-torch")
    if registry.available()[n].installed
]

# (batch, L, d, dv, n_hashes, n_buckets, C, causal, kv_lengths, dedup, scale)
CASES = {
    "plain": ((2,), 32, 8, 8, 2, 4, 8, False, None, False, None),
    "causal": ((2, 2), 24, 8, 4, 2, 6, 4, True, None, False, None),
    "kv_lengths": ((3,), 16, 4, 4, 3, 4, 4, False, np.array([16, 9, 0]), False, None),
    "dedup": ((2,), 20, 8, 8, 3, 4, 4, False, None, True, 2.0),
    "ragged": ((2,), 27, 8, 8, 2, 8, 8, False, None, False, None),
    "one_hash": ((), 16, 8, 8, 1, 4, 4, True, None, False, None),
    "four_hashes": ((2,), 16, 16, 8, 4, 8, 4, False, np.array([11, 16]), True, 0.5),
    "everything": ((2, 1), 29, 8, 5, 3, 6, 8, True, np.array([[29], [13]]), True, 2.0),
}


def _case(name: str) -> lc.LSHCase:
    batch, L, d, dv, nh, nb, C, causal, kv, dedup, scale = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    opts = {"chunk_length": C, "causal": causal, "dedup": dedup, "scale": scale}
    if kv is not None:
        opts["kv_lengths"] = kv
    return lc.LSHCase(
        name,
        "float64",
        rng.standard_normal((*batch, L, d)),
        rng.standard_normal((*batch, L, dv)),
        lsh_rotations(3, d, nh, nb),
        opts,
    )


@pytest.mark.parametrize("case_name", sorted(CASES))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_matches_spec_float64(backend_name, case_name):
    be = registry.get(backend_name)
    case = _case(case_name)
    assert not lc.margins(case).low.any()  # so every bucket and every batch element is compared
    g_out, g_buckets = lc.golden(case)
    conv = {k: be.asarray(v) if isinstance(v, np.ndarray) else v for k, v in case.options.items()}
    out, buckets = be.lsh_attention(
        be.asarray(case.x),
        be.asarray(case.v),
        rotations=be.asarray(case.rotations),
        return_buckets=True,
        **conv,
    )
    assert be.dtype_name(out) == "float64" and be.dtype_name(buckets) == "int64"
    np.testing.assert_array_equal(be.to_numpy(buckets), g_buckets)
    allowed = lc.allowed(case, g_out, g_buckets)
    err = np.abs(be.to_numpy(out) - g_out).max()
    assert err <= allowed, f"{backend_name} {case_name}: max err {err:.3e} > allowed {allowed:.3e}"


@pytest.mark.parametrize("rows", ["one_chunk", "chunk_and_a_half"])
@pytest.mark.parametrize("case_name", ["ragged", "everything", "kv_lengths"])
@pytest.mark.parametrize("backend_name", [b for b in BACKENDS if b != "numpy"])  # numpy: the spec itself
def test_hashing_in_blocks_of_rows_changes_nothing(backend_name, case_name, rows, monkeypatch):
    """`_lsh_xp` hashes HASH_BLOCK_ELEMENTS at a time; blocks of C rows, or of 1.5 C (the last block
    short), still give the spec's buckets and output."""
    batch, _, _, _, nh, nb, C, *_ = CASES[case_name]
    per_row = int(np.prod(batch)) * nh * (nb // 2)
    monkeypatch.setattr(_lsh_xp, "HASH_BLOCK_ELEMENTS", per_row * (C if rows == "one_chunk" else C + C // 2))
    _matches_spec_recompiled(backend_name, case_name)


def _matches_spec_recompiled(backend_name: str, case_name: str) -> None:
    """`test_matches_spec_float64` with a patched block size; jax drops the functions it compiled
    with the default sizes, before and after, so the patch is traced in and then traced out."""
    jax = pytest.importorskip("jax") if backend_name == "jax" else None
    if jax:
        jax.clear_caches()
    try:
        test_matches_spec_float64(backend_name, case_name)
    finally:
        if jax:
            jax.clear_caches()


@pytest.mark.parametrize("chunks", [1, 3])
@pytest.mark.parametrize("case_name", ["ragged", "everything", "kv_lengths", "dedup", "four_hashes"])
@pytest.mark.parametrize("backend_name", [b for b in BACKENDS if b != "numpy"])  # numpy: the spec itself
def test_attending_in_blocks_of_chunks_changes_nothing(backend_name, case_name, chunks, monkeypatch):
    """`_lsh_xp` attends ATTEND_BLOCK_ELEMENTS of logits at a time; blocks of one chunk, or of 3
    (which do not divide the chunk count, so the last block is short), still give the spec's output."""
    batch, _, _, _, _, _, C, *_ = CASES[case_name]
    monkeypatch.setattr(_lsh_xp, "ATTEND_BLOCK_ELEMENTS", int(np.prod(batch)) * C * 2 * C * chunks)
    monkeypatch.setattr(_lsh_xp, "MAX_ATTEND_BLOCKS", 10**9)
    _matches_spec_recompiled(backend_name, case_name)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_float32_hash_uses_the_given_rotations(backend_name):
    """float32 inputs hash in float32 with the given rotations: buckets equal the spec's away
    from low margins, and changing the rotations changes them."""
    be = registry.get(backend_name)
    rng = np.random.default_rng(7)
    x, v = (
        rng.standard_normal((2, 64, 16)).astype(np.float32),
        rng.standard_normal((2, 64, 8)).astype(np.float32),
    )
    case = lc.LSHCase("plain", "float32", x, v, lsh_rotations(5, 16, 2, 8), {"chunk_length": 8})
    low = lc.margins(case).low
    _, g = lc.golden(case)
    _, got = be.lsh_attention(
        be.asarray(x),
        be.asarray(v),
        rotations=be.asarray(case.rotations),
        chunk_length=8,
        return_buckets=True,
    )
    got = be.to_numpy(got)
    assert (got == g)[~low].all() and low.sum() < low.size // 10
    _, other = be.lsh_attention(
        be.asarray(x),
        be.asarray(v),
        rotations=be.asarray(lsh_rotations(6, 16, 2, 8)),
        chunk_length=8,
        return_buckets=True,
    )
    assert (be.to_numpy(other) != got).any()


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_spec_errors_name_the_backend_function(backend_name):
    be = registry.get(backend_name)
    x = be.asarray(np.zeros((8, 4), np.float32))
    with pytest.raises(
        SpecError, match=rf"^{backend_name}\.lsh_attention: n_hashes \* ceil\(L / chunk_length\)"
    ):
        be.lsh_attention(x, x, rotations=be.asarray(np.zeros((4, 1, 2), np.float32)), chunk_length=8)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_empty_inputs(backend_name):
    be = registry.get(backend_name)
    rot = be.asarray(lsh_rotations(0, 4, 2, 4))
    for xs, vs in (((2, 0, 4), (2, 0, 3)), ((0, 8, 4), (0, 8, 3))):
        x, v = be.asarray(np.zeros(xs)), be.asarray(np.zeros(vs))
        out, buckets = be.lsh_attention(x, v, rotations=rot, chunk_length=4, return_buckets=True)
        assert tuple(out.shape) == vs and tuple(buckets.shape) == (xs[0], 2, xs[1])


class _Recording:
    """An array namespace that forwards to ``xp`` and records the size of every array it returns."""

    def __init__(self, xp):
        self._xp, self.largest = xp, (0, None)

    def __getattr__(self, name):
        attr = getattr(self._xp, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def wrapped(*args, **kwargs):
            result = attr(*args, **kwargs)
            for r in result if isinstance(result, tuple) else (result,):
                shape = getattr(r, "shape", None)
                size = None if shape is None else math.prod(shape)
                if size is not None and size > self.largest[0]:
                    self.largest = (int(size), name)
            return result

        return wrapped


@pytest.mark.parametrize("namespace", ["array_api_compat.numpy", "array_api_compat.torch"])
def test_memory_is_linear_in_L(namespace):
    """No array the implementation creates exceeds B * nh * Lp * 2 * max(C, d, dv) elements: the
    gathered (n_chunks, C, 2C) logits and (n_chunks, 2C, d) keys. At L = 4096 that is 1/16 of L^2."""
    import importlib

    xp = (
        importlib.import_module(namespace)
        if namespace != "array_api_compat.torch"
        else pytest.importorskip(namespace)
    )
    B, L, d, dv, nh, C = 1, 4096, 32, 32, 2, 64
    rng = np.random.default_rng(0)
    x, v = (
        rng.standard_normal((B, L, d)).astype(np.float32),
        rng.standard_normal((B, L, dv)).astype(np.float32),
    )
    rot = lsh_rotations(0, d, nh, 64)
    for dedup in (False, True):
        p = validate_lsh(
            "t",
            numpy_info("t", "x", x),
            numpy_info("t", "v", v),
            numpy_info("t", "r", rot),
            chunk_length=C,
            dedup=dedup,
            causal=True,
        )
        rec = _Recording(xp)
        out, _ = _lsh_xp.lsh_attention(
            rec, p, xp.asarray(x), xp.asarray(v), xp.asarray(rot), None, nonfinite_v=True
        )
        bound = B * nh * L * 2 * max(C, d, dv)
        assert 0 < rec.largest[0] <= bound, rec.largest
        assert bound * 16 <= L * L
        assert tuple(out.shape) == (B, L, dv)  # values: test_matches_spec_float64 and the suite


def test_torch_extra_installs_what_torch_lsh_imports():
    """The torch backend's lsh_attention runs on array_api_compat.torch, so `attnspec[torch]` must
    bring array-api-compat (a torch-only environment once failed every LSH case with
    ModuleNotFoundError, which the dev venv with every extra had hidden)."""
    from pathlib import Path

    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert any(req.startswith("array-api-compat") for req in extras["torch"]), extras["torch"]


def test_torch_lsh_without_array_api_compat_is_unsupported_with_a_reason(monkeypatch):
    pytest.importorskip("torch")
    import importlib.util

    be = registry.get("torch")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "array_api_compat" else real(name, *a)
    )
    for feature in ("lsh_attention", "lsh_attention_vjp"):
        reasons = be.supports(feature)
        assert any("array-api-compat" in r and "attnspec[torch]" in r for r in reasons), reasons
    assert be.supports("sdpa") == []
