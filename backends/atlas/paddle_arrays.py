"""PaddlePaddle tensors as an `attnspec.backends.arrays.ArrayLibrary` (the atlas' ``paddle-native``).

`register` makes ``array_library("paddle")`` (and so ``library_of`` on a paddle Tensor) build
`PaddleLibrary`; paddle itself is imported only when that happens.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from attnspec.backends._common import to_reference
from attnspec.backends.arrays import ArrayLibrary, register_array_library

__all__ = ["PaddleLibrary", "register"]


class PaddleLibrary(ArrayLibrary):
    """paddle Tensors on the CPU. bfloat16 travels through float32, which holds it exactly."""

    name = module = "paddle"
    array_type = "paddle.Tensor"

    def asarray(self, x: np.ndarray, dtype: str | None = None, device: str | None = None) -> Any:
        x = to_reference(x, dtype)
        place = self._lib.CPUPlace()
        if x.dtype == ml_dtypes.bfloat16:
            return self._lib.to_tensor(x.astype(np.float32), place=place).astype("bfloat16")
        return self._lib.to_tensor(np.array(x), place=place)

    def to_numpy(self, x: Any) -> np.ndarray:
        if x.dtype == self._lib.bfloat16:
            return np.asarray(x.astype("float32").numpy()).astype(ml_dtypes.bfloat16)
        return np.asarray(x.numpy())

    def dtype_name(self, x: Any) -> str:
        return str(x.dtype).rsplit(".", 1)[-1]

    def permute(self, x: Any, axes: tuple[int, ...]) -> Any:
        return self._lib.transpose(x, list(axes))

    def reshape(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self._lib.reshape(x, list(shape))

    def broadcast_to(self, x: Any, shape: tuple[int, ...]) -> Any:
        return self._lib.broadcast_to(x, list(shape))

    def repeat(self, x: Any, repeats: int, axis: int) -> Any:
        return self._lib.repeat_interleave(x, repeats, axis=axis)


def register() -> None:
    """Make ``array_library("paddle")`` build a `PaddleLibrary`."""
    register_array_library("paddle", PaddleLibrary)
