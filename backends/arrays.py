"""Array libraries: moving NumPy data in and out of a framework, and the few layout operations
an adapter needs, behind one interface.

    array_library("torch") -> ArrayLibrary      by name (imports the framework on first use)
    library_of(x) -> ArrayLibrary               the library an array belongs to

An `ArrayLibrary` is what `attnspec.backends.from_function` needs to know about a framework to
check a plain function: how to build its arrays from NumPy (``asarray``, rounding once in NumPy
so the golden and the function see the same bits), how to read them back (``to_numpy``,
bfloat16 included), their dtype and device names, and ``permute`` / ``reshape`` /
``broadcast_to`` / ``repeat`` for layout changes. Layout operations move data and change no
value. Built in: ``numpy``, ``torch``, ``jax``, ``mlx``, ``tinygrad``. Add one with
`register_array_library`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from attnspec.backends._common import to_reference
from attnspec.errors import SpecError
from attnspec.spec.validate import ArrayInfo

__all__ = [
    "ArrayLibrary",
    "BackendArrays",
    "array_libraries",
    "array_library",
    "library_of",
    "register_array_library",
]


class ArrayLibrary:
    """One framework's arrays as attnspec needs them. Subclasses name the framework (``name``,
    ``module``: imported when the library is built, as ``self._lib``) and its array class
    (``array_type``, which `is_array` checks and a refusal names), and override what differs from
    NumPy (``asarray``, ``to_numpy``, ``dtype_name``...)."""

    name: str = "numpy"
    #: the top-level module whose arrays this library handles (``type(x).__module__`` prefix)
    module: str = "numpy"
    #: the arrays `is_array` accepts, as a refusal names them ("torch.Tensor")
    array_type: str = "numpy.ndarray"

    def __init__(self) -> None:
        self._lib: Any = importlib.import_module(self.module)  # the framework, imported on first use

    def is_array(self, x: object) -> bool:
        """Whether ``x`` is an instance of the class `array_type` names (imported by then)."""
        return isinstance(x, _array_class(self.array_type))

    def lengths_to_numpy(self, x: Any) -> Any:
        """q_lengths / kv_lengths for the spec's checks, which read them by value: one of this
        library's arrays as NumPy, anything else (an int, a NumPy array, a wrong type the check
        will name) as it is."""
        return self.to_numpy(x) if self.is_array(x) else x

    def info(self, fn: str, name: str, x: Any) -> ArrayInfo:
        """The shape and dtype of argument ``name`` of ``fn``, one of this library's arrays.

        Raises:
            SpecError: ``x`` is not one of them (nothing is converted silently).
        """
        if not self.is_array(x):
            raise SpecError(
                f"{fn}: {name} must be a {self.array_type}, got {type(x).__module__}.{type(x).__name__}"
            )
        return ArrayInfo(tuple(int(s) for s in x.shape), self.dtype_name(x))

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> Any:
        return np.array(to_reference(x, dtype))  # a copy

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def dtype_name(self, x: Any) -> str:
        return str(np.dtype(x.dtype).name)

    def device_of(self, x: Any) -> str:
        return "cpu"

    def devices(self) -> list[str]:
        return ["cpu"]

    def synchronize(self) -> None:
        """Block until queued work is done (timing reads the clock after this)."""

    def numerics_policy(self) -> dict[str, Any]:
        """Switch off reduced-precision matmul shortcuts, as the built-in backends do; report them."""
        return {}

    # -- layout: these move data and change no value ----------------------------------------
    #: the NumPy-like namespace whose functions the layout operations call (jax.numpy, mlx.core)
    _ns: Any = np

    def permute(self, x: Any, axes: tuple[int, ...]) -> Any:
        return self._ns.transpose(x, axes)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self._ns.reshape(x, shape)

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self._ns.broadcast_to(x, shape)

    def repeat(self, x: Any, repeats: int, axis: int) -> Any:
        """Each element ``repeats`` times in a row along ``axis`` (NumPy's repeat; torch's repeat_interleave)."""
        return self._ns.repeat(x, repeats, axis=axis)

    def __repr__(self) -> str:
        return f"<attnspec array library {self.name!r}>"


class _TensorMethods:
    """Layout through tensor methods (torch and tinygrad spell them alike)."""

    def permute(self, x: Any, axes: tuple[int, ...]) -> Any:
        return x.permute(*axes)

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.reshape(shape)

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return x.expand(*shape)

    def repeat(self, x: Any, repeats: int, axis: int) -> Any:
        return x.repeat_interleave(repeats, dim=axis)


class _BackendHooks:
    """Arrays in and out through a built-in backend's own hooks (``self._hooks``), so torch's
    and JAX's conversions (bfloat16, devices, the numerics policy) exist once."""

    #: the built-in backend whose hooks these are (set by the subclass's __init__)
    _hooks: Any

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> Any:
        return self._hooks.asarray(x, dtype, device)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(self._hooks.to_numpy(x))

    def dtype_name(self, x: Any) -> str:
        return str(self._hooks.dtype_name(x))

    def devices(self) -> list[str]:
        return list(self._hooks.devices())

    def device_of(self, x: Any) -> str:
        return str(self._hooks.device_of(x))

    def synchronize(self) -> None:
        self._hooks.synchronize()

    def numerics_policy(self) -> dict[str, Any]:
        return dict(self._hooks.numerics_policy())


