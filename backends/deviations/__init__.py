"""Where the frameworks' own attention differs from the spec, as data.

Every deviation is one record, `Deviation`, declared in one format: TOML files of
``[[deviation]]`` tables, read by `load` and described by ``schema.json`` beside this file. The
built-in catalogue is ``torch.toml`` and ``jax.toml`` here, the atlas' is
``backends/atlas/deviations.toml``, and a plugin ships its own in its package.

Each entry names the backend that shows it, what the spec says, what the framework does
(the built-ins measured on torch 2.13 CPU and jax 0.10.2 CPU), and how it is checked:

    a probe           ``case`` + ``shows``: the minimal case as NumPy and its test, run through
                      any attnspec backend (``Deviation.probe``); with a standalone
                      ``reproducer`` script that uses only the framework (its final ``assert``
                      holds while the deviation does), a ``.py`` file beside the TOML
                      (``reproducers/``), linted by ruff and run by tests/test_deviations.py
    an atlas question ``question`` + ``answer``: the atlas question that measures it and the
                      answer the implementation gives while it deviates

``case`` and ``shows`` name functions: a bare name is one of `attnspec.backends.deviation_cases`,
``"module:name"`` any importable one (a plugin's own). They are resolved when the file is
loaded; an unknown name is an error naming the entry and the field. A built-in entry also names
the fix-up of the conformant adapter that covers it (``fixed_by``), whose code carries the
deviation id in a comment. The kit's tests check both directions: every deviation still
reproduces on its native backend (a stale entry fails) and no conformant backend shows it.

    DEVIATIONS                 the built-in catalogue (torch.toml + jax.toml)
    Deviation                  the record (`attnspec.backends.deviation_probe`)
    load(path)                 a TOML file of deviations, validated, as `Deviation` records
    status(dev, target)        the one checker: observed | stale | not_exercised
    run, run_vjp, run_mha      how a probe's case is run on a backend
    declared_for(name, backend)          what applies to a backend, with where it is declared
    declaration(dev)           the fields a report shows, as JSON

A plugin declares its own backend's deviations in its own package, as the class attribute
``deviations``: ``deviations = load(Path(__file__).with_name("deviations.toml"))`` (or a tuple
of `Deviation` written in Python, as before); a backend that wraps a built-in framework shares
that framework's with ``deviations_of = "jax-native"`` (docs/guide/backends.md).

Probes run on the backend's default device, which is the CPU for every built-in backend, so the
CPU-specific entries (``torch.nonfinite-query-row-zeroed``, ``jax.float16-jit-cpu-refused``) are
checked where they were measured; GPU kernels were not measured.

Measured and not a deviation (so not listed): torch returns 0 for a query row with no visible
key (math and flash CPU kernels, every float dtype, boolean mask or all -inf bias);
``torch.nn.attention.bias.causal_lower_right`` works on CPU, also when n > m (rows with no key
give 0, despite torch's warning that they give NaN); JAX's ``local_window_size=(l, r)`` lets
query i see [i - l, i + r], the spec's window; JAX drops a NaN key hidden by ``mask``,
``is_causal`` or the sequence lengths (it masks logits with ``where``); padded queries
(``query_seq_lengths``) give 0 in JAX. Gradients (torch.autograd through torch SDPA, math and
CPU flash kernels, float32, float64 and bfloat16): a row with no visible key (boolean mask or
all -inf bias) gets dq = 0 and adds nothing, and a masked key gets dk = dv = 0, all finite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnspec.backends.deviation_probe import Case, Deviation, run, run_mha, run_vjp, status
from attnspec.backends.deviations.loader import SCHEMA, load

__all__ = [
    "BUILTIN_SOURCE",
    "DEVIATIONS",
    "SCHEMA",
    "Case",
    "Deviation",
    "declaration",
    "declared_for",
    "load",
    "run",
    "run_mha",
    "run_vjp",
    "status",
]

HERE = Path(__file__).parent

#: where the built-in catalogue is declared (a report's "declared in")
BUILTIN_SOURCE = "attnspec.backends.deviations"
ATLAS_SOURCE = "attnspec.backends.atlas (deviations.toml)"

DEVIATIONS: tuple[Deviation, ...] = (
    *load(HERE / "torch.toml", source=BUILTIN_SOURCE),
    *load(HERE / "jax.toml", source=BUILTIN_SOURCE),
)


def declared_for(backend_name: str, backend: Any = None) -> list[tuple[Any, str]]:
    """Every deviation declared for the backend, each with where it is declared: the built-in or
    atlas entries of ``backend.deviations_of`` (a wrapper sharing a framework's, e.g.
    "jax-native"), else of ``backend_name``; then the backend's own ``deviations`` (a plugin's,
    declared in its own package: the source is the TOML file it was loaded from, or for one
    written in Python the module that writes the entry's case)."""
    from attnspec.backends.atlas.deviations import ATLAS_DEVIATIONS

    name = getattr(backend, "deviations_of", None) or backend_name
    found: list[tuple[Any, str]] = [(d, BUILTIN_SOURCE) for d in DEVIATIONS if d.backend == name]
    found += [(d, ATLAS_SOURCE) for d in ATLAS_DEVIATIONS if d.backend == name]
    own = getattr(backend, "deviations", None) or ()
    if isinstance(own, Deviation) or not all(isinstance(d, Deviation) for d in own):
        raise TypeError(
            f"{backend_name}: deviations must be a sequence of "
            f"attnspec.backends.deviations.Deviation, got {own!r:.200}"
        )
    seen = {d.deviation_id for d, _ in found}
    for d in own:
        if d.deviation_id in seen:
            raise ValueError(f"{backend_name}: deviation {d.deviation_id!r} is declared twice")
        seen.add(d.deviation_id)
        # declared where it was loaded from, else where its case is written (the plugin's
        # module), else where the class is
        found.append((d, d.source or getattr(d.case, "__module__", None) or type(backend).__module__))
    return found


def declaration(dev: Deviation) -> dict[str, Any]:
    """The fields of a declared deviation a report shows, as JSON: a probe entry's facts and
    reproducer; an atlas entry's summary, with its question and answer as its feature."""
    if dev.check == "probe":
        return dev.as_json()
    return {
        "id": dev.deviation_id,
        "backend": dev.backend,
        "native_does": dev.native_does,
        "tags": sorted(dev.tags),
        "upstream": dev.upstream,
        "feature": f"atlas question {dev.question!r} answers {dev.answer!r}",
    }
