"""The benchmark grid and the implementations it times, for `attnspec.bench.run`.

Shape letters: B batch, H heads (query and key/value heads alike), n queries, m keys (n == m in
every grid shape, so causal alignment does not matter: "upper_left" is passed), d head dim.
LSH rows use L = n = m positions; their x is shared query/key.

Implementations:
    adapter  the backend's ``sdpa`` (the attnspec contract, with the backend's fix-ups)
    native   the framework primitive called directly: torch F.scaled_dot_product_attention,
             jax.nn.dot_product_attention under jax.jit (given (B, n, H, d) inputs, its own
             layout, so the adapter's transposes count as adapter overhead); for the numpy
             backend the golden `attnspec.spec.sdpa`
    golden   `attnspec.spec.sdpa` in float64 (numpy backend only)
    blocked  `attnspec.spec.sdpa_blocked` in float64, the O(n)-memory golden (numpy backend only)
    lsh      the backend's ``lsh_attention`` when it implements one, else (numpy backend)
             `attnspec.spec.lsh_attention`; chunk_length 64, 2 hashes, L // 64 buckets
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from attnspec.bench.measure import is_cpu
from attnspec.spec.sdpa import BLOCKED_MIN_LOGITS

__all__ = [
    "GRIDS",
    "IMPLEMENTATIONS",
    "Case",
    "Grid",
    "Prepared",
    "default_dtypes",
    "estimated_seconds",
    "framework_of",
    "grid_cases",
    "human_bytes",
    "human_seconds",
    "prepare",
    "resolve_backend",
    "static_skip",
    "workspace_bytes",
]

LSH_CHUNK, LSH_HASHES = 64, 2
LSH_SCALING_L = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
#: "vjp" is the adapter's sdpa_vjp (forward and backward through the framework's autodiff), for
#: torch and jax only; its rows have pass "forward+backward" and the forward's dense FLOPs
IMPLEMENTATIONS = ("adapter", "native", "golden", "blocked", "lsh", "vjp")


@dataclass(frozen=True)
class Case:
    impl: str
    dtype: str
    B: int
    H: int
    n: int
    m: int
    d: int
    causal: bool = False

    @property
    def flops(self) -> int:
        """Dense-equivalent forward FLOPs: q k^T and w v, 2 * n * m * d each, per (batch, head).

        Counted in full for causal and LSH rows too, so their TFLOP/s is an effective rate
        (what dense attention would need), not the work they actually do.
        """
        return 4 * self.B * self.H * self.n * self.m * self.d

    @property
    def key(self) -> tuple:
        return (self.impl, self.dtype, self.B, self.H, self.n, self.m, self.d, self.causal)

    def shape_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k not in ("impl", "dtype")}

    def lsh_params(self) -> dict[str, int]:
        n_buckets = max(2, (self.n // LSH_CHUNK) // 2 * 2)
        return {"chunk_length": LSH_CHUNK, "n_hashes": LSH_HASHES, "n_buckets": n_buckets}

    def __str__(self) -> str:
        return (
            f"{self.impl} {self.dtype} B={self.B} H={self.H} n={self.n} m={self.m} "
            f"d={self.d}{' causal' if self.causal else ''}"
        )


@dataclass(frozen=True)
class Grid:
    dense: tuple[tuple[int, int, int, int, bool], ...]  # (B, H, n, d, causal), m = n
    lsh: tuple[tuple[int, int, int, int], ...]  # (B, H, L, d)
    reference: tuple[int, int, int, int]  # (B, H, n, d) whose FLOP count sizes the matmul

    @property
    def matmul_size(self) -> int:
        """Side of the square matmul with (about) the reference attention's FLOP count."""
        B, H, n, d = self.reference
        side = (4 * B * H * n * n * d / 2) ** (1 / 3)
        return max(256, round(side / 256) * 256)


GRIDS = {
    "quick": Grid(
        dense=((1, 4, 128, 64, False), (1, 4, 512, 64, False), (1, 4, 512, 64, True)),
        lsh=((1, 1, 512, 64),),
        reference=(1, 4, 512, 64),
    ),
    "full": Grid(
        dense=tuple(
            (1, H, n, d, c)
            for H, d in ((8, 64), (16, 64), (8, 128))
            for n in (256, 1024, 4096, 16384)
            for c in (False, True)
        ),
        lsh=tuple((1, 1, L, 64) for L in (1024, 4096, 16384, 65536)),
        reference=(1, 8, 4096, 64),
    ),
    # LSH against full attention at the same shapes as L doubles (run with --impls
    # adapter,native,lsh); it holds the LSH speed-up target's cases, so it evaluates that target
    "lsh": Grid(
        dense=tuple((1, 1, L, 64, False) for L in LSH_SCALING_L),
        lsh=tuple((1, 1, L, 64) for L in LSH_SCALING_L),
        reference=(1, 1, 4096, 64),
    ),
}


def default_dtypes(device: str) -> tuple[str, ...]:
    # half precision on a CPU measures emulation, and float64 on a GPU its slow FP64 units
    return ("float32", "float64") if is_cpu(device) else ("float16", "bfloat16", "float32")


def planned(backend_name: str, impl: str, dtype: str) -> bool:
    """Whether the grid holds (impl, dtype) for this backend at all (no skip is recorded if not)."""
    if impl in ("golden", "blocked"):
        return backend_name == "numpy" and dtype == "float64"
    if impl == "vjp":
        return backend_name in ("torch", "jax")
    return True


def grid_cases(grid: Grid, backend_name: str, dtypes, impls=IMPLEMENTATIONS) -> list[Case]:
    cases = []
    for impl in impls:
        for dtype in dtypes:
            if not planned(backend_name, impl, dtype):
                continue
            if impl == "lsh":
                cases += [Case(impl, dtype, B, H, L, L, d) for B, H, L, d in grid.lsh]
            else:
                cases += [Case(impl, dtype, B, H, n, n, d, c) for B, H, n, d, c in grid.dense]
    return cases


# -- backends and frameworks --------------------------------------------------------------------


@functools.cache
def resolve_backend(spec: str):
    """A registry name (``attnspec.backends.get``), or "module:attribute" naming a backend
    object or class that is not registered (a class is instantiated with no arguments)."""
    if ":" in spec:
        module, _, attr = spec.partition(":")
        obj = getattr(importlib.import_module(module), attr)
        return obj() if isinstance(obj, type) else obj
    from attnspec.backends import get

    return get(spec)


def framework_of(backend, device: str) -> str:
    """The framework that owns the backend's arrays: "numpy", "torch", "jax", "cupy"..."""
    x = backend.asarray(np.zeros(1, np.float32), dtype="float32", device=device)
    root = type(x).__module__.split(".")[0]
    return "jax" if root in ("jax", "jaxlib") else root


def workspace_bytes(case: Case, framework: str, device: str) -> int | None:
    """Rough peak workspace of a call that materializes the (n, m) logits; None if it does not.

    The golden holds about five float64 (n, m) arrays at once (logits, their masked copy,
    exponentials, weights, and the visibility mask) below `BLOCKED_MIN_LOGITS` logits, and none
    from there on, where it computes tile by tile, as do the two adapters on NumPy arrays (numpy,
    array_api-numpy); other materializing implementations are counted at four arrays of at least
    float32. Other adapters are assumed to materialize (a mask or a fix-up may force the unfused
    path); torch's primitive is fused (flash on CPU and CUDA) except float64 on a GPU.
    """
    logits = case.B * case.H * case.n * case.m
    if case.impl in ("blocked", "lsh"):
        return None
    if framework == "numpy" and case.impl in ("golden", "native", "adapter") and logits >= BLOCKED_MIN_LOGITS:
        return None
    if case.impl == "golden" or (case.impl == "native" and framework == "numpy"):
        return 5 * logits * 8
    if case.impl == "native" and framework == "torch" and (is_cpu(device) or case.dtype != "float64"):
        return None
    return 4 * logits * max(np.dtype(_np_dtype(case.dtype)).itemsize, 4)


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)


def static_skip(backend, framework: str, device: str, case: Case) -> str | None:
    """Why this case cannot run on this backend at all (not a matter of size); None if it can."""
    impl, name = case.impl, backend.name
    if impl in ("adapter", "vjp"):
        reasons = backend.supports(
            "sdpa" if impl == "adapter" else "sdpa_vjp",
            dtype=case.dtype,
            device=device,
            causal="upper_left" if case.causal else None,
            q_shape=(case.B, case.H, case.n, case.d),
            k_shape=(case.B, case.H, case.m, case.d),
            v_shape=(case.B, case.H, case.m, case.d),
        )
        return "; ".join(reasons) or None
    if impl == "native":
        if case.dtype not in backend.dtypes:
            return f"{name} has no {case.dtype}"
        if framework in ("torch", "jax"):
            return None
        if name == "numpy":
            if case.dtype == "float64":
                return "the numpy backend's native is the golden: see the golden rows"
            return None
        return f"{framework} has no attention primitive"
    if impl == "blocked" and _blocked() is None:
        return "attnspec.spec.sdpa_blocked is not importable"
    if impl == "lsh":
        if "lsh_attention" in backend.implements:
            return None if case.dtype in backend.dtypes else f"{name} has no {case.dtype}"
        if name == "numpy":
            return None if case.dtype == "float64" else "the spec's lsh_attention computes in float64"
        return f"{name} does not implement lsh_attention"
    return None


