"""Hypothesis strategies for `attnspec.spec.sdpa_fp8`: FP8 q, k, v with drawn descales.

Each case quantises float64 normals: the stored tensor is fp8(x / s) for a descale s drawn
log-uniformly in [2**-4, 2**4] (never 1, rarely a power of two), with x / s clipped well inside
the FP8 dtype's range, so no value saturates (ml_dtypes casts an out-of-range e4m3fn value to
NaN where torch saturates to 448: a case that saturated would mean two things). The golden is
defined on the stored values times s, so the quantisation error is part of the input, not of
the result. The features: GQA, a wide q over an FP8 KV cache, per-sequence lower-right causal
with kv_lengths (and q_lengths), windows, softcap, scale, peaked rows (large logits), and all of
them at once; out_dtype float32 in about half of the cases (float32 is where P precision shows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from attnspec.conformance.hypothesis_helpers import SDPACase, array_source, options_text
from attnspec.spec.fp8 import FP8_NUMPY, WIDE_Q_DTYPES

#: what each case exercises; "combined" mixes them
FP8_FEATURES = (
    "plain",
    "gqa",
    "wide_q",
    "causal_lower_right_lengths",
    "window",
    "softcap",
    "scale",
    "peaked",
    "combined",
)
#: the output dtypes drawn, float32 first (Hypothesis leans on the first) and twice
OUT_DTYPES = ("float32", "bfloat16", "float32", "float16")
SIDES = (1, 2, 3, 5, 8, 13, 16)
DIMS = (4, 8, 16)
#: descales lie in [2**-LOG2_SPAN, 2**LOG2_SPAN]
LOG2_SPAN = 4.0


@dataclass
class FP8Case(SDPACase):
    """One sdpa_fp8 call: stored (FP8 or wide) q, k, v, its keywords (descales and out_dtype
    among them), the feature, tags and seed. ``dtype`` is the FP8 storage dtype of k and v."""

    @property
    def wide_dtypes(self) -> tuple[str, ...]:
        """The non-FP8 dtypes the call needs of a backend: out_dtype, and q's when q is wide."""
        names = [self.options.get("out_dtype") or "bfloat16"]
        if self.q.dtype.name != self.dtype:
            names.append(self.q.dtype.name)
        return tuple(dict.fromkeys(names))

    def describe(self) -> str:
        opts = options_text(self.options)
        return (
            f"feature={self.feature} dtype={self.dtype} q{self.q.shape}:{self.q.dtype.name} "
            f"k{self.k.shape} v{self.v.shape} {opts}"
        ).rstrip()

    def repro(self, backend_name: str, device: str | None, **extra: Any) -> str:
        """A self-contained snippet: the stored inputs rebuilt bit for bit, the backend's call and
        its error against the golden and the allowed one."""
        lines = [
            "import numpy as np, ml_dtypes",
            "from attnspec.spec.tolerance_fp8 import fp8_golden",
            "from attnspec.conformance.pytest_helpers import resolve_backend",
            f"b = resolve_backend({backend_name!r})",
        ]
        for name in ("q", "k", "v"):
            lines.append(f"{name} = {_array(getattr(self, name))}")
        opts = {**self.options, **extra}
        lines.append(
            "options = {"
            + ", ".join(
                f"{k!r}: {_array(v) if isinstance(v, np.ndarray) else repr(v)}"
                for k, v in sorted(opts.items())
            )
            + "}"
        )
        dev = f", device={device!r}" if device else ""
        lines += [
            "g = fp8_golden(q, k, v, p_precision=getattr(b, 'fp8_p_precision', 'float32'), **options)",
            f"to = lambda x: b.asarray(x{dev}) if isinstance(x, np.ndarray) else x",
            "out = b.sdpa_fp8(to(q), to(k), to(v), **{n: to(x) for n, x in options.items()})",
            "out = out[0] if isinstance(out, tuple) else out",
            "err = np.abs(b.to_numpy(out).astype(float) - g.out).max()",
            "print(f'error {err:.3e}, allowed {g.allowed_out:.3e}')",
        ]
        return "\n".join(lines)


def _array(x: np.ndarray) -> str:
    """Python for ``x`` (`array_source`): FP8 and bfloat16 through their float64 values, exact."""
    name = x.dtype.name
    return array_source(x, f"ml_dtypes.{name}" if name in (*FP8_NUMPY, "bfloat16") else f"np.{name}")


def fp8_cases(dtype: str, features: tuple[str, ...] = FP8_FEATURES):
    """One sdpa_fp8 call in the FP8 dtype ``dtype``, exercising a drawn feature. A `Tour`
    (`attnspec.conformance.corners`) draws one case of its feature, in bfloat16 out: the spec's
    default for FP8 q and what FlashAttention-3 returns (the drawn cases vary it); the tour of
    ``out_float32`` is a plain case with float32 out."""
    strategy: Any = _fp8_cases(dtype, features)  # a SearchStrategy carrying the corner/tour hooks
    strategy.attn_tour = lambda tour: _tour_case(tour, dtype, features)  # see corners.py
    return strategy


#: tour features of this property that `attnspec.conformance.corners.tour_features` lacks
#: (test_fp8 tours them itself)
EXTRA_TOUR_FEATURES = ("wide_q", "peaked", "out_float32")


