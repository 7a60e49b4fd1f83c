"""Reformer LSH attention with shared query/key: the golden definition.

Shape letters, used in every shape comment below:
    ...  leading batch dims (batch, heads, ...); x and v broadcast against each other
    L    sequence length (queries and keys are the same L positions)
    d    query/key dim;  dv  value dim
    nh   hashing rounds (n_hashes);  nb  buckets (n_buckets, even);  K = nb // 2
    C    chunk_length;  Lp = C * ceil(L / C), one round padded to whole chunks
    nc   chunks, nh * Lp / C;  B  the leading dims flattened into one

For one batch element: x (L, d) is both query and key, v (L, dv), n = kv_length (default L).

1. Rotations R (d, nh, K) are data. ``lsh_rotations(seed, d, nh, nb)`` draws them as
   ``np.random.default_rng(seed).standard_normal((d, nh, K), dtype=np.float32)``; every backend
   is handed the same array and never draws its own. float32 because every framework holds it
   bit for bit and it converts exactly to float64.
2. Hash. For round r and position t, p = x[t] @ R[:, r, :] (K values), computed in **float64**
   from the exact inputs, and ``bucket[r, t] = argmax(concat(p, -p))`` in [0, nb), first index on
   ties (so x[t] = 0 hashes to 0). The top-2 margin (best minus second best of that concat) is
   exposed by `lsh_bucket_margins`: a backend that computes p less precisely can only disagree
   on a bucket whose margin is below twice its projection error (see `lsh_bucket_margins`).
3. Sort. Padded positions t >= n, and the positions L <= t < Lp added by step 9, take bucket nb:
   after every real bucket, so they sit at the end of each round and their content can change
   nothing (HF Reformer gives padding tokens the same extra bucket). Within each round positions
   are sorted by (bucket, position); rounds are concatenated in order: nh * Lp slots sorted by
   (round, bucket, position). slot(r, t) is the inverse permutation.
4. Logits. Keys are the unit-normalized x: k_hat[t] = x[t] / max(||x[t]||_2, NORM_EPS), and
   logit(i, j) = scale * (x[i] . k_hat[j]). scale defaults to **1**: the keys are already unit
   length, so the logit scale is an explicit choice (|logit| <= scale * ||x[i]||); 1 / sqrt(d)
   would shrink a second time what normalization already bounded.
5. Chunks. The nh * Lp slots are cut into nc chunks of C. A slot in chunk c attends to the 2C
   slots of chunk (c - 1) mod nc followed by chunk c: the look-back wraps globally (the first
   chunk of round r sees the last chunk of round r - 1; the very first sees the very last).
6. Visibility, by original positions (query i, key j in its window):
   - j >= n is absent (that covers the step-9 positions, as n <= L);
   - with ``causal``, j > i is absent;
   - j == i is visible, but its logit is replaced by SELF_LOGIT, so a query sees itself only
     when nothing else is visible (then it gets weight 1);
   - a padded query row (i >= n) sees nothing and produces 0.
   Absent keys get weight exactly 0 and their values (NaN included) never reach the output.
7. Per slot row, a max-subtracted softmax over its visible window entries and its logsumexp
   lse_r. Undo the sort (row of query i in round r is slot(r, i)) and combine the rounds:
   out[i] = sum_r exp(lse_r - logsumexp_r(lse_r)) * out_r[i].
8. ``dedup=True``: count(i, j) = the number of slots, over all nh windows of query i (duplicates
   within one window included), that hold key j. Every entry for j gets logit - log(count(i, j))
   (after the self replacement). The result is then exactly the softmax over the union of the
   query's windows, each key once: sum_r exp(lse_r) = sum over distinct visible j of exp(logit).
9. L not a multiple of C: positions L..Lp-1 are added as absent keys (step 3) and the output is
   sliced back to L. nc must be >= 2, or a chunk's "previous chunk" would be itself (SpecError).
   L = 0 is allowed and gives an empty output.

Constants:
    NORM_EPS = 1e-12: the eps of torch.nn.functional.normalize (which reformer-pytorch uses for
        these keys), so a backend can call it as is; it only matters for ||x|| < 1e-12.
    SELF_LOGIT = -5e4: far below any real logit, so whenever another key is visible the self
        weight is exp(-5e4 + scale * ||x[i]||) or less, which is exactly 0.0 in float64 while
        scale * ||x[i]|| < ~49000; and finite, so a self-only row gets weight 1 rather than 0/0.
        -5e4 is representable in float16 (max 65504), so a backend holding logits in float16 can
        write it without turning it into -inf (reformer-pytorch uses -5e4 for that reason; HF
        and trax use -1e5 in float32). The result is the same for any such constant.

Who differs (their normalization and masking, not the algorithm): HF Reformer and trax scale
keys by rsqrt(mean(x^2) + 1e-6) / sqrt(d) (HF) or rsqrt(mean(x^2) + 1e-6) (trax), and mask with
large finite constants, so masked NaN values leak; trax subtracts its self constant instead of
replacing the logit. `attnspec.spec.reformer` reproduces HF's and reformer-pytorch's layers
through the golden's core (`attnspec.spec._lsh_core`) with the switches of its `_Semantics`; the
spec page lists every difference.

Where the code is: this module validates, hashes and holds the public functions;
`attnspec.spec._lsh_core` computes steps 3-9 vectorized (shared with the gradient and the Reformer
reproductions); `attnspec.spec._lsh_loops` is the same definition as plain loops, the independent
check the tests compare against.

Causality caveat: with ``causal=True`` no later *value* or *key* reaches an earlier output, but
later positions' *hashes* move chunk boundaries, so changing x at later positions can change
which earlier keys share a window with an earlier query. That is Reformer's design, not a bug
of this definition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from attnspec.errors import SpecError
from attnspec.spec._lsh_core import NORM_EPS, SELF_LOGIT, _lsh_core, _rotated
from attnspec.spec.dtypes import round_to
from attnspec.spec.options import LSH_OPTIONS, take
from attnspec.spec.validate import (
    FLOAT_DTYPES,
    ArrayInfo,
    check_lengths,
    check_scale,
    is_int,
    numpy_info,
)

__all__ = [
    "NORM_EPS",
    "SELF_LOGIT",
    "LSHPlan",
    "lsh_attention",
    "lsh_bucket_margins",
    "lsh_buckets",
    "lsh_rotations",
    "validate_lsh",
]

ROTATION_DTYPES = ("float32", "float64")


def lsh_rotations(seed: int, d: int, n_hashes: int, n_buckets: int) -> np.ndarray:
    """Random rotations (d, n_hashes, n_buckets // 2), float32, standard normal.

    Exactly ``np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)``. The array,
    not the seed, is the input backends receive: NumPy does not promise the same stream across
    versions, so conformance runs pass the array itself.
    """
    fn = "lsh_rotations"
    for name, value, low in (("seed", seed, 0), ("d", d, 1), ("n_hashes", n_hashes, 1)):
        if not is_int(value) or value < low:
            raise SpecError(f"{fn}: {name}={value!r} must be an int >= {low}")
    if not is_int(n_buckets) or n_buckets < 2 or n_buckets % 2:
        raise SpecError(
            f"{fn}: n_buckets={n_buckets!r} must be an even int >= 2 "
            "(the hash is an argmax over [x R, -x R], 2 * (n_buckets // 2) values)"
        )
    shape = (int(d), int(n_hashes), int(n_buckets) // 2)
    return np.random.default_rng(int(seed)).standard_normal(shape, dtype=np.float32)


def _check_x_rotations(fn: str, x: ArrayInfo, rotations: ArrayInfo) -> None:
    if len(x.shape) < 2:
        raise SpecError(
            f"{fn}: x.ndim={len(x.shape)} must be >= 2 (expected (..., L, d)), got shape {x.shape}"
        )
    if x.dtype not in FLOAT_DTYPES:
        raise SpecError(f"{fn}: x.dtype={x.dtype} must be one of {', '.join(FLOAT_DTYPES)}")
    d = x.shape[-1]
    if d < 1:
        raise SpecError(f"{fn}: x.shape[-1]={d} (the query/key dim d) must be >= 1")
    if rotations.dtype not in ROTATION_DTYPES:
        raise SpecError(f"{fn}: rotations.dtype={rotations.dtype} must be float32 or float64")
    if len(rotations.shape) != 3:
        raise SpecError(
            f"{fn}: rotations.ndim={len(rotations.shape)} must be 3 (d, n_hashes, n_buckets // 2), "
            f"got shape {rotations.shape}"
        )
    if rotations.shape[0] != d:
        raise SpecError(f"{fn}: rotations.shape[0]={rotations.shape[0]} must equal x.shape[-1]={d}")
    if rotations.shape[1] < 1:
        raise SpecError(f"{fn}: rotations.shape[1]={rotations.shape[1]} (n_hashes) must be >= 1")
    if rotations.shape[2] < 1:
        raise SpecError(
            f"{fn}: rotations.shape[2]={rotations.shape[2]} (n_buckets // 2) must be >= 1, "
            "i.e. n_buckets must be an even number >= 2"
        )


@dataclass(frozen=True)
class LSHPlan:
    """A validated lsh_attention call: sizes and normalized options."""

    batch: tuple[int, ...]
    L: int
    d: int
    dv: int
    n_hashes: int
    n_buckets: int
    chunk_length: int
    dtype: str
    scale: float
    causal: bool
    dedup: bool
    kv_lengths: np.ndarray | None  # int64, broadcast to `batch`

    @property
    def padded_length(self) -> int:
        """Lp: one round padded to whole chunks."""
        return -(-self.L // self.chunk_length) * self.chunk_length

    @property
    def n_chunks(self) -> int:
        return self.n_hashes * self.padded_length // self.chunk_length


def plan_lsh_numpy(fn: str, x, v, rotations, **checks) -> LSHPlan:
    """`validate_lsh` of a call on NumPy arrays (the golden, its loops and its vjp plan through it);
    ``checks``: the call's other keywords but return_buckets (chunk_length, causal, ...)."""
    infos = (numpy_info(fn, name, a) for name, a in (("x", x), ("v", v), ("rotations", rotations)))
    return validate_lsh(fn, *infos, **checks)


