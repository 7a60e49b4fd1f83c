"""The minimal case of this plugin's declared deviation, as NumPy, and its test: named by
``deviations.toml`` as ``"attnspec_example_plugin.cases:empty_row_case"`` and
``"attnspec_example_plugin.cases:row1_is_nan"`` (attnspec resolves them when it loads the file)."""

from __future__ import annotations

import numpy as np

__all__ = ["empty_row_case", "row1_is_nan"]


def empty_row_case():
    """(q, k, v, options): query 1 sees no key."""
    r = np.random.default_rng(0)
    q, k, v = r.standard_normal((1, 3, 4)), r.standard_normal((1, 5, 4)), r.standard_normal((1, 5, 4))
    mask = np.ones((3, 5), bool)
    mask[1] = False  # query 1 sees no key
    return q, k, v, {"mask": mask}


def row1_is_nan(result, case) -> bool:
    """The backend's result (or the exception it raised) deviates: row 1 is NaN."""
    return isinstance(result, np.ndarray) and bool(np.isnan(result[..., 1, :]).all())
