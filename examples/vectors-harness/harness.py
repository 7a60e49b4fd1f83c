"""Check a GPU kernel against a bundle: here torch's SDPA (DEVICE=cuda), usable on CPU too."""

import os
import sys

import numpy as np
import torch

from attnspec.conformance.vectors import load, write_output, write_unsupported

bundle_dir, outputs, device = sys.argv[1], sys.argv[2], os.environ.get("DEVICE", "cuda")
SAYABLE = {"q", "k", "v", "mask", "scale", "causal"}  # what SDPA's arguments can say
for case in (case for bundle in load(bundle_dir) for case in bundle.read_cases()):
    o, asked = case.options, set(case.inputs) | {k for k, v in case.options.items() if v is not False}
    headless = min(case.inputs[n].ndim for n in "qkv") < 3  # enable_gqa below reads head axes
    if asked - SAYABLE or o.get("causal", "upper_left") != "upper_left" or headless:
        write_unsupported(outputs, case.id, f"SDPA cannot express {sorted(asked - SAYABLE)} {o}")
        continue
    dtype = getattr(torch, case.dtype)  # float64 holds every input exactly; then the case's dtype
    q, k, v = (torch.from_numpy(case.inputs[n].astype("float64")).to(device, dtype) for n in "qkv")
    mask = torch.from_numpy(np.atleast_2d(case.inputs["mask"])).to(device) if "mask" in asked else None
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, mask, scale=o.get("scale"), is_causal="causal" in o, enable_gqa=q.shape[-3] != k.shape[-3]
    )
    write_output(outputs, case.id, {"out": out})
