"""Third-party backends through the entry-point group ``attnspec.backends``.

The example plugin is tested when it is installed (``pip install -e
examples/attnspec-example-plugin``; the nox ``tests`` session does it). Broken plugins are
simulated by replacing the registry's view of the installed entry points.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata

import numpy as np
import pytest

import attnspec.backends as registry
from attnspec import SpecError
from attnspec.backends import Availability
from attnspec.backends.base import spec_signature_mismatches
from attnspec.backends.compare import compare
from attnspec.spec.bad_inputs import SDPA_BAD_INPUTS

GROUP = registry.ENTRY_POINT_GROUP
example_installed = importlib.util.find_spec("attnspec_example_plugin") is not None and any(
    ep.name == "example" for ep in metadata.entry_points(group=GROUP)
)


@pytest.mark.skipif(
    not example_installed,
    reason="the example plugin is not installed: pip install -e examples/attnspec-example-plugin",
)
def test_example_plugin_is_found_and_conforms():
    assert registry.available()["example"] == Availability(True, "")
    be = registry.get("example")
    assert be.name == "example" and spec_signature_mismatches(be) == []
    r = np.random.default_rng(0)
    q, k, v = (
        r.standard_normal((2, 4, 5, 8)),
        r.standard_normal((2, 2, 7, 8)),
        r.standard_normal((2, 2, 7, 3)),
    )
    v[..., 6, 0] = np.nan  # hidden by the lengths below
    options = {"mask": r.random((5, 7)) < 0.7, "causal": "lower_right", "kv_lengths": np.array([6, 3])}
    result = be.sdpa(q, k, v, return_weights=True, **options)
    assert compare(result, q, k, v, return_weights=True, **options) == []
    for case in SDPA_BAD_INPUTS:
        (bq, bk, bv), opts = case.build()
        with pytest.raises(SpecError, match=case.match):
            be.sdpa(bq, bk, bv, **opts)


@pytest.mark.skipif(
    not example_installed,
    reason="the example plugin is not installed: pip install -e examples/attnspec-example-plugin",
)
def test_example_plugin_variants_match_the_spec_and_alibi_is_refused():
    from attnspec import spec
    from attnspec.backends import Unsupported

    be = registry.get("example")
    r = np.random.default_rng(1)
    q, k, v = (
        r.standard_normal((2, 4, 5, 8)),
        r.standard_normal((2, 2, 7, 8)),
        r.standard_normal((2, 2, 7, 3)),
    )
    options = dict(
        softcap=2.0,
        sinks=r.standard_normal(4),
        causal="lower_right_lengths",
        kv_lengths=np.array([6, 3]),
        q_segment_ids=spec.segment_ids_from_cu_seqlens([0, 2, 5], 5),
        kv_segment_ids=spec.segment_ids_from_cu_seqlens([0, 3, 6], 7),
        dropout_mask=r.random((5, 7)) < 0.8,
        dropout_p=0.2,
        return_weights=True,
        return_lse=True,
    )
    got, want = be.sdpa(q, k, v, **options), spec.sdpa(q, k, v, **options)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    assert "alibi" not in be.variants and be.supports("sdpa", alibi_slopes=np.ones(4))
    with pytest.raises(Unsupported, match="alibi"):
        be.sdpa(q, k, v, alibi_slopes=np.ones(4))


def _fake_entry_points(*extra: metadata.EntryPoint):
    real = list(metadata.entry_points(group=GROUP))

    def entry_points(**selection):
        assert selection == {"group": GROUP}
        return [*real, *extra]

    return entry_points


def test_broken_plugins_are_unavailable_with_their_error_and_break_nothing(monkeypatch, tmp_path):
    (tmp_path / "attnspec_boom_plugin.py").write_text('raise RuntimeError("boom at import")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        metadata,
        "entry_points",
        _fake_entry_points(
            metadata.EntryPoint("missing", "attnspec_no_such_plugin:Backend", GROUP),
            metadata.EntryPoint("boom", "attnspec_boom_plugin:Backend", GROUP),
            metadata.EntryPoint("fine", "attnspec.backends.numpy:NumpyBackend", GROUP),
        ),
    )
    found = registry.available()
    assert not found["missing"].installed
    assert (
        "ModuleNotFoundError" in found["missing"].reason
        and "attnspec_no_such_plugin" in found["missing"].reason
    )
    assert found["boom"] == Availability(
        False,
        "plugin entry point 'attnspec_boom_plugin:Backend' failed to load: RuntimeError: boom at import",
    )
    assert found["fine"].installed and found["numpy"].installed
    assert {"missing", "boom", "fine"} <= set(registry.names())
    with pytest.raises(
        SpecError,
        match=r"backend 'boom' is not available: .*RuntimeError: boom at import; "
        r"known backends: .*boom",
    ):
        registry.get("boom")
    with pytest.raises(SpecError, match=r"backend 'missing' is not available: .*ModuleNotFoundError"):
        registry.get("missing")
    assert registry.get("fine").name == "numpy" and registry.get("numpy").name == "numpy"


def test_a_plugin_cannot_shadow_a_builtin(monkeypatch):
    monkeypatch.setattr(
        metadata,
        "entry_points",
        _fake_entry_points(metadata.EntryPoint("numpy", "attnspec_no_such_plugin:Backend", GROUP)),
    )
    assert registry.available()["numpy"] == Availability(True, "")
    assert registry.names().count("numpy") == 1
    assert registry.get("numpy").name == "numpy"
