"""Check a GPU kernel against a bundle: here torch's SDPA (DEVICE=cuda), usable on CPU too."""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from attnspec.conformance.vectors import load, write_output, write_unsupported

bundle_dir, outputs, device = sys.argv[1], sys.argv[2], os.environ.get("DEVICE", "cuda")
for bundle in load(bundle_dir):
    for case in bundle.read_cases():
        o, extra = case.options, set(case.inputs) - {"q", "k", "v", "mask"}
        if extra or o.get("return_weights") or o.get("return_lse") or o.get("causal") not in (None, "upper_left") \
                or "window" in o or "softcap" in o or case.inputs["q"].ndim < 3:
            write_unsupported(outputs, case.id, f"not expressible with SDPA's arguments: {sorted(extra)} {o}")
            continue
        dtype = getattr(torch, case.dtype)  # float64 holds every input exactly; then the case's dtype
        q, k, v = (torch.from_numpy(case.inputs[n].astype("float64")).to(device, dtype) for n in "qkv")
        mask = torch.from_numpy(np.atleast_2d(case.inputs["mask"])).to(device) if "mask" in case.inputs else None
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=o.get(
            "scale"), is_causal=o.get("causal") == "upper_left", enable_gqa=q.shape[-3] != k.shape[-3])
        write_output(outputs, case.id, {"out": out})
