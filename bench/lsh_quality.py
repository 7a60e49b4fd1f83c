"""LSH approximation study: ``python -m attnspec.bench.lsh_quality [--out PATH]``.

Relative error (Frobenius) of `attnspec.spec.lsh_attention` against full shared-QK attention
with the same logits and self rule, for n_hashes in {1, 2, 4, 8}, on clustered inputs (points
near a few centres, where hashing finds the neighbours) and isotropic ones (no structure for LSH
to exploit), over several seeds. Writes ``reports/results/lsh-quality.json``
(schema ``attnspec.lsh_quality/1``), which the report renders as the LSH error curve.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from attnspec.results import framework_versions, git_state, write_json_atomic
from attnspec.spec.lsh import NORM_EPS, SELF_LOGIT, lsh_attention, lsh_rotations

L, D, N_BUCKETS, CHUNK = 1024, 64, 16, 64


def inputs(kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if kind == "clustered":
        centres = rng.standard_normal((N_BUCKETS, D)) * 3
        x = centres[rng.integers(0, N_BUCKETS, L)] + 0.3 * rng.standard_normal((L, D))
    else:
        x = rng.standard_normal((L, D))
    return x, rng.standard_normal((L, D))


def full_shared_qk(x: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Dense attention with LSH's logits (q . k_hat, scale 1) and its self rule."""
    k_hat = x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), NORM_EPS)
    s = x @ k_hat.T  # (L, L)
    np.fill_diagonal(s, SELF_LOGIT)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return (w / w.sum(axis=-1, keepdims=True)) @ v


def study(seeds: int) -> list[dict]:
    rows = []
    for kind in ("clustered", "isotropic"):
        for seed in range(seeds):
            x, v = inputs(kind, seed)
            ref = full_shared_qk(x, v)
            for n_hashes in (1, 2, 4, 8):
                rot = lsh_rotations(1000 + seed, D, n_hashes, N_BUCKETS)
                out = lsh_attention(x, v, rotations=rot, chunk_length=CHUNK)
                err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                rows.append({"input": kind, "n_hashes": n_hashes, "seed": seed, "rel_err": err})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m attnspec.bench.lsh_quality", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out", default="reports/results/lsh-quality.json")
    ap.add_argument("--seeds", type=int, default=4)
    args = ap.parse_args(argv)
    started = time.time()
    rows = study(args.seeds)
    write_json_atomic(
        args.out,
        {
            "schema": "attnspec.lsh_quality/1",
            "settings": {"L": L, "d": D, "n_buckets": N_BUCKETS, "chunk_length": CHUNK, "seeds": args.seeds},
            "environment": {
                **git_state(),
                "frameworks": framework_versions(),
                "elapsed_s": round(time.time() - started, 1),
            },
            "rows": rows,
        },
    )
    print(f"wrote {args.out}: {len(rows)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
