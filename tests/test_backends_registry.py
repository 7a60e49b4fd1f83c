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


def test_a_reproducer_run_from_the_checks_folder_finds_its_module(tmp_path):
    """`attnspec check mine:Mine` finds mine.py in the current folder; the reproducers it writes
    (attnspec-report/repro/*.py, run from that folder) must find it too, although Python puts the
    script's own folder on sys.path, not the current one. An installed module still wins."""
    (tmp_path / "mine_backend.py").write_text(
        "from attnspec.backends.numpy import NumpyBackend\n\nclass Mine(NumpyBackend):\n    name = 'mine'\n"
    )
    (tmp_path / "colorsys.py").write_text(
        "raise SystemExit('the current folder shadowed an installed module')\n"
    )
    repro = tmp_path / "attnspec-report" / "repro" / "01.py"
    repro.parent.mkdir(parents=True)
    repro.write_text(
        "from attnspec.conformance.pytest_helpers import resolve_backend\n"
        "name = resolve_backend('mine_backend:Mine').name\n"
        "import colorsys\n"
        "print(name, colorsys.__name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(repro.relative_to(tmp_path))],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.split() == ["mine", "colorsys"], proc.stderr


def test_the_default_dtype_name_reads_a_frameworks_dtype_or_says_to_override_it():
    from types import SimpleNamespace

    import numpy as np

    from attnspec.backends.authoring import Backend

    class Mine(Backend):
        name = "mine"

    be = Mine()
    assert be.dtype_name(np.zeros(2, np.float16)) == "float16"
    assert be.dtype_name(SimpleNamespace(dtype="torch.bfloat16")) == "bfloat16"  # str() of torch's dtype
    assert be.dtype_name(SimpleNamespace(dtype="mlx.core.int32")) == "int32"
    with pytest.raises(TypeError, match=r"mine.dtype_name: cannot name the dtype 'mylib.half2'.*override"):
        be.dtype_name(SimpleNamespace(dtype="mylib.half2"))
    torch = pytest.importorskip("torch")
    assert be.dtype_name(torch.zeros(2, dtype=torch.bfloat16)) == "bfloat16"
