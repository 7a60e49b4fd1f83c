"""Sinusoidal positional encoding ("Attention Is All You Need", section 3.5)."""

from __future__ import annotations

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec.validate import is_int


def sinusoidal_positions(n: int, d: int, base: float = 10000.0) -> np.ndarray:
    """(n, d) float64 encoding: PE[p, 2i] = sin(p / base**(2i/d)), PE[p, 2i+1] = cos(same).

    For odd d the last column is a sine. Row p is position p (0-based).
    """
    for name, value in (("n", n), ("d", d)):
        if not is_int(value) or value < 0:
            raise SpecError(f"sinusoidal_positions: {name}={value!r} must be an int >= 0")
    if (
        not isinstance(base, (int, float, np.floating))
        or isinstance(base, bool)
        or not np.isfinite(base)
        or base <= 0
    ):
        raise SpecError(f"sinusoidal_positions: base={base!r} must be a finite number > 0")
    pos = np.arange(n, dtype=np.float64)[:, None]  # (n, 1)
    two_i = np.arange(0, d, 2, dtype=np.float64)  # (ceil(d/2),)
    angle = pos / np.power(float(base), two_i / d)  # (n, ceil(d/2))
    pe = np.empty((n, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe
