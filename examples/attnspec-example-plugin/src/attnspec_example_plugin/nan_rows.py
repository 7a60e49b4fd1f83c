"""A deliberately deviating backend: the example's attention, except that a query row with no
visible key gives NaN, as the textbook softmax exp(s) / sum(exp(s)) does over a row of -inf.
Its deviation is declared in ``deviations.toml`` (loaded by `attnspec_example_plugin.deviations`),
so the conformance suite reports those cases as that deviation, and the rest as usual."""

from __future__ import annotations

import numpy as np

from attnspec.backends.authoring import attend_mask, plan_sdpa
from attnspec.spec.options import take, with_options
from attnspec_example_plugin import ExampleBackend
from attnspec_example_plugin.deviations import NAN_ROWS_DEVIATIONS

__all__ = ["NanRowsBackend"]


class NanRowsBackend(ExampleBackend):
    """`ExampleBackend` with NaN for rows that see no key (out and weights)."""

    name = "example-nan-rows"
    #: what this backend is known to do differently from the spec
    deviations = NAN_ROWS_DEVIATIONS
    #: a sink keeps a row's denominator above 0, so its rows are not NaN: left out, to keep one rule
    variants = ExampleBackend.variants - {"sinks"}

    @with_options()  # help() and inspect show the spec's keywords for **options
    def sdpa(self, q, k, v, **options):
        o = take("example-nan-rows.sdpa", options)  # the spec's defaults; an unknown keyword is a TypeError
        return_weights, return_lse = o.pop("return_weights"), o.pop("return_lse")
        # checked under this backend's own name first, so bad input names example-nan-rows.sdpa
        p = plan_sdpa("example-nan-rows.sdpa", q, k, v, return_lse=return_lse, library="numpy", **o)
        result = super().sdpa(q, k, v, return_weights=return_weights, return_lse=return_lse, **o)
        segments = {name: o[name] for name in ("q_segment_ids", "kv_segment_ids")}
        vis = attend_mask(p, o["mask"], o["bias"], full=True, **segments)
        empty = ~np.broadcast_to(vis, p.full_weights_shape).any(axis=-1)  # (..., Hq, n)
        parts = list(result) if isinstance(result, tuple) else [result]
        out = parts[0].reshape(*p.batch, p.hq, p.n, p.dv).copy()
        out[empty] = np.nan
        parts[0] = out.reshape(p.out_shape)
        if return_weights:
            w = parts[1].reshape(p.full_weights_shape).copy()
            w[empty] = np.nan
            parts[1] = w.reshape(p.weights_shape)
        return parts[0] if len(parts) == 1 else tuple(parts)
