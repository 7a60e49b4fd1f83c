"""Check each of torch's SDPA kernels on a GPU against a bundle of conformance vectors.

``python sdpa_kernels.py VECTORS OUTPUTS`` writes ``OUTPUTS/<kernel>/`` for every kernel torch has
(math, efficient, flash, cudnn), each then judged here or anywhere with
``attnspec vectors verify VECTORS OUTPUTS/<kernel> --name torch-sdpa-<kernel>-cuda``.

A kernel is pinned with ``torch.nn.attention.sdpa_kernel``; a case the pinned kernel refuses
("No available kernel", a dtype it lacks, a mask it cannot take) is written as unsupported with
torch's own message, never rerouted to another kernel. A case SDPA's arguments cannot say at all
(lengths, windows, softcap...) is unsupported for every kernel, as in the README's harness.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnspec.conformance.vectors import load, write_error, write_output, write_unsupported

KERNELS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
SAYABLE = {"q", "k", "v", "mask", "scale", "causal"}  # what SDPA's arguments can say


def run(bundle_dir: str, outputs: str, device: str) -> None:
    cases = [case for bundle in load(bundle_dir) for case in bundle.read_cases()]
    for name, kernel in KERNELS.items():
        out_dir = Path(outputs) / name
        counts = {"ran": 0, "refused": 0, "unsayable": 0}
        for case in cases:
            o = case.options
            asked = set(case.inputs) | {k for k, v in o.items() if v is not False}
            headless = min(case.inputs[n].ndim for n in "qkv") < 3  # enable_gqa below reads head axes
            if asked - SAYABLE or o.get("causal", "upper_left") != "upper_left" or headless:
                write_unsupported(out_dir, case.id, f"SDPA cannot express {sorted(asked - SAYABLE)} {o}")
                counts["unsayable"] += 1
                continue
            dtype = getattr(torch, case.dtype)
            q, k, v = (torch.from_numpy(case.inputs[n].astype("float64")).to(device, dtype) for n in "qkv")
            mask = None
            if "mask" in asked:
                mask = torch.from_numpy(np.atleast_2d(case.inputs["mask"])).to(device)
            try:
                with sdpa_kernel([kernel]):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q,
                        k,
                        v,
                        mask,
                        scale=o.get("scale"),
                        is_causal="causal" in o,
                        enable_gqa=q.shape[-3] != k.shape[-3],
                    )
                torch.cuda.synchronize() if device.startswith("cuda") else None
            except RuntimeError as e:  # the pinned kernel refuses this case
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                if "No available kernel" in str(e) or "not supported" in str(e).lower():
                    write_unsupported(out_dir, case.id, f"{name}: {first}")
                    counts["refused"] += 1
                else:
                    write_error(out_dir, case.id, f"{name}: {first}")
                continue
            write_output(out_dir, case.id, {"out": out})
            counts["ran"] += 1
        print(f"{name}: {counts}", flush=True)


if __name__ == "__main__":
    warnings.filterwarnings("ignore", category=UserWarning)  # each refusal warns why; the reason is kept
    run(sys.argv[1], sys.argv[2], os.environ.get("DEVICE", "cuda"))
