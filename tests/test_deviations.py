"""Declared deviations, checked both ways: each still shows on its native backend (else it is
stale), its reproducer still runs, and no conformant backend shows it."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import pytest

import attnspec.backends as registry
from attnspec.backends.compare import compare
from attnspec.backends.deviations import DEVIATIONS, run

INSTALLED = {n for n, a in registry.available().items() if a.installed and n not in registry.atlas_names()}
CONFORMANT = [n for n in registry._BUILTINS if n in INSTALLED and not n.endswith("-native")]
BACKENDS_DIR = Path(registry.__file__).parent
ids = [d.deviation_id for d in DEVIATIONS]


@functools.cache
def backend(name):
    return registry.get(name)


def _needs(name):
    if name not in INSTALLED:
        pytest.skip(f"{name} is not installed here")


def test_ids_are_unique_and_entries_complete():
    assert len(set(ids)) == len(ids)
    for d in DEVIATIONS:
        assert d.backend in registry._BUILTINS and d.backend.endswith("-native"), d.deviation_id
        assert all([d.feature, d.spec_says, d.native_does, d.reproducer, d.fixed_by]), d.deviation_id
        assert d.deviation_id.startswith(d.backend.removesuffix("-native") + ".")


@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_still_reproduces_on_its_native_backend(dev):
    _needs(dev.backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shows = dev.probe(backend(dev.backend))
    assert shows, (f"stale deviation {dev.deviation_id}: {dev.backend} no longer does "
                   f"'{dev.native_does}'; remove the entry, or update it")


@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_reproducer_runs_and_its_assert_holds(dev):
    _needs(dev.backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(dev.reproducer, f"<reproducer {dev.deviation_id}>", "exec"), {})


@pytest.mark.parametrize("name", CONFORMANT)
@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_no_conformant_backend_shows_it(dev, name):
    be = backend(name)
    q, k, v, options = case = dev.case()
    if reasons := be.supports("sdpa", dtype=q.dtype.name):
        pytest.skip("; ".join(reasons))
    assert not dev.probe(be)
    if dev.function == "mha":
        _assert_mha_matches_golden(be, case)
        return
    result = run(be, case)
    assert not isinstance(result, Exception), f"{name}: {result!r}"
    assert compare(result, q, k, v, **options) == []  # out, and lse when asked (return_lse)


@pytest.mark.parametrize("dev", DEVIATIONS, ids=ids)
def test_the_fix_up_names_the_deviation(dev):
    adapter = dev.fixed_by.split(":")[0]
    lines = (BACKENDS_DIR / f"{adapter}.py").read_text().splitlines()
    comments = [line.split("#", 1)[1] for line in lines if "#" in line]
    assert any(dev.deviation_id in c for c in comments), \
        f"no comment in backends/{adapter}.py names {dev.deviation_id} at its fix-up"


def _assert_mha_matches_golden(be, case):
    from attnspec.backends.deviations import run_mha
    from attnspec.spec.tolerance import compare as within
    from attnspec.spec.tolerance_mha import mha_golden

    query, key, value, options = case
    result = run_mha(be, case)
    assert not isinstance(result, Exception), f"{be.name}: {result!r}"
    out, weights = result if isinstance(result, tuple) else (result, None)
    g = mha_golden(query, key, value, **{k: v for k, v in options.items() if k != "return_weights"})
    assert within(out, g.out, g.allowed_out).ok
    if weights is not None:
        assert within(weights, g.weights, g.allowed_w).ok

