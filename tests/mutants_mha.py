"""Deliberately broken mha backends: the mha conformance properties must catch every one.

`NaiveMHA` is an independent, plain NumPy mha (float64; projections by hand, heads split by
reshape, key/value heads repeated explicitly, attention by `mutants.Naive`'s own sdpa). With no bug
switched on it is the control and must pass. Each mutant switches on one bug that real
implementations have shipped; ``drops_softcap`` passes every variant of issue #15 to its per-head
sdpa but softcap (a dropped softcap shipped in sglang's FlashInfer path, sglang#33915). There is
no "drop b_k" mutant: b_k never changes the output (it shifts a whole row of logits), so no test
can see it.
"""

from __future__ import annotations

import numpy as np
from mutants import Naive

from attnspec.backends import _mha
from attnspec.spec.options import take, with_options
from attnspec.spec.validate import ArrayInfo


def _info(fn, name, x):
    return ArrayInfo(tuple(x.shape), x.dtype.name)


class NaiveMHA(Naive):
    name = "naive-mha"
    mha_bug = None

    @with_options()
    def mha(self, query, key, value, params, *, num_heads, num_kv_heads=None, **given):
        options = take(f"{self.name}.mha", given)
        inputs = (query, key, value, params, num_heads, num_kv_heads)
        plan = _mha.validate(f"{self.name}.mha", _info, lambda x: x, inputs, options)
        # sdpa's keywords; those not mask, bias, return_* go on to the per-head sdpa
        mask, bias = options.pop("mask"), options.pop("bias")
        return_weights, return_lse = options.pop("return_weights"), options.pop("return_lse")
        sinks = options["sinks"]
        bug = self.mha_bug
        if bug == "drops_softcap":  # a per-head call that forgets one variant (sglang#33915's kind)
            options["softcap"] = None
        if sinks is not None:
            options["sinks"] = sinks.astype(np.float64)  # sdpa wants them in q's dtype
        h, hkv, hd = plan.hq, plan.hkv, plan.dk
        p = params  # an MHAParams or an MHAArrays: both hold NumPy arrays here

        def project(x, w, b):
            y = x.astype(np.float64) @ w.astype(np.float64).T  # (..., L, in) @ (in, out)
            return y if b is None else y + b.astype(np.float64)

        def split(x, heads):  # (..., L, heads * hd) -> (..., heads, L, hd)
            if bug == "split_wrong_axis":
                x = x.reshape(*x.shape[:-1], hd, heads)  # (..., L, hd, heads): columns interleaved
                return np.moveaxis(x, -1, -3)
            return np.swapaxes(x.reshape(*x.shape[:-1], heads, hd), -2, -3)

        def merge(x):  # the inverse of split
            if bug == "split_wrong_axis":
                x = np.moveaxis(x, -3, -1)  # (..., L, hd, H)
            else:
                x = np.swapaxes(x, -2, -3)  # (..., L, H, hd)
            return x.reshape(*x.shape[:-2], h * hd)

        q = split(project(query, p.w_q, p.b_q), h)
        k = split(project(key, p.w_k, p.b_k), hkv)
        v = split(project(value, p.w_v, p.b_v), hkv)
        heads = np.arange(h) % hkv if bug == "kv_heads_modulo" else np.arange(h) // (h // hkv)
        k, v = k[..., heads, :, :], v[..., heads, :, :]  # (..., H, m, hd): query head h's kv head
        o, w, *lse = self.sdpa(
            q,
            k,
            v,
            mask=mask,
            bias=None if bias is None else bias.astype(np.float64),
            return_weights=True,
            return_lse=return_lse,
            **options,
        )
        out = merge(o)
        if bug != "no_out_proj":
            out = project(out, p.w_o, p.b_o)
        results = [out.astype(query.dtype)]
        if return_weights:
            results.append(w.astype(query.dtype))
        if return_lse:
            results.append(lse[0].astype(plan.lse_dtype))
        return results[0] if len(results) == 1 else tuple(results)


# mutant name -> (bug, the property whose failure the suite must report)
MHA_MUTANTS = {
    "split_wrong_axis": ("split_wrong_axis", "head_split_merge"),
    "no_out_proj": ("no_out_proj", "matches_golden"),
    "kv_heads_modulo": ("kv_heads_modulo", "kv_head_mapping"),
    "drops_softcap": ("drops_softcap", "variants_match_golden"),
}


def make(bug):
    return type(f"MHAMutant_{bug}", (NaiveMHA,), {"name": f"mutant-mha-{bug}", "mha_bug": bug})


def control():
    return NaiveMHA()


for _name, (_bug, _) in MHA_MUTANTS.items():
    globals()[f"mutant_{_name}"] = (lambda b: lambda: make(b)())(_bug)
