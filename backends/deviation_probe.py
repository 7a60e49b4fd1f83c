"""A declared deviation as data (`Deviation`), how it is checked (`status`), and how a probe's
minimal case is run on a backend.

One record for every deviation: the built-in catalogue (`attnspec.backends.deviations`), the
atlas' (`attnspec.backends.atlas.deviations`) and a plugin's own, whether loaded from TOML
(`attnspec.backends.deviations.load`) or written in Python. An entry is checked one of two ways:

    probe   ``case`` + ``shows``: the minimal case, run on an attnspec backend
            (``probe(backend)``: does the deviation show there?)
    atlas   ``question`` + ``answer``: the atlas question that measures it, and what the
            implementation answers while it deviates

``status(dev, target)`` is the one checker: observed, stale, or (an atlas question that could
not be asked) not_exercised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from attnspec.backends.base import Backend

__all__ = ["FUNCTIONS", "Case", "Deviation", "run", "run_mha", "run_vjp", "status"]

Case = tuple  # (q, k, v, options): NumPy arrays and sdpa keywords

#: the spec functions a probe's case calls
FUNCTIONS = ("sdpa", "sdpa_vjp", "mha")


@dataclass(frozen=True)
class Deviation:
    deviation_id: str
    backend: str  # the native backend that shows it
    feature: str = ""
    spec_says: str = ""
    native_does: str = ""
    reproducer: str = ""  # runnable Python using only the framework; its assert holds while it deviates
    case: Callable[[], Case] | None = None  # a probe's minimal case, as NumPy
    shows: Callable[[Any, Case], bool] | None = None  # (backend result or its exception, case) -> deviates?
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
    # an atlas entry: the atlas question that measures it, and the answer it gives while it deviates
    question: str = ""
    answer: str = ""
    # where it is declared (a report's "declared in"); empty: the module that writes its case
    source: str = ""
    # the file the reproducer was read from, where it was loaded from data
    reproducer_file: str = ""

    def __post_init__(self) -> None:
        probe, atlas = (self.case, self.shows), (self.question, self.answer)
        if any(probe) and any(atlas):
            raise TypeError(
                f"deviation {self.deviation_id!r}: checked by a probe (case, shows) or an atlas "
                "question (question, answer), not both"
            )
        if not (all(probe) or all(atlas)):
            raise TypeError(
                f"deviation {self.deviation_id!r}: needs case and shows (a probe), or question "
                "and answer (an atlas question)"
            )
        if self.function not in FUNCTIONS:
            raise ValueError(
                f"deviation {self.deviation_id!r}: function must be one of {FUNCTIONS}, got {self.function!r}"
            )
        if not isinstance(self.tags, frozenset):
            object.__setattr__(self, "tags", frozenset(self.tags))

    @property
    def check(self) -> str:
        """How it is checked: "probe" (case and shows) or "atlas" (question and answer)."""
        return "probe" if self.case is not None else "atlas"

    @property
    def id(self) -> str:
        return self.deviation_id

    def probe(self, backend: Backend) -> bool:
        """Run the minimal case on ``backend``; True when this deviation reproduces there."""
        if self.case is None or self.shows is None:
            raise TypeError(
                f"deviation {self.deviation_id!r} is checked by atlas question "
                f"{self.question!r}, not by a probe"
            )
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


def status(dev: Deviation, target: Any) -> str:
    """The one checker: whether ``dev`` shows on ``target``. A probe entry runs its case on
    ``target``, an attnspec backend: "observed" or "stale". An atlas entry reads ``target``, the
    atlas' answers (a list of ``{"id": question, "answer": ...}`` or a mapping question -> answer):
    "observed" when its question gives its answer, "stale" when another, "not_exercised" when the
    question could not be asked (n/a, or not answered)."""
    if dev.check == "probe":
        return "observed" if dev.probe(target) else "stale"
    if isinstance(target, Mapping):
        got = target.get(dev.question, "n/a")
    elif isinstance(target, Sequence):
        got = {a["id"]: a.get("answer", "n/a") for a in target}.get(dev.question, "n/a")
    else:
        raise TypeError(
            f"deviation {dev.deviation_id!r}: an atlas entry is checked against the atlas' "
            f"answers, got {type(target).__name__}"
        )
    if got.startswith("n/a"):
        return "not_exercised"
    return "observed" if got == dev.answer else "stale"


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
