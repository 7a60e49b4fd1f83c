"""Hypothesis strategies, oracles and tolerances for the lsh_attention conformance properties.

Shape letters as in `attnspec.spec.lsh`. A drawn `LSHCase` holds NumPy inputs already rounded to
the case dtype, float32 rotations from `lsh_rotations`, the keyword options and the feature it
exercises. Sizes come from small fixed menus (so JAX reuses its compiled functions).

Two tolerances are derived here, both documented on the spec page (spec/README.md, "LSH
conformance"):

* Bucket margin threshold. A backend hashes in its compute dtype ct (float32 for 16-bit and
  float32 inputs, float64 for float64). The inputs and the float32 rotations are exact in ct,
  so each projection p = x[t] . R[:, r, k] is a d-term dot product with error at most
  E = gamma_d * (|x[t]| . |R[:, r, k]|), gamma_d = d u / (1 - d u), u = eps(ct) / 2, in any
  summation order. Its argmax can differ from the golden's only where the golden's top-2 margin
  is <= 2 * max_k E (and that bound is > 0; x[t] = 0 gives exact ties everywhere). Such
  positions are *low-margin*: their buckets are not compared, and a batch element holding one is
  excluded from output comparisons (one moved bucket shifts the chunk boundaries of its whole
  round). Both counts go into the verdict's ``reason``.
* Output tolerance, the rule of `attnspec.spec.tolerance` with LSH's sizes: allowed = K * err_ref
  + eps(D) * V * (1 + sqrt(m) + 2 * sqrt(d) * Lg), where err_ref is the error of `dense_lsh` run
  with every intermediate rounded to D (float32 arithmetic for 16-bit D), m = 2C * nh (a row is a
  softmax over at most 2C keys per round, nh rounds), V = max |v| and Lg = scale * max ||x[i]||
  (|x[i] . k_hat[j]| <= ||x[i]|| as keys are unit length).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from attnspec.conformance.hypothesis_helpers import DIMS, NP_DTYPES, DrawnCase, array_source
from attnspec.spec.lsh import NORM_EPS, SELF_LOGIT, lsh_attention, lsh_bucket_margins, lsh_rotations
from attnspec.spec.tolerance import K, compare, eps

LSH_FEATURES = (
    "plain",
    "causal",
    "kv_lengths",
    "dedup",
    "ragged",
    "hashes",
    "scale",
    "rank2",
    "batch_broadcast",
    "masked_nonfinite",
    "combined",
)
CHUNKS = (1, 2, 4, 8)
BUCKETS = (2, 4, 8)


@dataclass
class LSHCase(DrawnCase):
    ARRAYS = (("x", "x"), ("v", "v"), ("rotations", "rotations"))
    feature: str
    dtype: str
    x: np.ndarray
    v: np.ndarray
    rotations: np.ndarray
    options: dict[str, Any] = field(default_factory=dict)
    tags: frozenset[str] = frozenset()
    seed: int = 0

    # the judge fixture reads q/k/v shapes (sdpa's vocabulary): x is both query and key
    @property
    def q(self) -> np.ndarray:
        return self.x

    @property
    def k(self) -> np.ndarray:
        return self.x

    def repro(self, backend_name: str, device: str | None, **extra: Any) -> str:
        """A self-contained snippet that rebuilds the inputs and calls backend and golden."""
        dt = "ml_dtypes.bfloat16" if self.dtype == "bfloat16" else f"np.{self.dtype}"

        opts = [
            f"{k}={array_source(v, dt) if isinstance(v, np.ndarray) else repr(v)}"
            for k, v in sorted({**self.options, **extra}.items())
        ]
        dev = f", device={device!r}" if device else ""
        call = ", ".join(["x", "v", "rotations=rotations", *opts])
        bcall = ", ".join(
            [
                "to(x)",
                "to(v)",
                "rotations=to(rotations)",
                *(f"{o.split('=')[0]}=to({o.split('=', 1)[1]})" for o in opts),
            ]
        )
        return "\n".join(
            [
                "import numpy as np, ml_dtypes",
                "import attnspec.spec",
                "from attnspec.conformance.pytest_helpers import resolve_backend",
                f"b = resolve_backend({backend_name!r})",
                f"x = {array_source(self.x, dt)}",
                f"v = {array_source(self.v, dt)}",
                f"rotations = {array_source(self.rotations, 'np.float32')}",
                f"golden = attnspec.spec.lsh_attention({call})",
                f"to = lambda a: b.asarray(a{dev}) if isinstance(a, np.ndarray) else a",
                f"out = b.lsh_attention({bcall})",
                "print(np.abs(b.to_numpy(out).astype(float) - golden.astype(float)).max())",
            ]
        )


@st.composite
def lsh_cases(draw, dtype: str, features: tuple[str, ...] = LSH_FEATURES) -> LSHCase:
    """One lsh_attention call exercising a drawn feature, in ``dtype``."""
    feature = draw(st.sampled_from(features))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    tags = {feature, dtype}

    batch = () if feature == "rank2" else draw(st.sampled_from([(), (2,), (2, 3)]))
    C = draw(st.sampled_from(CHUNKS))
    chunks = draw(st.sampled_from([1, 2, 3, 4]))
    L = C * chunks
    if feature in ("ragged", "combined") and C > 1:
        L -= draw(st.integers(1, C - 1))  # not a multiple of C
    nh = draw(st.sampled_from([1, 2, 3, 4] if feature in ("hashes", "combined") else [1, 2]))
    if nh * chunks < 2:
        nh = 2  # the spec needs at least two chunks
    nb = draw(st.sampled_from(BUCKETS))
    d = draw(st.sampled_from(DIMS))
    dv = draw(st.sampled_from(DIMS)) if feature in ("plain", "combined") else d

    x_batch = v_batch = batch
    if feature == "batch_broadcast" and batch:
        v_batch = (1,) * len(batch)
    x = rng.standard_normal((*x_batch, L, d))
    v = rng.standard_normal((*v_batch, L, dv))
    if L > 1 and draw(st.booleans()):
        x[..., rng.integers(0, L), :] = 0.0  # a zero vector: hashes to bucket 0, k_hat = 0
    rotations = lsh_rotations(int(rng.integers(0, 2**31)), d, nh, nb)

    options: dict[str, Any] = {"chunk_length": C}
    if feature in ("causal", "combined") or (feature == "masked_nonfinite" and draw(st.booleans())):
        options["causal"] = True
    if feature in ("dedup", "combined"):
        options["dedup"] = True
    if feature in ("scale", "combined"):
        options["scale"] = float(draw(st.sampled_from([0.25, 2.0, 4.0])))
    if feature in ("kv_lengths", "masked_nonfinite", "combined") and batch:
        full = np.broadcast_shapes(x_batch, v_batch)
        kv = rng.integers(0 if feature == "kv_lengths" else 1, L + 1, size=full)
        options["kv_lengths"] = kv
        if feature == "masked_nonfinite":
            poison = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
            hidden = np.arange(L) >= kv[..., None]  # (*batch, L)
            x = np.where(hidden[..., None], poison, x)
            v = np.where(hidden[..., None], poison, v)
    npdt = NP_DTYPES[dtype]
    case = LSHCase(feature, dtype, x.astype(npdt), v.astype(npdt), rotations, options, frozenset(), seed)
    for name in ("causal", "dedup", "scale", "kv_lengths"):
        if name in options:
            tags.add(name)
    if L % C:
        tags.add("ragged")
    if nh > 1:
        tags.add("hashes")
    if not (np.isfinite(case.x).all() and np.isfinite(case.v).all()):
        tags.add("masked_nonfinite")
    return replace(case, tags=frozenset(tags))


# -- oracles ------------------------------------------------------------------------------------


def backend_inputs(backend, case: LSHCase, device) -> tuple[Any, Any, dict[str, Any]]:
    """x, v and the keywords of the case's call (rotations among them), as ``backend``'s arrays
    on ``device``."""

    def on(a):
        return backend.asarray(a, device=device)

    options = {k: on(v) if isinstance(v, np.ndarray) else v for k, v in case.options.items()}
    return on(case.x), on(case.v), {"rotations": on(case.rotations), **options}


def golden(case: LSHCase, **extra: Any):
    """(out float64, buckets) of the spec, on the case's float64 inputs (before final rounding)."""
    o = {k: v for k, v in {**case.options, **extra}.items()}
    with np.errstate(invalid="ignore"):  # NaN x of absent positions, in the hash matmul
        return lsh_attention(
            case.x.astype(np.float64),
            case.v.astype(np.float64),
            rotations=case.rotations,
            return_buckets=True,
            **o,
        )


