"""The golden specification: plain NumPy functions that define attnspec's semantics.

Every decision where frameworks disagree is listed in ``spec/README.md`` with its reason.
"""

from attnspec._errors import SpecError
from attnspec.spec.masks import causal_mask, padding_mask, query_padding_mask, window_mask
from attnspec.spec.positions import sinusoidal_positions
from attnspec.spec.sdpa import sdpa, sdpa_loops

__all__ = [
    "SpecError",
    "causal_mask",
    "padding_mask",
    "query_padding_mask",
    "sdpa",
    "sdpa_loops",
    "sinusoidal_positions",
    "window_mask",
]
