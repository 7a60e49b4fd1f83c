"""A declared deviation as data (`Deviation`), and how its minimal case is run on a backend.

The catalogue of the built-in frameworks' deviations is `attnspec.backends.deviations`; a plugin
declares its own with the same `Deviation` (see README, "Writing a backend"). ``probe(backend)``
runs the entry's minimal case through any attnspec backend and says whether it shows there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.backends.base import Backend

__all__ = ["Case", "Deviation", "run", "run_mha", "run_vjp"]

Case = tuple  # (q, k, v, options): NumPy arrays and sdpa keywords


@dataclass(frozen=True)
class Deviation:
    deviation_id: str
    backend: str  # the native backend that shows it
    feature: str
    spec_says: str
    native_does: str
    reproducer: str  # runnable Python using only the framework; its assert holds while it deviates
    case: Callable[[], Case]  # the minimal case, as NumPy
    shows: Callable[[Any, Case], bool]  # (backend result or its exception, case) -> deviates?
    # "<conformant backend>: <the fix-up that covers it>"; empty for a plugin's own backend that
    # measures and does not fix
    fixed_by: str = ""
    # The conformance suite's case tags under which this deviation appears (all must be present):
    # a failing case of this backend that carries them counts as this deviation, not a failure.
    # Empty: the suite's generators never build such a case (it is checked by its probe alone).
    tags: frozenset[str] = frozenset()
    # the spec function the case calls: "sdpa", "sdpa_vjp" (its result is (dq, dk, dv[, dbias])
    # for d_out = 1, from `run_vjp`) or "mha" (from `run_mha`)
    function: str = "sdpa"
    # a link to the upstream report or document, where there is one
    upstream: str = ""

    def probe(self, backend: Backend) -> bool:
        """Run the minimal case on ``backend``; True when this deviation reproduces there."""
        case = self.case()
        runner = {"sdpa_vjp": run_vjp, "mha": run_mha}.get(self.function, run)
        result = runner(backend, case)
        return bool(self.shows(result, case))

    def as_json(self) -> dict[str, Any]:
        """The declaration's fields that a report shows (everything but the case and its test)."""
        return {
            "id": self.deviation_id,
            "backend": self.backend,
            "feature": self.feature,
            "spec_says": self.spec_says,
            "native_does": self.native_does,
            "reproducer": self.reproducer,
            "fixed_by": self.fixed_by,
            "tags": sorted(self.tags),
            "function": self.function,
            "upstream": self.upstream,
        }


def run(backend: Backend, case: Case):
    """The case through ``backend``, back as NumPy (a tuple of them for (out, lse) and the like);
    an exception is returned, not raised."""
    q, k, v, options = case
    conv = {key: backend.asarray(val) if key in ("mask", "bias") else val for key, val in options.items()}
    try:
        out = backend.sdpa(backend.asarray(q), backend.asarray(k), backend.asarray(v), **conv)
    except Exception as e:  # a refusal is a result here
        return e
    return tuple(map(backend.to_numpy, out)) if isinstance(out, tuple) else backend.to_numpy(out)


def run_vjp(backend: Backend, case: Case):
    """sdpa_vjp of the case with d_out = 1 through ``backend``, as NumPy; an exception is returned."""
    q, k, v, options = case
    conv = {key: backend.asarray(val) if key in ("mask", "bias") else val for key, val in options.items()}
    try:
        out = backend.sdpa(backend.asarray(q), backend.asarray(k), backend.asarray(v), **conv)
        d_out = backend.asarray(np.ones(tuple(out.shape), q.dtype))
        grads = backend.sdpa_vjp(backend.asarray(q), backend.asarray(k), backend.asarray(v), d_out, **conv)
    except Exception as e:  # a refusal is a result here
        return e
    return tuple(backend.to_numpy(g) for g in grads)


def run_mha(backend: Backend, case: Case):
    """mha of the case through ``backend``, as NumPy (out, or (out, weights)); an exception is
    returned. ``case`` is (query, key, value, options), options holding ``params`` (MHAParams)."""
    query, key, value, options = case
    conv = {k: backend.asarray(v) if isinstance(v, np.ndarray) else v for k, v in options.items()}
    try:
        result = backend.mha(backend.asarray(query), backend.asarray(key), backend.asarray(value), **conv)
    except Exception as e:  # a refusal is a result here
        return e
    return tuple(map(backend.to_numpy, result)) if isinstance(result, tuple) else backend.to_numpy(result)
