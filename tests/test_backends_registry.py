"""The backend registry: laziness, availability, get/register, and its error messages."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import attnspec.backends as registry
from attnspec import SpecError
from attnspec.backends import Availability
from attnspec.backends.numpy import NumpyBackend

FRAMEWORKS = ("torch", "jax", "jaxlib", "array_api_strict", "array_api_compat", "cupy")
BUILTINS = (
    "numpy",
    "torch",
    "jax",
    "array_api-numpy",
    "array_api-strict",
    "array_api-torch",
    "array_api-cupy",
    "torch-native",
    "jax-native",
)


def test_import_names_and_available_import_no_framework():
    code = (
        "import sys, attnspec.backends as b\n"
        "b.names(); b.available()\n"
        f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", f"listing backends imported {done.stdout.strip()}"


def test_every_builtin_is_listed_and_its_availability_is_true():
    found = registry.available()
    assert list(found)[: len(BUILTINS)] == list(BUILTINS)
    assert registry.names()[: len(BUILTINS)] == list(BUILTINS)
    for name, needs in (
        ("torch", "torch"),
        ("jax", "jax"),
        ("array_api-strict", "array_api_strict"),
        ("array_api-cupy", "cupy"),
    ):
        installed = importlib.util.find_spec(needs) is not None
        assert found[name].installed is installed
        assert (needs in found[name].reason) is (not installed), found[name]
    assert found["numpy"] == Availability(True, "")


def test_get_unknown_name_names_it_and_the_known_ones():
    with pytest.raises(
        SpecError, match=r"backends\.get: unknown backend 'nope'; known backends: numpy, torch"
    ):
        registry.get("nope")


def test_get_unavailable_says_why(monkeypatch):
    monkeypatch.setitem(
        registry._BUILTINS,
        "fake-gpu",
        registry._Builtin("attnspec_no_such_module:X", ("attnspec_no_such_module",)),
    )
    assert registry.available()["fake-gpu"] == Availability(False, "not installed: attnspec_no_such_module")
    with pytest.raises(
        SpecError,
        match=r"backend 'fake-gpu' is not available: not installed: "
        r"attnspec_no_such_module; known backends: .*fake-gpu",
    ):
        registry.get("fake-gpu")


def test_register_a_factory_and_pass_options(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    seen = {}

    def factory(**options):
        seen.update(options)
        return NumpyBackend()

    registry.register("mine", factory)
    assert "mine" in registry.names() and registry.available()["mine"].installed
    assert isinstance(registry.get("mine", flavour="x"), NumpyBackend)
    assert seen == {"flavour": "x"}
    registry.register("by-string", "attnspec.backends.numpy:NumpyBackend")
    assert isinstance(registry.get("by-string"), NumpyBackend)


def test_register_refuses_taken_names_and_bad_factories(monkeypatch):
    monkeypatch.setattr(registry, "_registered", {})
    with pytest.raises(SpecError, match=r"backend 'numpy' is already registered"):
        registry.register("numpy", NumpyBackend)
    registry.register("numpy", NumpyBackend, replace=True)  # explicit override is allowed
    with pytest.raises(SpecError, match=r"factory for 'x' must be callable"):
        registry.register("x", 3)
    registry.register("not-a-backend", lambda: object())
    with pytest.raises(SpecError, match=r"returned object, not an attnspec\.backends\.Backend"):
        registry.get("not-a-backend")
