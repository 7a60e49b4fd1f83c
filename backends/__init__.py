"""Backends by name: the built-in adapters, registered factories and third-party plugins.

    get(name, **options) -> Backend       build one (options go to its factory)
    load(target) -> Backend               a name, "module:Class", or "module:function@convention"
    from_function(fn, convention) -> Backend   check a plain attention function
    available() -> {name: Availability}   what can be built here, and why not
    names() -> [name, ...]                every known name
    register(name, factory)               add one at runtime

Importing this package, `names()` and `available()` import no framework: built-ins are
``"module:attr"`` strings imported on first `get`, and whether their framework is installed is
answered by `importlib.util.find_spec`, which finds a module without running it.

Third-party backends are entry points in the group ``attnspec.backends`` (name = backend name,
value = ``"module:attr"`` of a Backend subclass or a factory returning a Backend); see
``examples/attnspec-example-plugin``. `available()` loads each plugin's entry point to report it,
and a plugin that fails to load (ImportError or anything else) is listed as not installed with
its error; the other backends are unaffected. Built-in names take precedence over plugins.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, cast

from attnspec.backends.base import Backend, MHAArrays, Unsupported
from attnspec.backends.conventions import (
    CANONICAL,
    CONVENTIONS,
    NEEDS,
    Convention,
    get_convention,
    register_convention,
)
from attnspec.backends.function import FunctionBackend, from_function
from attnspec.errors import SpecError

__all__ = [
    "CANONICAL",
    "CONVENTIONS",
    "ENTRY_POINT_GROUP",
    "NEEDS",
    "TARGET_PATH_ENV",
    "Availability",
    "Backend",
    "Convention",
    "FunctionBackend",
    "MHAArrays",
    "Unsupported",
    "atlas_names",
    "available",
    "builtin_names",
    "from_function",
    "get",
    "get_convention",
    "load",
    "load_object",
    "names",
    "register",
    "register_convention",
    "search_after_installed",
    "split_convention",
]

ENTRY_POINT_GROUP = "attnspec.backends"

#: a Backend subclass, a callable returning a Backend, or "module:attr" naming either
Factory = str | Callable[..., Backend]


@dataclass(frozen=True)
class Availability:
    """Whether a backend can be built here; ``reason`` says why not (empty when it can)."""

    installed: bool
    reason: str = ""


@dataclass(frozen=True)
class _Builtin:
    target: str  # "module:attr"
    requires: tuple[str, ...]  # top-level modules that must be importable


# A new built-in costs one module and one line here. The table is a literal, so the noxfile reads
# it without importing attnspec (its sessions are derived from it): name -> ("module:attr", the
# top-level modules that must be importable, the pip extras that install them).
BUILTINS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "numpy": ("attnspec.backends.numpy:NumpyBackend", (), ()),
    "torch": ("attnspec.backends.torch:TorchBackend", ("torch", "array_api_compat"), ("torch",)),
    "jax": ("attnspec.backends.jax:JaxBackend", ("jax",), ("jax",)),
    "array_api-numpy": ("attnspec.backends.array_api:ArrayAPINumpy", ("array_api_compat",), ("array-api",)),
    "array_api-strict": (
        "attnspec.backends.array_api:ArrayAPIStrict",
        ("array_api_compat", "array_api_strict"),
        ("array-api",),
    ),
    "array_api-torch": (
        "attnspec.backends.array_api:ArrayAPITorch",
        ("array_api_compat", "torch"),
        ("array-api", "torch"),
    ),
    # CuPy has no extra: its wheel depends on the CUDA version (pip install cupy-cuda12x)
    "array_api-cupy": (
        "attnspec.backends.array_api:ArrayAPICupy",
        ("array_api_compat", "cupy"),
        ("array-api",),
    ),
    "torch-native": ("attnspec.backends.torch_native:TorchNativeBackend", ("torch",), ("torch",)),
    "jax-native": ("attnspec.backends.jax_native:JaxNativeBackend", ("jax",), ("jax",)),
}
_BUILTINS: dict[str, _Builtin] = {
    name: _Builtin(target, requires) for name, (target, requires, _extras) in BUILTINS.items()
}


def _atlas() -> dict[str, _Builtin]:
    from attnspec.backends.atlas.natives import ATLAS

    return {name: _Builtin(target, requires) for name, (target, requires, _extra) in ATLAS.items()}


#: the atlas' outside implementations (attnspec.backends.atlas): known by name like the built-ins,
#: but not the kit's own adapters (`builtin_names()` leaves them out)
_ATLAS: dict[str, _Builtin] = _atlas()


def _known() -> dict[str, _Builtin]:
    return {**_BUILTINS, **_ATLAS}


def builtin_names() -> list[str]:
    """The kit's own backends: adapters, native primitives of torch and JAX, array API."""
    return list(_BUILTINS)


