"""One sdpa call check: every built-in backend plans its calls with the public `plan_sdpa`.

The authoring kit's `plan_sdpa` is what an outside author validates with (README, "write a
backend"); the built-ins go through it too (`Backend._plan`, with `Backend.library`), so a refusal
reads the same whichever backend, built-in or not, makes it.
"""

from __future__ import annotations

import numpy as np
import pytest

import attnspec.backends as ab
from attnspec import SpecError
from attnspec.backends import authoring

#: the built-ins with an sdpa of their own (the array API's numpy and strict namespaces stand for
#: the family; torch's and CuPy's share the class)
BUILTINS = [
    n
    for n in ("numpy", "torch", "torch-native", "jax", "jax-native", "array_api-numpy", "array_api-strict")
    if ab.available()[n].installed
]


@pytest.mark.parametrize("name", BUILTINS)
def test_a_builtin_plans_its_call_with_plan_sdpa(name, monkeypatch):
    backend = ab.get(name)
    calls = []
    real = authoring.plan_sdpa

    def spy(fn, q, k, v, **options):
        calls.append((fn, options["library"].name))
        return real(fn, q, k, v, **options)

    monkeypatch.setattr(authoring, "plan_sdpa", spy)
    rng = np.random.default_rng(0)
    q, k, v = (backend.asarray(rng.standard_normal((1, 2, 3, 4)), "float32") for _ in range(3))
    backend.sdpa(q, k, v, causal="upper_left")
    assert calls == [(f"{name}.sdpa", name)]


@pytest.mark.parametrize("name", BUILTINS)
def test_a_refusal_reads_the_same_on_every_builtin(name):
    backend = ab.get(name)
    q = backend.asarray(np.ones((1, 2, 3, 4)), "float32")
    with pytest.raises(SpecError) as info:
        backend.sdpa(q, [[0.0]], q)
    assert str(info.value) == f"{name}.sdpa: k must be a {backend.array_type}, got builtins.list"
    # the same words as an author's function checked by plan_sdpa on that library
    with pytest.raises(SpecError) as theirs:
        authoring.plan_sdpa("mine.sdpa", q, [[0.0]], q, library=backend.library)
    assert str(theirs.value).removeprefix("mine.sdpa: ") == str(info.value).removeprefix(f"{name}.sdpa: ")


@pytest.mark.parametrize("name", [n for n in ("torch", "torch-native") if n in BUILTINS])
def test_a_backend_that_draws_dropout_plans_the_call_without_its_p(name):
    """torch draws its own dropout mask for ``dropout_p`` alone; the spec refuses p without a mask,
    so the plan is made with p taken out (`drawn_dropout_p`), and the call runs."""
    backend = ab.get(name)
    q = backend.asarray(np.ones((1, 2, 3, 4)), "float32")
    assert backend.to_numpy(backend.sdpa(q, q, q, dropout_p=0.5)).shape == (1, 2, 3, 4)
