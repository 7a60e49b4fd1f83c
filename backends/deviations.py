"""Where the frameworks' own attention differs from the spec, as data.

Each `Deviation` names the native backend that shows it, what the spec says, what the framework
does (measured on torch 2.13 CPU and jax 0.10.2 CPU), a standalone reproducer that uses only
the framework (its final ``assert`` holds while the deviation does), and the fix-up of the
conformant adapter that covers it; the fix-up's code carries the deviation id in a comment.
``probe(backend)`` runs a minimal case through any attnspec backend and says whether the
deviation shows there. The kit's tests check both directions: every deviation still reproduces
on its native backend (a stale entry fails) and no conformant backend shows it.

    DEVIATIONS                 the built-in catalogue: deviations_torch + deviations_jax
    Deviation, run, run_vjp, run_mha     the record and its probe (deviation_probe)
    declared_for(name, backend)          what applies to a backend, with where it is declared

A plugin declares its own backend's deviations in its own package with the same `Deviation`,
as the class attribute ``deviations``; a backend that wraps a built-in framework shares that
framework's with ``deviations_of = "jax-native"`` (README, "Writing a backend").

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

import dataclasses
from typing import Any

from attnspec.backends.deviation_probe import Case, Deviation, run, run_mha, run_vjp
from attnspec.backends.deviations_jax import JAX_DEVIATIONS
from attnspec.backends.deviations_torch import TORCH_DEVIATIONS

__all__ = ["BUILTIN_SOURCE", "DEVIATIONS", "Case", "Deviation", "declaration", "declared_for", "run",
           "run_mha", "run_vjp"]

DEVIATIONS: tuple[Deviation, ...] = (*TORCH_DEVIATIONS, *JAX_DEVIATIONS)

#: where the built-in catalogue is declared (a report's "declared in")
BUILTIN_SOURCE = "attnspec.backends.deviations"
ATLAS_SOURCE = "attnspec.backends.atlas (deviations.toml)"


def declared_for(backend_name: str, backend: Any = None) -> list[tuple[Any, str]]:
    """Every deviation declared for the backend, each with where it is declared: the built-in or
    atlas entries of ``backend.deviations_of`` (a wrapper sharing a framework's, e.g.
    "jax-native"), else of ``backend_name``; then the backend's own ``deviations`` (a plugin's,
    declared in its own package: the source is the module that writes the entry's case)."""
    from attnspec.backends.atlas.deviations import ATLAS_DEVIATIONS

    name = getattr(backend, "deviations_of", None) or backend_name
    found: list[tuple[Any, str]] = [(d, BUILTIN_SOURCE) for d in DEVIATIONS if d.backend == name]
    found += [(d, ATLAS_SOURCE) for d in ATLAS_DEVIATIONS if d.backend == name]
    own = getattr(backend, "deviations", None) or ()
    if isinstance(own, Deviation) or not all(isinstance(d, Deviation) for d in own):
        raise TypeError(f"{backend_name}: deviations must be a sequence of "
                        f"attnspec.backends.deviations.Deviation, got {own!r:.200}")
    seen = {d.deviation_id for d, _ in found}
    for d in own:
        if d.deviation_id in seen:
            raise ValueError(f"{backend_name}: deviation {d.deviation_id!r} is declared twice")
        seen.add(d.deviation_id)
        # declared where its case is written (the plugin's module), else where the class is
        found.append((d, getattr(d.case, "__module__", None) or type(backend).__module__))
    return found


def declaration(dev: Any) -> dict[str, Any]:
    """The fields of a declared deviation a report shows, as JSON (a `Deviation` or an atlas
    entry)."""
    if isinstance(dev, Deviation):
        return dev.as_json()
    fields = {f.name: getattr(dev, f.name) for f in dataclasses.fields(dev)}
    out = {"id": fields.pop("id"), "backend": fields.pop("backend"), "native_does": fields.pop("summary", ""),
           "tags": sorted(fields.pop("tags", ())), "upstream": fields.pop("upstream", "")}
    if "question" in fields:
        out["feature"] = f"atlas question {fields['question']!r} answers {fields.get('answer')!r}"
    return out