def lengths(case: LSHCase) -> np.ndarray:
    """kv_length per batch element, broadcast to the full batch (L when not given)."""
    x, v = case.x, case.v
    batch = np.broadcast_shapes(x.shape[:-2], v.shape[:-2])
    kv = case.options.get("kv_lengths")
    return np.broadcast_to(np.asarray(x.shape[-2] if kv is None else kv), batch)


def window_counts(buckets: np.ndarray, n_buckets: int, C: int) -> np.ndarray:
    """Per round, how many times key j sits in query i's window: (*batch, nh, Lp, Lp) ints.

    Re-derived from steps 3 and 5 of the spec text, from the buckets the sort used (padded
    positions carry n_buckets), so an oracle can compute each round densely.
    """
    *batch, nh, L = buckets.shape
    Lp = -(-L // C) * C
    eff = np.full((*batch, nh, Lp), n_buckets)
    eff[..., :L] = buckets
    counts = np.zeros((*batch, nh, Lp, Lp), np.int64)
    for b in np.ndindex(*batch):
        slots = np.concatenate([np.argsort(eff[b][r] * Lp + np.arange(Lp), kind="stable") for r in range(nh)])
        chunks = slots.reshape(-1, C)  # (nc, C)
        for r in range(nh):
            for s in range(Lp):
                c = (r * Lp + s) // C
                window = np.concatenate([chunks[c - 1], chunks[c]])  # chunks[-1] wraps
                np.add.at(counts[b][r], (slots[r * Lp + s], window), 1)
    return counts


def dense_lsh(case: LSHCase, buckets: np.ndarray, rnd=None, compute=np.float64) -> np.ndarray:
    """LSH attention as dense (L, L) softmaxes, one per round, given the sort's buckets.

    A round's window becomes a multiplicity matrix (a key met twice counts twice: log(count) is
    added to its logit), so each round is a plain masked softmax. ``rnd`` rounds every stored
    intermediate (the tolerance rule's low-precision reference); None keeps float64. Small L only.
    """
    rnd = rnd or (lambda a: a)
    C = case.options["chunk_length"]
    scale = case.options.get("scale") or 1.0
    nb = 2 * case.rotations.shape[2]
    x, v = case.x.astype(compute), case.v.astype(compute)
    batch = np.broadcast_shapes(x.shape[:-2], v.shape[:-2])
    L = x.shape[-2]
    x = np.broadcast_to(x, (*batch, *x.shape[-2:]))
    v = np.broadcast_to(v, (*batch, *v.shape[-2:]))
    counts = window_counts(buckets, nb, C)[..., :L, :L]  # (*batch, nh, L, L)
    n = lengths(case)[..., None, None, None]  # (*batch, 1, 1, 1)
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    vis = (counts > 0) & (j < n) & (i < n)  # (*batch, nh, L, L)
    if case.options.get("causal"):
        vis &= j <= i
    with np.errstate(all="ignore"):
        norm = np.sqrt((x * x).sum(-1, keepdims=True))
        k_hat = rnd(x / np.maximum(norm, NORM_EPS))  # (*batch, L, d)
        s = rnd(scale * (x @ np.swapaxes(k_hat, -1, -2)))[..., None, :, :]  # (*batch, 1, L, L)
        s = np.where(i == j, SELF_LOGIT, s) + np.log(np.maximum(counts, 1))  # (*batch, nh, L, L)
        if case.options.get("dedup"):
            s = s - np.log(np.maximum(counts.sum(-3, keepdims=True), 1))
        s = np.where(vis, rnd(s), -np.inf)
        top = np.max(s, -1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0)
        e = rnd(np.exp(s - top))
        den = rnd(e.sum(-1, keepdims=True))
        w = rnd(e / np.where(den == 0, 1, den))
        lse = rnd(top + np.log(np.where(den == 0, 1, den)))[..., 0]  # (*batch, nh, L)
        vz = np.where(np.isfinite(v), v, 0)[..., None, :, :]
        o = rnd(w @ vz)  # (*batch, nh, L, dv)
        bad = np.where(np.isfinite(v), 0, v)[..., None, None, :, :]  # non-finite v, where visible
        o = o + np.where(vis[..., None], w[..., None] * bad, 0).sum(-2)
        rw = rnd(np.exp(lse - lse.max(-2, keepdims=True)))
        rw = rnd(rw / rw.sum(-2, keepdims=True))
        out = rnd((rw[..., None] * o).sum(-3))  # (*batch, L, dv)
    return np.where((np.arange(L) < lengths(case)[..., None])[..., None], out, 0)


def margin_threshold(case: LSHCase) -> np.ndarray:
    """2E per (*batch, nh, L): below it a backend's bucket may differ from the golden's."""
    ct = np.float64 if case.dtype == "float64" else np.float32
    d = case.x.shape[-1]
    u = float(np.finfo(ct).eps) / 2
    gamma = d * u / (1 - d * u)
    ax = np.abs(np.where(np.isfinite(case.x), case.x, 0).astype(np.float64))  # (..., L, d)
    ar = np.abs(case.rotations.astype(np.float64))  # (d, nh, K)
    size = np.einsum("...ld,dhk->...hlk", ax, ar).max(-1)  # (..., nh, L)
    return 2 * gamma * size


@dataclass
class MarginReport:
    """Low-margin positions of a case and the batch elements they exclude."""

    low: np.ndarray  # (*batch, nh, L) bool: unpadded positions under the threshold
    excluded: np.ndarray  # (*batch,) bool

    @property
    def text(self) -> str:
        return (
            f"low-margin positions {int(self.low.sum())} of {self.low.size} (buckets not compared); "
            f"batch elements excluded from the output comparison {int(self.excluded.sum())} of "
            f"{self.excluded.size}"
        )


def margins(case: LSHCase) -> MarginReport:
    batch = np.broadcast_shapes(case.x.shape[:-2], case.v.shape[:-2])
    x = np.broadcast_to(case.x, (*batch, *case.x.shape[-2:]))
    with np.errstate(invalid="ignore"):
        m = lsh_bucket_margins(np.where(np.isfinite(x), x, 0), case.rotations)  # (*batch, nh, L)
    thr = np.broadcast_to(margin_threshold(case), m.shape)
    unpadded = (np.arange(x.shape[-2]) < lengths(case)[..., None])[..., None, :]  # (*batch, 1, L)
    low = (m <= thr) & (thr > 0) & unpadded  # thr = 0: x[t] = 0, every precision gets exact ties
    return MarginReport(low, np.asarray(low.reshape(*batch, -1).any(-1) if batch else low.any()))


def allowed(case: LSHCase, g_out: np.ndarray, buckets: np.ndarray) -> float:
    """The output tolerance of the module docstring, for one case."""
    D = case.dtype
    ct = np.float32 if D in ("float16", "bfloat16") else NP_DTYPES[D]
    dt = NP_DTYPES[D]

    def rnd(a):
        return a.astype(dt).astype(ct)

    ref = dense_lsh(case, buckets, rnd, ct)
    err_ref = compare(ref.astype(np.float64), g_out, np.inf).max_abs_err
    err_ref = 0.0 if not math.isfinite(err_ref) else err_ref
    C, nh, d = case.options["chunk_length"], case.rotations.shape[1], case.x.shape[-1]
    v64 = case.v.astype(np.float64)
    V = float(np.abs(v64[np.isfinite(v64)]).max(initial=0.0))
    x64 = np.where(np.isfinite(case.x), case.x, 0).astype(np.float64)
    Lg = (case.options.get("scale") or 1.0) * float(np.sqrt((x64 * x64).sum(-1)).max(initial=0.0))
    floor = eps(D) * V * (1.0 + math.sqrt(2 * C * nh) + 2.0 * math.sqrt(d) * Lg)
    return K * err_ref + floor


# -- bad inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadLSH:
    """One call lsh_attention refuses: shapes and dtypes of x, v, rotations, options, the message."""

    id: str
    match: str  # regex, without the function name (it holds for numpy.lsh_attention and the rest)
    x: tuple[int, ...] = (2, 8, 4)
    v: tuple[int, ...] = (2, 8, 3)
    rotations: tuple[int, ...] = (4, 2, 2)
    dtypes: tuple[str, str, str] = ("float32", "float32", "float32")
    options: dict[str, Any] = field(default_factory=lambda: {"chunk_length": 4})

    def build(self) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], dict[str, Any]]:
        rng = np.random.default_rng(0)
        x, v, r = (
            rng.standard_normal(s).astype(dt) for s, dt in zip((self.x, self.v, self.rotations), self.dtypes)
        )
        return (x, v, r), dict(self.options)