def atlas_names() -> list[str]:
    """The atlas' outside implementations (``nox -s atlas``)."""
    return list(_ATLAS)


_registered: dict[str, Factory] = {}


def register(name: str, factory: Factory, *, replace: bool = False) -> None:
    """Make ``get(name)`` call ``factory(**options)``; ``factory`` may be a "module:attr" string.

    Refuses a name that is already known unless ``replace=True``.
    """
    if not isinstance(name, str) or not name:
        raise SpecError(f"backends.register: name={name!r} must be a non-empty str")
    if not (isinstance(factory, str) or callable(factory)):
        raise SpecError(
            f"backends.register: factory for {name!r} must be callable or 'module:attr', "
            f"got {type(factory).__name__}"
        )
    if not replace and (name in _known() or name in _registered):
        raise SpecError(f"backends.register: backend {name!r} is already registered (pass replace=True)")
    _registered[name] = factory


def names() -> list[str]:
    """Every known backend name: built-ins, then registered ones, then plugins (not loaded)."""
    found = list(_known()) + [n for n in _registered if n not in _known()]
    return found + sorted(n for n in _plugins() if n not in found)


def available() -> dict[str, Availability]:
    """{name: Availability} for every known backend, importing no framework."""
    result = {name: _builtin_availability(b) for name, b in _known().items()}
    result.update({name: Availability(True) for name in _registered if name not in result})
    for name, ep in sorted(_plugins().items()):
        if name not in result:
            result[name] = _plugin_availability(ep)
    return result


def get(name: str, **options: Any) -> Backend:
    """Build the backend called ``name``; ``options`` go to its factory.

    Raises:
        SpecError: ``name`` is unknown, or its framework or plugin cannot be loaded here; the
            message names the backend, the reason and the known names.
    """
    known = names()
    if name not in known:
        raise SpecError(f"backends.get: unknown backend {name!r}; known backends: {', '.join(known)}")
    try:
        factory = _factory(name)
        if isinstance(factory, Availability):
            raise _unavailable(name, factory.reason, known)
        backend = factory(**options)
    except ImportError as e:  # installed, but its import fails (a broken framework build)
        raise _unavailable(name, f"{type(e).__name__}: {e}", known) from e
    return _a_backend(backend, f"backends.get: the factory of {name!r}")


