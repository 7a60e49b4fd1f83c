"""The mask-only finite floor (conformance/corners.py, ``corner_finite_floor_mask_only``): its
levels are decided by the tolerance rule, its logits are exact, and a mask-only function that fills
masked logits with -1e4 or -1e6 fails it in float32, named by the finite-fill cause, while a
correct one passes (`attnspec check`, the ``tutorial`` convention on NumPy arrays)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from check_runs import check_all, results_of

from attnspec.backends.compare import sdpa_golden
from attnspec.conformance.corners import (
    _FLOOR_ROWS,
    MASK_ONLY,
    corner_case,
    mask_only_floor,
    mask_only_floor_levels,
)

HERE = Path(__file__).parent


def test_levels_are_those_the_tolerance_resolves():
    """float32 keeps the levels that catch -1e4 and -1e6 fills, float64 -1e9's too; in float16 and
    bfloat16 the allowed error at -2**14 already exceeds any leak, so they keep none."""
    assert mask_only_floor_levels("float32") == (-(2.0**14), -(2.0**20))
    assert mask_only_floor_levels("float64") == (-(2.0**14), -(2.0**20), -(2.0**30))
    assert mask_only_floor_levels("float16") == mask_only_floor_levels("bfloat16") == ()
    # the next level of float32 would hide every leak: allowed grows past the largest (2)
    q, k, v, options = mask_only_floor("float32", (-(2.0**14), -(2.0**20), -(2.0**30)))
    assert sdpa_golden(q, k, v, **options).allowed_out > 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_the_twin_is_a_valid_case_with_exact_floor_logits(dtype):
    """Floor rows' logits, computed in the dtype, are exactly their level; the keys hidden from
    them have k[0] = 0 (logit F under a fill F, replaced or added); the tag says whether the case
    holds floor rows."""
    assert "corner_finite_floor_mask_only" in MASK_ONLY
    case = corner_case("corner_finite_floor_mask_only", dtype)
    levels = mask_only_floor_levels(dtype)
    assert ("finite_floor" in case.tags) == bool(levels)
    assert "bias" not in case.options
    if not levels:
        return
    s = (case.q @ np.swapaxes(case.k, -1, -2)) * case.q.dtype.type(0.5)  # (B, H, n, m), in the dtype
    j = np.arange(case.k.shape[-2])
    vis = case.options["mask"] & (j < case.options["kv_lengths"][:, None, None, None])  # (B, 1, n, m)
    for i, r in enumerate(_FLOOR_ROWS):
        level = levels[i % len(levels)]
        row_vis = np.broadcast_to(vis[:, :, r], s[..., r, :].shape)
        assert (s[..., r, :][row_vis] == level).all()
        assert (case.k[..., 0][np.broadcast_to(~vis[:, :, r], case.k.shape[:-1])] == 0).all()


SUBJECTS = ("correct", "fill_minus_1e4", "fill_minus_1e6")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    args = ("--convention", "tutorial", "--arrays", "numpy", "--dtype", "float32", "-k", "matches_golden")
    runs = {name: (f"check_subjects_floor.py:{name}", *args) for name in SUBJECTS}
    done = check_all(tmp_path_factory.mktemp("floor"), runs, workers=3, timeout=600)
    return {name: (proc, results_of(out)) for name, (proc, out) in done.items()}


def _floor_rows(results):
    return [
        r
        for r in results["rows"]
        if r["feature"] == "corner_finite_floor_mask_only" and r["function"] == "sdpa"
    ]


@pytest.mark.proof
def test_a_correct_mask_only_function_passes_the_floor(runs):
    proc, results = runs["correct"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _floor_rows(results)
    assert len(rows) == 1 and rows[0]["passed"] == rows[0]["run"] == 1, rows


@pytest.mark.proof
@pytest.mark.parametrize("name, fill", [("fill_minus_1e4", "-1e4"), ("fill_minus_1e6", "-1e6")])
def test_a_finite_fill_fails_the_floor_named_by_its_fill(runs, name, fill):
    proc, results = runs[name]
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert [(r["dtype"], r["failed"]) for r in _floor_rows(results)] == [("float32", 1)], _floor_rows(results)
    (failure,) = [f for f in results["failures"] if f["feature"] == "corner_finite_floor_mask_only"]
    assert failure["cause"].startswith(
        f"hidden keys took weight there, as under a finite mask fill of {fill} replacing or added to their logits"
    ), failure["cause"]