# n_buckets is 2 * rotations.shape[2], so it cannot be odd here: `lsh_rotations` refuses odd ones,
# and a rotations array with no bucket pair (n_buckets = 0) is refused below.
LSH_BAD_INPUTS: tuple[BadLSH, ...] = (
    BadLSH("x_rank_1", r"x\.ndim=1 must be >= 2", x=(4,)),
    BadLSH("v_rank_1", r"v\.ndim=1 must be >= 2", v=(3,)),
    BadLSH("v_length", r"v\.shape\[-2\]=9 must equal x\.shape\[-2\]=8", v=(2, 9, 3)),
    BadLSH("dtype_mismatch", r"x and v must share one dtype", dtypes=("float32", "float64", "float32")),
    BadLSH(
        "rotations_int",
        r"rotations\.dtype=int64 must be float32 or float64",
        dtypes=("float32", "float32", "int64"),
    ),
    BadLSH("rotations_rank_2", r"rotations\.ndim=2 must be 3", rotations=(4, 4)),
    BadLSH("rotations_d", r"rotations\.shape\[0\]=5 must equal x\.shape\[-1\]=4", rotations=(5, 2, 2)),
    BadLSH("no_buckets", r"n_buckets must be an even number >= 2", rotations=(4, 2, 0)),
    BadLSH("no_hashes", r"rotations\.shape\[1\]=0 \(n_hashes\) must be >= 1", rotations=(4, 0, 2)),
    BadLSH("one_chunk", r"1 chunk\(s\), expected >= 2", rotations=(4, 1, 2), options={"chunk_length": 8}),
    BadLSH("chunk_length_0", r"chunk_length=0 must be an int >= 1", options={"chunk_length": 0}),
    BadLSH("chunk_length_float", r"chunk_length=4\.0 must be an int >= 1", options={"chunk_length": 4.0}),
    BadLSH("causal_str", r"causal='yes' must be a bool", options={"chunk_length": 4, "causal": "yes"}),
    BadLSH("dedup_int", r"dedup=1 must be a bool", options={"chunk_length": 4, "dedup": 1}),
    BadLSH("batch_mismatch", r"leading batch dims do not broadcast", v=(3, 8, 3)),
    BadLSH(
        "kv_lengths_over_L",
        r"kv_lengths must lie in \[0, L=8\]",
        options={"chunk_length": 4, "kv_lengths": np.array([9, 2])},
    ),
    BadLSH(
        "kv_lengths_shape",
        r"kv_lengths\.shape=\(3,\) must broadcast to the batch shape \(2,\)",
        options={"chunk_length": 4, "kv_lengths": np.array([1, 2, 3])},
    ),
    BadLSH(
        "scale_negative", r"scale=-1\.0 must be finite and > 0", options={"chunk_length": 4, "scale": -1.0}
    ),
)
