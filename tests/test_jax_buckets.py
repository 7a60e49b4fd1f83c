"""The jax backend's length buckets (`attnspec.backends.jax`, issue #16).

On CPU the adapter pads q's and k's lengths up to a bucket and hides the padding through the
lengths, so one compiled program serves every length in the bucket. These tests check that the
padding changes no answer (against the same adapter with buckets off, and against the golden
through the suite), that it really saves compiles, and that the suite catches padding that leaks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from jax import monitoring  # noqa: E402
from suite_runs import run_all  # noqa: E402

from attnspec.backends.jax import JaxBackend, bucket  # noqa: E402


@pytest.fixture(scope="module")
def pair():
    return JaxBackend(), JaxBackend(length_buckets=False)


def test_bucket_sizes():
    assert [bucket(s) for s in (0, 1, 7, 8, 9, 16, 17, 24, 33, 1000, 1024)] == [
        8,
        8,
        8,
        8,
        16,
        16,
        32,
        32,
        64,
        1024,
        1024,
    ]


def _same(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Equal shapes, NaN and inf in the same places, finite values within float32 rounding of a
    reordered sum (the padded reductions add exact zeros, but XLA may split them differently)."""
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    assert a.shape == b.shape, what
    assert np.array_equal(np.isnan(a), np.isnan(b)) and np.array_equal(np.isinf(a), np.isinf(b)), what
    finite = np.isfinite(a)
    np.testing.assert_allclose(a[finite], b[finite], rtol=1e-5, atol=1e-5, err_msg=what)


def _call(be, dtype, q, k, v, d_out, **options):
    arrays = {
        name: be.asarray(x, dtype if x.dtype.kind == "f" else None)
        for name, x in options.items()
        if isinstance(x, np.ndarray)
    }
    kw = {**options, **arrays}
    args = [be.asarray(x, dtype) for x in (q, k, v)]
    forward = be.sdpa(*args, **kw, return_weights=True, return_lse="sinks" not in kw)
    grads = be.sdpa_vjp(*args, be.asarray(d_out, dtype), **kw)
    return [*forward, *grads]


PLAIN = [
    dict(),
    dict(causal="upper_left"),
    dict(causal="lower_right"),
    dict(window=(2, 1)),
    dict(mask=True),
    dict(bias=True),
    dict(lengths=True),
    dict(poison=True),
]
VARIANTS = [
    dict(softcap=2.0),
    dict(alibi=True),
    dict(sinks=True),
    dict(causal="lower_right_lengths"),
    dict(dropout=True),
    dict(segments=True),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("n,m", [(1, 2), (13, 24), (5, 16)])  # n = 1; both padded; m already a bucket
@pytest.mark.parametrize("how", range(len(PLAIN) + len(VARIANTS)))
def test_buckets_change_no_answer(pair, dtype, n, m, how):
    """Output, weights, lse and every gradient, with buckets and without, on every route."""
    case = (PLAIN + VARIANTS)[how]
    rng = np.random.default_rng(how * 100 + n * 10 + m)
    q, k, v = (rng.standard_normal((2, 2, size, 4)) for size in (n, m, m))
    d_out = rng.standard_normal((2, 2, n, 4))
    o: dict = {name: case[name] for name in ("causal", "window", "softcap") if name in case}
    if case.get("mask"):
        o["mask"] = rng.random((n, m)) > 0.3
    if case.get("bias"):
        bias = rng.standard_normal((2, 1, n, m))
        bias[..., 0] = -np.inf  # the first key is absent from every row
        o["bias"] = bias
    if case.get("lengths") or case.get("causal") == "lower_right_lengths":
        o["q_lengths"], o["kv_lengths"] = np.array([n, max(n - 1, 1)]), np.array([max(m - 1, 1), m])
    if case.get("poison"):  # NaN in a key no row sees: the route that drops hidden keys
        o["kv_lengths"] = np.array([m - 1, m])
        k[0, 0, m - 1, 0] = np.nan
    if case.get("alibi"):
        o["alibi_slopes"] = np.array([0.5, 0.25])
    if case.get("sinks"):
        o["sinks"] = np.array([0.3, -1.0])
    if case.get("dropout"):
        o["dropout_mask"], o["dropout_p"] = rng.random((2, 2, n, m)) > 0.2, 0.2
    if case.get("segments"):
        o["q_segment_ids"] = np.sort(rng.integers(0, 2, (2, n)), axis=-1)
        o["kv_segment_ids"] = np.sort(rng.integers(0, 2, (2, m)), axis=-1)
    bucketed, plain = (_call(be, dtype, q, k, v, d_out, **o) for be in pair)
    assert len(bucketed) == len(plain)
    for i, (a, b) in enumerate(zip(bucketed, plain)):
        _same(a, b, f"{case} result {i}")


def _traces(function: str):
    """A Counter of jitted functions traced (one trace per compiled shape) while it is open."""
    seen: Counter = Counter()

    def listen(event, duration, **kw):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            seen[kw.get("fun_name", "?")] += 1

    monitoring.register_event_duration_secs_listener(listen)
    return seen, listen


@pytest.mark.parametrize("function", ["sdpa", "sdpa_vjp"])
def test_one_program_serves_a_bucket(function):
    """Nine lengths in the (16, 32) bucket: one trace of the fused program (or the whole vjp)
    with buckets, nine without. A count, not a timing, so it cannot flake."""
    target = {"sdpa": "_fused", "sdpa_vjp": "_vjp_on_route"}[function]
    counts = {}
    for buckets in (True, False):
        be = JaxBackend(length_buckets=buckets)
        seen, listen = _traces(function)
        try:
            rng = np.random.default_rng(7)
            for n, m in itertools.product((9, 13, 15), (17, 20, 27)):
                # head dim 12 and 3 heads: shapes no other test compiles, so nothing is cached yet
                q, k, v = (be.asarray(rng.standard_normal((3, size, 12)), "float32") for size in (n, m, m))
                if function == "sdpa":
                    be.sdpa(q, k, v, causal="upper_left")
                else:
                    be.sdpa_vjp(
                        q, k, v, be.asarray(rng.standard_normal((3, n, 12)), "float32"), causal="upper_left"
                    )
        finally:
            monitoring.unregister_event_duration_listener(listen)
        counts[buckets] = seen[target]
    assert counts == {True: 1, False: 9}, counts


class LeakyPadding(JaxBackend):
    """A mutant: the padded keys are left visible (the padded plan forgets the kv lengths)."""

    name = "jax-leaky-padding"

    def _buckets(self, p, *arrays):
        padded = super()._buckets(p, *arrays)
        if padded is None or p.kv_lengths is not None:
            return padded
        return dataclasses.replace(padded, kv_lengths=None)


@pytest.mark.proof
def test_suite_catches_leaky_padding(tmp_path):
    """The padding is the backend's own code, so the suite must see it leak: the mutant fails
    sdpa's golden comparison and the unchanged adapter, the control, passes the same run."""
    runs = run_all(
        tmp_path,
        {
            "mutant": ("test_jax_buckets:LeakyPadding", "test_sdpa and matches_golden"),
            "control": ("jax", "test_sdpa and matches_golden"),
        },
        shrink=False,
    )
    mutant, path = runs["mutant"]
    assert mutant.returncode == 1, mutant.stdout[-2000:]
    rows = json.loads(path.read_text())["rows"]
    assert sum(r["failed"] for r in rows) > 0
    control, path = runs["control"]
    assert control.returncode == 0, control.stdout[-2000:]
    assert sum(r["passed"] for r in json.loads(path.read_text())["rows"]) > 20