def _blocked():
    try:
        from attnspec.spec.blocked import sdpa_blocked
    except ImportError:
        return None
    return sdpa_blocked


# -- building one call --------------------------------------------------------------------------


@dataclass
class Prepared:
    """Inputs created and bound: ``call()`` runs one forward pass, ``sync()`` waits for the device."""

    call: Callable[[], Any]
    sync: Callable[[], None]
    framework: str
    device: str
    params: dict[str, Any]


def _normal(shape, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def prepare(backend, device: str, case: Case | dict) -> Prepared:
    """Create the inputs for ``case`` and bind the call (``backend``: object or registry name)."""
    if isinstance(backend, str):  # in a probe process: apply the policy the parent runs under
        be = resolve_backend(backend)
        if hasattr(be, "numerics_policy"):
            be.numerics_policy()
    else:
        be = backend
    case = Case(**case) if isinstance(case, dict) else case
    fw = framework_of(be, device)
    B, H, n, m, d = case.B, case.H, case.n, case.m, case.d
    q_np, k_np, v_np = _normal((B, H, n, d), 0), _normal((B, H, m, d), 1), _normal((B, H, m, d), 2)
    params: dict[str, Any] = {}

    def on_backend(*xs):
        return [be.asarray(x, dtype=case.dtype, device=device) for x in xs]

    def on_numpy(*xs):
        return [x.astype(_np_dtype(case.dtype)) for x in xs]

    causal = "upper_left" if case.causal else None
    if case.impl == "adapter":
        q, k, v = on_backend(q_np, k_np, v_np)
        call = lambda: be.sdpa(q, k, v, causal=causal)  # noqa: E731
    elif case.impl == "vjp":
        q, k, v, d_out = on_backend(q_np, k_np, v_np, _normal((B, H, n, d), 3))
        call = lambda: be.sdpa_vjp(q, k, v, d_out, causal=causal)  # noqa: E731
    elif case.impl == "native" and fw == "torch":
        import torch.nn.functional as F

        q, k, v = on_backend(q_np, k_np, v_np)
        call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=case.causal)  # noqa: E731
    elif case.impl == "native" and fw == "jax":
        import jax

        fn = jax.jit(functools.partial(jax.nn.dot_product_attention, is_causal=case.causal))
        # (B, H, L, d) -> (B, L, H, d): jax's own layout, transposed outside the timed call
        q, k, v = on_backend(*(np.ascontiguousarray(x.swapaxes(1, 2)) for x in (q_np, k_np, v_np)))
        call = lambda: fn(q, k, v)  # noqa: E731
    elif case.impl in ("native", "golden"):
        from attnspec.spec import sdpa

        q, k, v = on_numpy(q_np, k_np, v_np)
        call = lambda: sdpa(q, k, v, causal=causal)  # noqa: E731
    elif case.impl == "blocked":
        blocked = _blocked()
        q, k, v = on_numpy(q_np, k_np, v_np)
        call = lambda: blocked(q, k, v, causal=causal)  # noqa: E731
    elif case.impl == "lsh":
        from attnspec.spec.lsh import lsh_rotations

        params = case.lsh_params()
        rot_np = lsh_rotations(0, d, params["n_hashes"], params["n_buckets"])  # (d, nh, nb // 2)
        if "lsh_attention" in be.implements:
            x, v = on_backend(q_np, v_np)
            rot = be.asarray(rot_np, dtype="float32", device=device)
            fn = be.lsh_attention
        else:
            from attnspec.spec.lsh import lsh_attention as fn

            x, v = on_numpy(q_np, v_np)
            rot = rot_np
        chunk = params["chunk_length"]
        call = lambda: fn(x, v, rotations=rot, chunk_length=chunk, causal=case.causal)  # noqa: E731
    else:
        raise ValueError(f"prepare: no implementation {case.impl!r} for framework {fw}")
    return Prepared(call, be.synchronize, fw, device, params)


def estimated_seconds(case: Case, matmul_tflops: float | None, share: float | None) -> float | None:
    """One call's time predicted from its dense FLOPs: at ``share`` of the matmul rate (the share
    a smaller case of the same implementation, dtype and causality achieved in this run), or
    with none yet, at the full matmul rate (half the FLOPs when causal): a lower bound.

    None for LSH, whose cost grows about linearly in L, not like its dense-equivalent FLOPs.
    """
    if not matmul_tflops or case.impl == "lsh":
        return None
    if share:
        return case.flops / (share * matmul_tflops * 1e12)
    return case.flops * (0.5 if case.causal else 1.0) / (matmul_tflops * 1e12)


def human_bytes(x: float | None) -> str:
    if x is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(x) < 1000 or unit == "TB":
            return f"{x:.3g} {unit}"
        x /= 1000
    return str(x)


def human_seconds(x: float) -> str:
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"