def plan_lsh_call(
    fn: str, x, v, options, *, outputs: bool = True, info=numpy_info, lengths_to_numpy=None
) -> tuple[LSHPlan, dict]:
    """The plan of a call that takes lsh_attention's keywords as ``**options`` (its vjp, its loops,
    every backend's), and those keywords with their defaults (`take` of `LSH_OPTIONS`;
    ``outputs``: return_buckets among them). A backend passes its own ``info(fn, name, array)``
    and ``lengths_to_numpy`` for its arrays; the spec's checks, so the spec's messages, either way."""
    o = take(fn, options, outputs=outputs, table=LSH_OPTIONS)
    checks = {k: value for k, value in o.items() if k not in ("rotations", "kv_lengths", "return_buckets")}
    kv = o["kv_lengths"] if lengths_to_numpy is None else lengths_to_numpy(o["kv_lengths"])
    infos = (info(fn, name, a) for name, a in (("x", x), ("v", v), ("rotations", o["rotations"])))
    return validate_lsh(fn, *infos, kv_lengths=kv, **checks), o


def validate_lsh(
    fn: str,
    x: ArrayInfo,
    v: ArrayInfo,
    rotations: ArrayInfo,
    *,
    chunk_length: object,
    causal: object = False,
    kv_lengths: object = None,
    dedup: object = False,
    scale: object = None,
) -> LSHPlan:
    """Check one lsh_attention call and return its plan; raise `SpecError` naming the first problem."""
    _check_x_rotations(fn, x, rotations)
    if len(v.shape) < 2:
        raise SpecError(
            f"{fn}: v.ndim={len(v.shape)} must be >= 2 (expected (..., L, dv)), got shape {v.shape}"
        )
    if v.dtype != x.dtype:
        raise SpecError(f"{fn}: x and v must share one dtype, got x.dtype={x.dtype}, v.dtype={v.dtype}")
    L, d = x.shape[-2:]
    if v.shape[-2] != L:
        raise SpecError(
            f"{fn}: v.shape[-2]={v.shape[-2]} must equal x.shape[-2]={L} (one value per position)"
        )
    try:
        batch = tuple(np.broadcast_shapes(x.shape[:-2], v.shape[:-2]))
    except ValueError:
        raise SpecError(
            f"{fn}: leading batch dims do not broadcast: x {x.shape[:-2]}, v {v.shape[:-2]}"
        ) from None
    if not is_int(chunk_length) or chunk_length < 1:
        raise SpecError(f"{fn}: chunk_length={chunk_length!r} must be an int >= 1")
    nh, C = rotations.shape[1], int(chunk_length)
    n_chunks = nh * -(-L // C)
    if L > 0 and n_chunks < 2:
        raise SpecError(
            f"{fn}: n_hashes * ceil(L / chunk_length) = {nh} * ceil({L} / {C}) = {n_chunks} chunk(s), "
            "expected >= 2 so that each chunk's previous chunk is a different one"
        )
    for name, flag in (("causal", causal), ("dedup", dedup)):
        if not isinstance(flag, (bool, np.bool_)):
            raise SpecError(f"{fn}: {name}={flag!r} must be a bool (True or False)")
    return LSHPlan(
        batch=batch,
        L=L,
        d=d,
        dv=v.shape[-1],
        n_hashes=nh,
        n_buckets=2 * rotations.shape[2],
        chunk_length=C,
        dtype=x.dtype,
        scale=1.0 if scale is None else check_scale(fn, scale, d),
        causal=bool(causal),
        dedup=bool(dedup),
        kv_lengths=check_lengths(fn, "kv_lengths", kv_lengths, batch, L, "L"),
    )


def _hash_inputs(fn: str, x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    info_x, info_r = numpy_info(fn, "x", x), numpy_info(fn, "rotations", rotations)
    _check_x_rotations(fn, info_x, info_r)
    return _rotated(x.astype(np.float64), rotations.astype(np.float64))


def lsh_buckets(x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Buckets (..., n_hashes, L), int64 in [0, n_buckets): step 2 of the module docstring.

    ``bucket[..., r, t] = argmax(concat(p, -p))`` with p = x[..., t, :] @ rotations[:, r, :],
    computed in float64, first index on ties. Padding is not applied here: `lsh_attention`
    (``return_buckets=True``) reports the buckets it sorted by, with n_buckets at padded positions.
    """
    return np.argmax(_hash_inputs("lsh_buckets", x, rotations), axis=-1).astype(np.int64)


def lsh_bucket_margins(x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    """Top-2 margins (..., n_hashes, L), float64 >= 0: best minus second best of concat(p, -p).

    A backend that computes p with unit roundoff u over d products has error at most
    E = gamma_d * max_k (|x[t]| @ |R[:, r, :]|)_k on every entry, gamma_d = d u / (1 - d u)
    (plus u once more per product if it rounds x or R to a narrower format first). Its argmax
    can differ from the golden's only where margin <= 2E. One changed bucket moves the chunk
    boundaries of its whole round, so a conformance check must skip (or regenerate) the whole
    batch element when any unpadded position falls under that threshold, not just that position.
    """
    full = _hash_inputs("lsh_bucket_margins", x, rotations)  # (..., nh, L, nb)
    top2 = np.sort(full, axis=-1)[..., -2:]  # (..., nh, L, 2)
    return top2[..., 1] - top2[..., 0]


def lsh_attention(
    x: np.ndarray,
    v: np.ndarray,
    *,
    rotations: np.ndarray,
    chunk_length: int,
    causal: bool = False,
    kv_lengths: np.ndarray | int | None = None,
    dedup: bool = False,
    scale: float | None = None,
    return_buckets: bool = False,
):
    """Reformer LSH attention with shared query/key, exactly as the module docstring defines it.

    Args:
        x: (..., L, d), the shared queries and keys. v: (..., L, dv), same dtype (float16,
            bfloat16, float32 or float64). Leading dims broadcast like NumPy.
        rotations: (d, n_hashes, n_buckets // 2), float32 or float64 (see `lsh_rotations`).
        chunk_length: C >= 1; n_hashes * ceil(L / C) must be >= 2.
        causal: bool; key j is absent for query i when j > i.
        kv_lengths: ints broadcastable to the leading dims; positions >= kv_length are absent
            keys, take no part in the hash order, and their query rows produce 0.
        dedup: subtract log(count) for keys a query meets more than once (exact union softmax).
        scale: multiplies x[i] . k_hat[j]; default 1 (the keys are unit length).
        return_buckets: also return the buckets the sort used, int64 (..., n_hashes, L):
            `lsh_buckets` at unpadded positions, n_buckets at padded ones.

    Returns out (..., L, dv) in x's dtype (and the buckets). Computed in float64; memory is
    O(n_hashes * L * 2C) per batch element (times d or dv where vectors are gathered); no L x L
    array is built.
    """
    fn = "lsh_attention"
    checks = dict(chunk_length=chunk_length, causal=causal, kv_lengths=kv_lengths, dedup=dedup, scale=scale)
    p = plan_lsh_numpy(fn, x, v, rotations, **checks)
    B, L = math.prod(p.batch), p.L
    x64 = np.broadcast_to(x.astype(np.float64), (*p.batch, L, p.d)).reshape(B, L, p.d)  # (B, L, d)
    v64 = np.broadcast_to(v.astype(np.float64), (*p.batch, L, p.dv)).reshape(B, L, p.dv)  # (B, L, dv)
    kv = np.full(B, L) if p.kv_lengths is None else p.kv_lengths.reshape(B)  # (B,)
    buckets = np.argmax(_rotated(x64, rotations.astype(np.float64)), axis=-1)  # (B, nh, L)
    if B == 0 or L == 0:
        out, eff = np.zeros((B, L, p.dv)), buckets
    else:
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            out, eff = _lsh_core(p, x64, v64, kv, buckets)
    out = round_to(out, x.dtype).reshape(*p.batch, L, p.dv)
    if not return_buckets:
        return out
    return out, eff.astype(np.int64).reshape(*p.batch, p.n_hashes, L)