@functools.cache
def _array_class(array_type: str) -> type:
    """The class ``array_type`` names ("torch.Tensor"), looked up once: `is_array` runs for every
    argument of every call."""
    module, _, cls = array_type.rpartition(".")
    found: type = getattr(importlib.import_module(module), cls)
    return found


class BackendArrays(_BackendHooks, ArrayLibrary):
    """A built-in backend's own arrays, through its hooks (``asarray``, ``to_numpy``, ``is_array``,
    ``array_type``...): what `attnspec.backends.authoring.plan_sdpa` checks its calls against, as
    it checks any author's."""

    def __init__(self, backend: Any) -> None:
        self._hooks = backend
        self.name = self.module = backend.name
        self.array_type = backend.array_type

    def is_array(self, x: object) -> bool:
        return bool(self._hooks.is_array(x))


class TorchLibrary(_TensorMethods, _BackendHooks, ArrayLibrary):
    name = module = "torch"
    array_type = "torch.Tensor"

    def __init__(self) -> None:
        from attnspec.backends.torch import TorchArrays  # imports torch

        self._hooks = TorchArrays()


class JaxLibrary(_BackendHooks, ArrayLibrary):
    name = module = "jax"
    array_type = "jax.Array"

    def __init__(self, x64: bool = True) -> None:
        """``x64=False`` leaves JAX's 64-bit mode as it is (off by default): for code that breaks
        under it, which is then measured as its users run it, without float64."""
        import jax.numpy as jnp

        from attnspec.backends.jax import JaxArrays

        self._ns, self._hooks = jnp, JaxArrays(x64)


class MlxLibrary(ArrayLibrary):
    """MLX arrays (``pip install 'mlx[cpu]'`` on Linux). bfloat16 travels through float32."""

    name = module = "mlx"
    array_type = "mlx.core.array"

    def __init__(self) -> None:
        import mlx.core as mx

        self._mx = self._ns = mx

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> Any:
        x = to_reference(x, dtype)
        if x.dtype == ml_dtypes.bfloat16:  # float32 holds every bfloat16 exactly
            return self._mx.array(x.astype(np.float32)).astype(self._mx.bfloat16)
        # explicitly typed: mx.array of float64 data would otherwise make float32
        return self._mx.array(
            np.array(x), dtype=getattr(self._mx, "bool_" if x.dtype == bool else x.dtype.name)
        )

    def to_numpy(self, x: Any) -> np.ndarray:
        if x.dtype == self._mx.bfloat16:
            return np.array(x.astype(self._mx.float32)).astype(ml_dtypes.bfloat16)
        return np.array(x)

    def dtype_name(self, x: Any) -> str:
        return str(x.dtype).rsplit(".", 1)[-1]

    def synchronize(self) -> None:
        self._mx.synchronize()


