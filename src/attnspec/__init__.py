"""attnspec: an executable specification and conformance kit for attention.

Subpackages (imported on first use, so ``import attnspec`` stays cheap and imports no framework):

- ``attnspec.spec``: the NumPy golden implementation that defines the semantics.
- ``attnspec.backends``: the backend contract, the registry and the built-in adapters.
- ``attnspec.conformance``: the Hypothesis suite every backend runs.
- ``attnspec.bench``: the benchmark harness (timings and memory, as results JSON).
- ``attnspec.reports``: renders results JSON into Markdown tables and plots.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from attnspec.errors import SpecError

__version__ = "0.1.0"
__all__ = ["SpecError", "__version__"]

_SUBPACKAGES = frozenset({"spec", "backends", "conformance", "bench", "reports"})


def __getattr__(name: str) -> ModuleType:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"attnspec.{name}")
    raise AttributeError(f"module 'attnspec' has no attribute {name!r}")
