"""attnspec's torch LSH against Hugging Face's and reformer-pytorch's at one configuration (#17).

    python -m attnspec.bench.reformer [--L 4096,8192,...] [--hashes 2,4] [--threads N]
        [--no-memory] [--out-dir reports/results]

One ``attnspec.bench/1`` file per hash count, ``bench-torch-cpu-reformer-h<n>.json``. B = 1, one
head, L positions, d = 64, chunk (bucket) length 64, L / 64 buckets, float32, CPU, no autograd:

    attnspec-lsh    the torch backend's ``lsh_attention(x, v, ...)`` (hash, sort, attend, combine)
    lucidrains-lsh  ``reformer_pytorch.LSHAttention(bucket_size=64, n_hashes=n)(qk, v)``
    hf-lsh          ``LSHSelfAttention`` (hidden 64, one head of 64, chunks before 1, after 0):
                    its two 64 x 64 projections included (under 1% of its FLOPs), as a user calls it

The three run interleaved (`measure.time_calls`), so a busy machine slows them alike; peak
memory is measured for each in a fresh process (`measure`, method rss-subprocess). The
attnspec rows are named "attnspec-lsh", not "lsh", so the LSH-against-full-attention table of
performance.md does not mistake the libraries for full attention; `performance.reformer_comparison`
renders these files.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from attnspec.bench.grid import Prepared, human_bytes, human_seconds

__all__ = ["IMPLS", "prepare", "run"]

SCHEMA = "attnspec.bench/1"
IMPLS = ("attnspec-lsh", "lucidrains-lsh", "hf-lsh")
CHUNK, D = 64, 64
DEFAULT_L = (4096, 8192, 16384, 32768, 65536)


def _inputs(L: int, seed: int):
    import numpy as np
    import torch

    return torch.from_numpy(np.random.default_rng(seed).standard_normal((1, L, D), dtype=np.float32))


def prepare(impl: str, L: int, n_hashes: int) -> Prepared:
    """Inputs and module built, the call bound: one forward pass, under torch.no_grad()."""
    import torch

    x, v = _inputs(L, 0), _inputs(L, 1)  # (1, L, 64) each
    n_buckets = L // CHUNK
    if impl == "attnspec-lsh":
        from attnspec.backends import get
        from attnspec.spec.lsh import lsh_rotations

        be = get("torch")
        rot = torch.from_numpy(lsh_rotations(0, D, n_hashes, n_buckets))  # (d, nh, nb / 2)

        def call():
            return be.lsh_attention(x, v, rotations=rot, chunk_length=CHUNK)
    elif impl == "lucidrains-lsh":
        from reformer_pytorch import LSHAttention

        module = LSHAttention(bucket_size=CHUNK, n_hashes=n_hashes).eval()

        def call():
            return module(x, v)[0]
    elif impl == "hf-lsh":
        from transformers import ReformerConfig
        from transformers.models.reformer.modeling_reformer import LSHSelfAttention

        # one head of width D, the benchmark's hashing, windows reaching one chunk back, no dropout
        heads = {"hidden_size": D, "num_attention_heads": 1, "attention_head_size": D}
        hashing = {"num_hashes": n_hashes, "num_buckets": n_buckets, "hash_seed": 0}
        chunks = {"lsh_attn_chunk_length": CHUNK, "lsh_num_chunks_before": 1, "lsh_num_chunks_after": 0}
        rest = {"is_decoder": False, "lsh_attention_probs_dropout_prob": 0.0, "max_position_embeddings": L}
        cfg = ReformerConfig(**heads, **hashing, **chunks, **rest)
        layer = LSHSelfAttention(cfg, layer_idx=0).eval()

        def call():
            return layer(x).hidden_states
    else:
        raise ValueError(f"prepare: unknown implementation {impl!r}; expected one of {IMPLS}")

    def no_grad_call():
        with torch.no_grad():
            return call()

    params = {"chunk_length": CHUNK, "n_hashes": n_hashes, "n_buckets": n_buckets}
    return Prepared(no_grad_call, lambda: None, "torch", "cpu", params)


def run(
    Ls, n_hashes: int, *, memory: bool = True, budget_s: float = 1.0, max_repeats: int = 10, log=sys.stderr
) -> dict[str, Any]:
    """One results document: every implementation at every L, for one hash count."""
    import torch

    from attnspec.bench.measure import probe_peak, time_calls
    from attnspec.bench.run import _device_name, _environment, _load

    started, load_start = time.time(), _load()
    rows = []
    for L in Ls:
        preps = {impl: prepare(impl, L, n_hashes) for impl in IMPLS}
        timings = time_calls(
            {k: p.call for k, p in preps.items()}, lambda: None, budget_s=budget_s, max_repeats=max_repeats
        )
        del preps
        for impl, t in timings.items():
            peak, method = (
                probe_peak("attnspec.bench.reformer:prepare", {"impl": impl, "L": L, "n_hashes": n_hashes})
                if memory
                else (None, "none")
            )
            flops = 4 * L * L * D
            rows.append(
                {
                    "implementation": impl,
                    "pass": "forward",
                    "dtype": "float32",
                    "B": 1,
                    "H": 1,
                    "n": L,
                    "m": L,
                    "d": D,
                    "causal": False,
                    "median_s": t.median_s,
                    "min_s": t.min_s,
                    "max_s": t.max_s,
                    "repeats": t.repeats,
                    "timing": "interleaved",
                    "flops": flops,
                    "tflops": flops / t.median_s / 1e12,
                    "share_of_matmul": None,
                    "peak_mem_bytes": peak,
                    "mem_method": method,
                    "params": {"chunk_length": CHUNK, "n_hashes": n_hashes, "n_buckets": L // CHUNK},
                }
            )
            print(
                f"L={L} nh={n_hashes} {impl}: {human_seconds(t.median_s)} [{human_seconds(t.min_s)}, "
                f"{human_seconds(t.max_s)}] x{t.repeats}, peak {human_bytes(peak)}",
                file=log,
                flush=True,
            )
    from attnspec.backends import get

    return {
        "schema": SCHEMA,
        "backend": "torch",
        "device": "cpu",
        "device_name": _device_name(get("torch"), "torch", "cpu"),
        "environment": {**_environment({}, started, load_start), "torch_threads": torch.get_num_threads()},
        "grid": f"reformer-h{n_hashes}",
        "interrupted": False,
        "settings": {
            "budget_s": budget_s,
            "max_repeats": max_repeats,
            "memory": "subprocess" if memory else "none",
        },
        "definitions": {
            "implementations": "attnspec-lsh: the torch backend's lsh_attention; lucidrains-lsh: "
            "reformer_pytorch.LSHAttention; hf-lsh: transformers LSHSelfAttention "
            "(its two d x d projections included); all float32, torch.no_grad()",
            "tflops": "dense-equivalent: 4*L*L*d / median_s",
            "peak_mem_bytes": "see mem_method: attnspec.bench.measure's docstring",
        },
        "matmul_tflops": {},
        "rows": rows,
        "skipped": [],
        "targets": [],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attnspec.bench.reformer", description=__doc__.split("\n")[0])
    ap.add_argument("--L", default=",".join(map(str, DEFAULT_L)), help="comma-separated lengths")
    ap.add_argument("--hashes", default="2,4", help="comma-separated n_hashes, one file each")
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--budget-s", type=float, default=1.0, help="timed seconds per implementation and L")
    ap.add_argument("--max-repeats", type=int, default=10)
    ap.add_argument("--out-dir", default="reports/results")
    args = ap.parse_args(argv)
    from attnspec.results import write_json_atomic

    for nh in (int(h) for h in args.hashes.split(",")):
        doc = run(
            [int(x) for x in args.L.split(",")],
            nh,
            memory=not args.no_memory,
            budget_s=args.budget_s,
            max_repeats=args.max_repeats,
        )
        out = f"{args.out_dir}/bench-torch-cpu-reformer-h{nh}.json"
        write_json_atomic(out, doc)
        print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