def load_object(target: str) -> Any:
    """The object ``"module:attr"`` names; the module may be a ``path/to/file.py``.

    Raises:
        SpecError: the target is malformed, its module does not import, or the attribute is
            missing; the message names which.
    """
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise SpecError(f"load: {target!r} must be MODULE:ATTRIBUTE (or path/to/file.py:ATTRIBUTE)")
    try:
        if module.endswith(".py") or "/" in module:
            obj = _import_path(module)
        else:
            search_after_installed(os.environ.get(TARGET_PATH_ENV, "").split(os.pathsep))
            obj = importlib.import_module(module)
    except SpecError:
        raise
    except BaseException as e:  # SystemExit and friends from a module's top level too
        raise SpecError(f"load: module {module!r} does not import: {type(e).__name__}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise SpecError(f"load: {module!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def split_convention(how: str) -> tuple[str, str]:
    """``convention[/arrays]`` -> (convention, arrays or ""): the convention may be a name
    (``torch_sdpa``, ``torch_sdpa+canonical``) or ``MODULE:ATTRIBUTE`` (a path with ``/`` too), so
    only a last part naming an array library is taken as the arrays."""
    from attnspec.backends.arrays import array_libraries

    convention, sep, arrays = how.rpartition("/")
    if sep and arrays in array_libraries():
        return convention, arrays
    return how, ""


#: env var: folders (os.pathsep-separated) a ``module:attr`` target is also looked for in, after
#: the installed packages (``attnspec check`` sets it to the folder it was started in)
TARGET_PATH_ENV = "ATTNSPEC_TARGET_PATH"


def search_after_installed(folders: list[str]) -> None:
    """Append ``folders`` to ``sys.path``, after the installed packages: a target's own folder
    resolves its module and sibling imports but can never hide an installed package (a clone
    named ``attnspec`` in the current folder, a ``torch.py`` beside the file)."""
    for folder in folders:
        if folder and os.path.abspath(folder) not in map(os.path.abspath, filter(None, sys.path)):
            sys.path.append(os.path.abspath(folder))


def load(target: str, **options: Any) -> Backend:
    """The backend a target string names, as ``attnspec check`` and ``--attn-backend`` take it.

    - ``NAME``: a registered backend (`get`).
    - ``module:Class`` or ``module:factory``: a Backend subclass or a callable returning one.
    - ``module:function@convention`` or ``module:function@convention/arrays``: a plain function
      (`from_function`, named by the target itself so reproducers can rebuild it).
    ``module`` may be a path to a ``.py`` file.
    """
    if not isinstance(target, str) or not target:
        raise SpecError(f"load: target={target!r} must be a non-empty str")
    if "@" in target:
        where, _, how = target.rpartition("@")
        convention, arrays = split_convention(how)
        fn = load_object(where)
        if not callable(fn):
            raise SpecError(f"load: {where!r} is a {type(fn).__name__}, not a callable")
        return from_function(fn, convention, name=target, arrays=arrays or None, **options)
    if ":" not in target:
        return get(target, **options)
    obj = load_object(target)
    if not callable(obj):
        raise SpecError(f"load: {target!r} is a {type(obj).__name__}, not a Backend class or factory")
    return _a_backend(obj(**options), f"load: {target!r}", " (for a plain function, add @CONVENTION)")


def _a_backend(backend: Any, made_by: str, hint: str = "") -> Backend:
    """``backend``, refused unless it is a `Backend`: ``made_by`` (a factory, a target) returned it."""
    if not isinstance(backend, Backend):
        raise SpecError(
            f"{made_by} returned {type(backend).__name__}, not an attnspec.backends.Backend{hint}"
        )
    return backend


def _import_path(path: str) -> ModuleType:
    import os

    file = os.path.abspath(path)
    if not os.path.isfile(file):
        raise SpecError(f"load: no file {path!r}")
    name = os.path.splitext(os.path.basename(file))[0]
    search_after_installed([os.path.dirname(file)])  # its sibling imports work; it shadows nothing
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:  # not a file Python can import (no .py suffix)
        raise SpecError(f"load: {path!r} is not a Python module file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -- internals ------------------------------------------------------------------------------


def _unavailable(name: str, reason: str, known: list[str]) -> SpecError:
    return SpecError(
        f"backends.get: backend {name!r} is not available: {reason}; known backends: {', '.join(known)}"
    )


def _plugins() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _installed(module: str) -> bool:
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-initialized package
        return False


def _builtin_availability(b: _Builtin) -> Availability:
    missing = [m for m in b.requires if not _installed(m)]
    if missing:
        return Availability(False, f"not installed: {', '.join(missing)}")
    return Availability(True)


def _plugin_availability(ep: metadata.EntryPoint) -> Availability:
    try:
        ep.load()
    except Exception as e:  # a broken plugin must not break the registry
        return _load_failed(ep, e)
    return Availability(True)


def _load_failed(ep: metadata.EntryPoint, e: Exception) -> Availability:
    return Availability(False, f"plugin entry point {ep.value!r} failed to load: {type(e).__name__}: {e}")


def _load(target: str) -> Any:
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _factory(name: str) -> Callable[..., Backend] | Availability:
    """The callable that builds ``name``, or the Availability saying why it cannot be built."""
    if name in _known():
        status = _builtin_availability(_known()[name])
        return _load(_known()[name].target) if status.installed else status
    if name in _registered:
        factory = _registered[name]
        return _load(factory) if isinstance(factory, str) else factory
    ep = _plugins()[name]
    try:
        factory = ep.load()
    except Exception as e:
        return _load_failed(ep, e)
    return cast(Callable[..., Backend], factory)
