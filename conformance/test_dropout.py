"""Conformance of dropout a backend draws itself (variant ``dropout_drawn``): ``dropout_p > 0``
without a ``dropout_mask``.

The spec draws no random numbers (decision 18), so there is no golden output to compare with.
The property judges what the draws must be: each weight kept with probability 1 - p,
independently, and kept weights divided by 1 - p. The case makes the output show every weight:
with v = I (dv = m), ``out[..., i, j] = w[i, j] * keep[i, j] / (1 - p)``, w the weights without
dropout. R independent draws come from one call, as R identical copies of the case along a batch
axis (the mask is drawn per batch element, head and entry).

Three checks, each with a false-failure probability of at most ``DELTA`` for a correct backend:

(a) every output entry is 0 or ``w / (1 - p)``: the nearest of the two gives a mask, and the
    output must equal the golden for that mask under the suite's tolerance rule;
(b) the keep rate over all ``N = R * Hq * n * m`` entries is ``1 - p`` within Bernstein's bound;
(c) the mean output over the R draws is unbiased: per entry, ``|mean - w|`` is within
    Bernstein's bound for that entry plus the output tolerance (each draw may be off by it).

Bernstein's inequality for the mean of R independent X with ``|X - E X| <= c`` and variance
``s2``: ``P(|mean - E X| >= t) <= 2 exp(-R t^2 / (2 s2 + 2 c t / 3))``. Solving for the t where
this equals ``delta``, with ``L = ln(2 / delta)``, gives ``t = (L c / 3 + sqrt((L c / 3)^2 + 2 R L
s2)) / R``: ``z * SE`` with ``z = sqrt(2 L)`` and ``SE = sqrt(s2 / R)``, plus a term for few
draws. It needs no normal approximation, which matters in (c), where an entry is kept only
~R (1 - p) times. (b): X = keep, ``s2 = p (1 - p)``, ``c = max(p, 1 - p)``, R = N. (c): X =
``w keep / (1 - p)``, ``s2 = w^2 p / (1 - p)``, ``c = w max(1, p / (1 - p))``, and delta is
split over the entries (a union bound).

The draws are seeded (torch's and NumPy's global generators, where loaded), so a run is
reproducible; a backend with a generator of its own is judged by the same bounds.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from attnspec.backends.compare import sdpa_golden
from attnspec.conformance.hypothesis_helpers import NP_DTYPES, SDPACase
from attnspec.conformance.pytest_helpers import Verdict, check_metadata, to_backend
from attnspec.spec.tolerance import compare
from attnspec.spec.validate import FLOAT_DTYPES

#: false-failure probability of each check for a correct backend
DELTA = 1e-6
#: R: independent draws (copies of the case along the batch axis)
DRAWS = 2048
#: Hq = Hkv, n, m, dk of one copy; v = I, so dv = m
HEADS, N, M, DK = 2, 4, 4, 4
#: |q|, |k| of this size keep logits within ~0.3 of 0, so each weight is near 1 / m: far above
#: the tolerance in every dtype (bfloat16's is ~0.3 at p = 0.9), so (a) can tell 0 from w / (1 - p)
INPUT_SCALE = 0.3
#: p = 0.5 is the common case; 0.1 and 0.9 are where a mask kept with rate p (not 1 - p) shows
P_VALUES = (0.1, 0.5, 0.9)
SEED = 15


def drawn_case(dtype: str, p: float, draws: int = DRAWS) -> SDPACase:
    """The case: ``draws`` identical copies of one (Hq, n, dk) call with v = I and ``dropout_p=p``."""
    rng = np.random.default_rng(SEED)
    dt = NP_DTYPES[dtype]
    q = (rng.standard_normal((HEADS, N, DK)) * INPUT_SCALE).astype(dt)  # (Hq, n, dk)
    k = (rng.standard_normal((HEADS, M, DK)) * INPUT_SCALE).astype(dt)  # (Hkv, m, dk)
    v = np.broadcast_to(np.eye(M), (HEADS, M, M)).astype(dt)  # (Hkv, m, dv = m)

    def copies(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.broadcast_to(x, (draws, *x.shape)))  # (R, H, L, d)

    tags = frozenset({"dropout_drawn", "variants"})
    return SDPACase("dropout_drawn", dtype, copies(q), copies(k), copies(v), {"dropout_p": p}, tags, SEED)


def bernstein(draws: int, variance, spread, delta: float):
    """t with P(|mean of ``draws`` - expectation| >= t) <= delta, for |X - E X| <= ``spread``."""
    log_term = math.log(2.0 / delta)
    a = log_term * spread / 3.0
    return (a + np.sqrt(a * a + 2.0 * draws * log_term * variance)) / draws


def seed_generators(seed: int) -> None:
    """Seed the global generators a backend may draw from: torch's (all devices) and NumPy's."""
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def judge_drawn(backend, case: SDPACase, device: str | None) -> Verdict:
    """Call ``backend.sdpa`` once on ``case`` (seeded) and apply checks (a), (b) and (c)."""
    p = float(case.options["dropout_p"])
    draws = case.q.shape[0]
    seed_generators(case.seed)
    (q, k, v), opts = to_backend(backend, case, device)
    result = backend.sdpa(q, k, v, **opts)
    head = f"[{backend.name}] sdpa dropout_drawn: "
    tail = (
        f"\n  case: {case.describe()} device={device}\n  reproduce with:\n"
        "    from attnspec.conformance.pytest_helpers import resolve_backend\n"
        "    from attnspec.conformance.test_dropout import drawn_case, judge_drawn\n"
        f"    print(judge_drawn(resolve_backend({backend.name!r}), drawn_case({case.dtype!r}, {p!r}), "
        f"{device!r}).message)"
    )
    problems = check_metadata(backend, result, case.q.shape[:-1] + (M,), case.dtype, device)
    if problems:
        return Verdict("failed", message=head + "; ".join(problems) + tail)
    out = backend.to_numpy(result).astype(np.float64)  # (R, H, n, m)
    w = sdpa_golden(case.q[:1], case.k[:1], case.v[:1]).out[0]  # (H, n, m): the weights, no dropout
    kept = w / (1.0 - p)

    # (a) each entry is 0 or w / (1 - p): judged against the golden of the nearest mask
    keep = np.abs(out - kept) < np.abs(out)  # (R, H, n, m); False where out is NaN
    g = sdpa_golden(case.q, case.k, case.v, dropout_mask=keep, dropout_p=p)
    if not g.allowed_out < kept.min() / 2:  # the case is built so that (a) can tell them apart
        raise AssertionError(
            f"{head}allowed error {g.allowed_out:.3e} does not separate 0 from the "
            f"smallest kept value {kept.min():.3e}: the case is wrong, not the backend"
        )
    c = compare(out, g.out, g.allowed_out)
    if not c.ok:
        return Verdict(
            "failed",
            {"out": c},
            (
                f"{head}output entries are not 0 or w / (1 - p) (v = I shows every weight): max abs err "
                f"{c.max_abs_err:.3e} from the nearest at index {c.worst_index} > allowed {c.allowed:.3e}; "
                f"{100 * c.out_of_tolerance:.1f}% of entries; kept weights not divided by 1 - p?{tail}"
            ),
        )

    # (b) the keep rate over all entries
    rate = float(keep.mean())
    bound = float(bernstein(keep.size, p * (1.0 - p), max(p, 1.0 - p), DELTA))
    if abs(rate - (1.0 - p)) > bound:
        return Verdict(
            "failed",
            {"out": c},
            (
                f"{head}keep rate {rate:.4f} over {keep.size} entries, but should be 1 - p = {1.0 - p:.4f} "
                f"within {bound:.4f} (Bernstein, false-failure rate {DELTA:g}){tail}"
            ),
        )

    # (c) the mean output over the draws, per entry
    entries = w.size
    spread = w * max(1.0, p / (1.0 - p))
    t = bernstein(draws, w * w * p / (1.0 - p), spread, DELTA / entries) + g.allowed_out
    err = np.abs(out.mean(axis=0) - w)  # (H, n, m)
    if (err > t).any():
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(err - t)), err.shape))
        return Verdict(
            "failed",
            {"out": c},
            (
                f"{head}the mean output over {draws} draws is biased: {int((err > t).sum())} of {entries} "
                f"entries differ from the output without dropout by more than their bound; worst at "
                f"{worst}: {err[worst]:.4e} > {t[worst]:.4e} (w = {w[worst]:.4e}){tail}"
            ),
        )
    return Verdict("passed", {"out": c})


@pytest.mark.parametrize("p", P_VALUES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_dropout_drawn(attn_backend, attn_device, judge, dtype, p):
    """A backend that draws its own dropout mask keeps each weight with probability 1 - p,
    independently, and divides kept weights by 1 - p (checks (a), (b), (c) above)."""
    case = drawn_case(dtype, p)
    judge("sdpa", "dropout_drawn", case, lambda: judge_drawn(attn_backend, case, attn_device))