def _tour_case(tour, dtype: str, features: tuple[str, ...]) -> FP8Case:
    out = "float32" if tour.feature == "out_float32" else "bfloat16"
    if tour.feature == "out_float32":  # a tour test_fp8 made for it: a plain case, float32 out
        tour.feature = "plain"
    return _fp8_case(_OutDtype(tour.choosing(features), out), dtype, features)


class _OutDtype:
    """A tour's draws, but the output dtype drawn is ``out``."""

    def __init__(self, tour, out: str) -> None:
        self.tour, self.out = tour, out

    def __call__(self, strategy, label=None):
        s = getattr(strategy, "wrapped_strategy", strategy)
        if type(s).__name__ == "SampledFromStrategy" and tuple(s.elements) == OUT_DTYPES:
            return self.out
        return self.tour.draw(strategy, label)


def descale(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """float32 descales log-uniform in [2**-4, 2**4], none equal to 1."""
    d = np.exp2(rng.uniform(-LOG2_SPAN, LOG2_SPAN, size=shape)).astype(np.float32)
    return np.where(d == 1, np.float32(1.5), d)


def quantise(rng: np.random.Generator, x: np.ndarray, dtype: str, shape: tuple[int, ...]):
    """(stored, descale): x / descale cast to ``dtype``, clipped to half its largest finite value
    (nothing saturates), and the float32 descale of ``shape`` (broadcastable to (*batch, H))."""
    d = descale(rng, shape)
    d_b = d.astype(np.float64)[..., :, None, None] if d.ndim else np.float64(d)  # (..., H, 1, 1)
    top = float(ml_dtypes.finfo(FP8_NUMPY[dtype]).max) / 2
    stored = np.clip(x / d_b, -top, top).astype(FP8_NUMPY[dtype])
    return stored, d


def _fp8_case(draw, dtype: str, features: tuple[str, ...]) -> FP8Case:
    feature = draw(st.sampled_from(features))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    tags = {feature, dtype}
    every = feature == "combined"

    batch = draw(st.sampled_from([(2,), (), (1, 2)]))
    hkv = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([2, 3])) if feature in ("gqa", "combined") else 1
    hq = hkv * group
    n, m = draw(st.sampled_from(SIDES)), draw(st.sampled_from(SIDES))
    dk = draw(st.sampled_from(DIMS))
    dv = draw(st.sampled_from(DIMS)) if every else dk
    out_dtype = draw(st.sampled_from(OUT_DTYPES))
    tags.add(f"out_{out_dtype}")
    if group > 1:
        tags.add("gqa")
    # peaked rows: logits of tens, so one key takes nearly all of a row's weight
    magnitude = float(draw(st.sampled_from([2.0, 3.0]))) if feature in ("peaked", "combined") else 1.0
    if magnitude > 1:
        tags.add("peaked")

    # the descale's shape: FA3's (batch, Hkv), one per head, or one per tensor
    dshape = draw(st.sampled_from([(*batch, hkv), (hkv,), ()]))
    q64 = rng.standard_normal((*batch, hq, n, dk)) * magnitude
    k64 = rng.standard_normal((*batch, hkv, m, dk)) * magnitude
    v64 = rng.standard_normal((*batch, hkv, m, dv))
    options: dict[str, Any] = {"out_dtype": out_dtype}
    if feature == "wide_q" or (every and draw(st.booleans())):
        wide = draw(st.sampled_from(WIDE_Q_DTYPES))
        q = q64.astype(ml_dtypes.bfloat16 if wide == "bfloat16" else np.dtype(wide))
        tags.add("wide_q")
    else:
        q, qd = quantise(rng, _per_kv_head(q64, hkv, group), dtype, dshape)
        q = q.reshape(q64.shape)
        options["q_descale"] = qd
    k, options["k_descale"] = quantise(rng, k64, dtype, dshape)
    v, options["v_descale"] = quantise(rng, v64, dtype, dshape)

    if feature in ("causal_lower_right_lengths", "combined"):
        options["causal"] = "lower_right_lengths"
        options["kv_lengths"] = rng.integers(min(1, m), m + 1, size=batch)
        if draw(st.booleans()):
            options["q_lengths"] = rng.integers(0, n + 1, size=batch)
    if feature in ("window", "combined"):
        options["window"] = (draw(st.integers(0, 4)), draw(st.integers(0, 4)))
        if feature == "window" and draw(st.booleans()):
            options["causal"] = "lower_right"
    if feature in ("softcap", "combined"):
        options["softcap"] = float(draw(st.sampled_from([5.0, 20.0, 2.5])))
    if feature in ("scale", "combined"):
        options["scale"] = float(draw(st.sampled_from([0.3, 0.05, 1.7])))
    if every or draw(st.booleans()):
        options["return_lse"] = True
    for name in ("causal", "window", "softcap", "scale", "kv_lengths", "q_lengths"):
        if name in options:
            tags.add(name if name != "causal" else f"causal_{options['causal']}")
    if options.get("return_lse"):
        tags.add("lse")
    return FP8Case(feature, dtype, q, k, v, options, frozenset(tags), seed)


def _per_kv_head(q: np.ndarray, hkv: int, group: int) -> np.ndarray:
    """(..., Hq, n, dk) -> (..., Hkv, G * n, dk): query heads grouped under the kv head whose
    descale they share, so `quantise` scales each group by its kv head's descale."""
    *b, _, n, dk = q.shape
    return q.reshape(*b, hkv, group * n, dk)  # (..., Hkv, G * n, dk)


_fp8_cases = st.composite(_fp8_case)