class TinygradLibrary(_TensorMethods, ArrayLibrary):
    """tinygrad Tensors on their default device. bfloat16 travels through float32."""

    name = module = "tinygrad"
    array_type = "tinygrad.Tensor"

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> Any:
        x = to_reference(x, dtype)
        if x.dtype == ml_dtypes.bfloat16:
            return self._lib.Tensor(x.astype(np.float32)).cast(self._lib.dtypes.bfloat16).realize()
        return self._lib.Tensor(np.array(x)).realize()

    def to_numpy(self, x: Any) -> np.ndarray:
        if x.dtype == self._lib.dtypes.bfloat16:
            return np.asarray(x.cast(self._lib.dtypes.float32).numpy()).astype(ml_dtypes.bfloat16)
        return np.asarray(x.numpy())

    def dtype_name(self, x: Any) -> str:
        name = str(x.dtype.name)
        return {
            "half": "float16",
            "float": "float32",
            "double": "float64",
            "__bf16": "bfloat16",
            "bfloat16": "bfloat16",
            "char": "int8",
            "int": "int32",
            "long": "int64",
        }.get(name, name)


_LIBRARIES: dict[str, Callable[[], ArrayLibrary]] = {
    "numpy": ArrayLibrary,
    "torch": TorchLibrary,
    "jax": JaxLibrary,
    "mlx": MlxLibrary,
    "tinygrad": TinygradLibrary,
}
_built: dict[str, ArrayLibrary] = {}


def register_array_library(name: str, factory: Callable[[], ArrayLibrary]) -> None:
    """Make ``array_library(name)`` build ``factory()`` (an `ArrayLibrary` subclass or a callable)."""
    if not isinstance(name, str) or not name:
        raise SpecError(f"register_array_library: name={name!r} must be a non-empty str")
    _LIBRARIES[name] = factory
    _built.pop(name, None)


def array_libraries() -> list[str]:
    """Every known library name (whether or not its framework is installed)."""
    return list(_LIBRARIES)


def array_library(name: str | ArrayLibrary) -> ArrayLibrary:
    """The library called ``name`` (built once); an `ArrayLibrary` is returned as it is.

    Raises:
        SpecError: the name is unknown, or its framework does not import here.
    """
    if isinstance(name, ArrayLibrary):
        return name
    if name not in _LIBRARIES:
        raise SpecError(f"array_library: arrays={name!r} is not one of {', '.join(_LIBRARIES)}")
    if name not in _built:
        try:
            _built[name] = _LIBRARIES[name]()
        except ImportError as e:
            raise SpecError(
                f"array_library: arrays={name!r} needs a framework that does not import here: "
                f"{type(e).__name__}: {e}"
            ) from e
    return _built[name]


def library_of(x: object) -> ArrayLibrary:
    """The library whose arrays include ``x``, judged by the module of its type (imports nothing new).

    Raises:
        SpecError: ``x`` is not an array of any known library.
    """
    top = type(x).__module__.split(".")[0]
    if top in ("jaxlib",):
        top = "jax"
    for name in _LIBRARIES:
        if name in _built and _built[name].is_array(x):
            return _built[name]
    if top in _LIBRARIES and importlib.util.find_spec(top) is not None:
        factory = _LIBRARIES[top]
        # for layout operations only: no process-wide switch (JAX's x64) is touched here
        lib = factory(x64=False) if factory is JaxLibrary else array_library(top)
        if lib.is_array(x):
            return lib
    raise SpecError(
        f"library_of: {type(x).__module__}.{type(x).__name__} is not an array of a known "
        f"library ({', '.join(_LIBRARIES)})"
    )
