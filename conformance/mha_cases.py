"""Hypothesis strategies and calls for the mha conformance properties (its bad inputs are in
`attnspec.spec.bad_inputs`, beside sdpa's).

A drawn `MHACase` is one multi-head attention layer and one call of it: NumPy inputs already
rounded to the case dtype, `MHAParams` drawn in that dtype too (so a backend that converts them
to the inputs' dtype loses nothing), the keyword options (``num_heads``, ``num_kv_heads`` and
sdpa's visibility keywords), the feature it exercises and its tags. It has the attributes the
suite's ``judge`` reads (``q``, ``k``, ``v`` are query, key and value). Sizes come from the small
menus of `attnspec.conformance.hypothesis_helpers`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from attnspec.backends.base import variant_features
from attnspec.conformance.hypothesis_helpers import (
    NP_DTYPES,
    SIDES,
    VARIANT_CASE_FEATURES,
    DrawnCase,
    array_source,
    draw_mask,
    draw_packing_and_dropout,
    full_visibility,
    options_text,
)
from attnspec.spec.mha import MHAParams, plan_mha_numpy
from attnspec.spec.options import NAMES
from attnspec.spec.tolerance_mha import MHAGolden, mha_golden

__all__ = ["MHA_FEATURES", "MHACase", "call_mha", "golden_for_mha", "mha_cases", "mha_plan"]

MHA_FEATURES = (
    *("plain", "no_bias", "kdim_vdim", "gqa", "mqa", "rank2", "batch_broadcast", "scale"),  # the layer
    *("mask", "bias", "bias_neg_inf", "causal_upper_left", "causal_lower_right", "window"),  # visibility
    *("kv_lengths", "q_lengths", "no_visible_rows", "empty", "combined"),  # lengths, edges, all at once
    *VARIANT_CASE_FEATURES,  # sdpa's variants (issue #15), passed through to every head
)
#: the variant features of `MHA_FEATURES` (the names `attnspec.backends.VARIANT_FEATURES` uses)
MHA_VARIANT_FEATURES = MHA_FEATURES[MHA_FEATURES.index("softcap") :]
#: the others; mha_vjp's gradient properties draw only these, since its gradient tolerance
#: (`attnspec.spec.tolerance_grads.mha_vjp_allowed`) has no reference backward with the variants
#: yet (sdpa_vjp's has)
MHA_BASE_FEATURES = MHA_FEATURES[: MHA_FEATURES.index("softcap")]
#: sdpa's keywords besides mask and bias, which mha passes through
SDPA_OPTIONS = tuple(name for name in NAMES if name not in ("mask", "bias", "return_weights"))
PARAM_FIELDS = ("w_q", "b_q", "w_k", "b_k", "w_v", "b_v", "w_o", "b_o")
HEAD_DIMS = (1, 2, 4, 8)
_SIDES = tuple(s for s in SIDES if s <= 13)  # projections make each side cost E * features more


@dataclass
class MHACase(DrawnCase):
    feature: str
    dtype: str
    q: np.ndarray  # query (..., n, E)
    k: np.ndarray  # key (..., m, kdim)
    v: np.ndarray  # value (..., m, vdim)
    params: MHAParams
    options: dict[str, Any] = field(default_factory=dict)  # num_heads, num_kv_heads, sdpa keywords
    tags: frozenset[str] = frozenset()
    seed: int = 0

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {
            "query": self.q.shape,
            "key": self.k.shape,
            "value": self.v.shape,
            "w_k": self.params.w_k.shape,
        }

    @property
    def feature_case(self) -> dict[str, Any]:
        """What `Backend.supports` needs to know about the parameters."""
        biases = [getattr(self.params, b) is not None for b in ("b_q", "b_k", "b_v", "b_o")]
        return {
            "embed_dim": self.params.embed_dim,
            "kdim": self.params.kdim,
            "vdim": self.params.vdim,
            "kv_dim": self.params.kv_dim,
            "param_biases": "all" if all(biases) else "some" if any(biases) else "none",
        }

    def describe(self) -> str:
        p = self.params
        opts = options_text(self.options)
        biases = "on" if p.b_q is not None else "off"
        return (
            f"feature={self.feature} dtype={self.dtype} query{self.q.shape} key{self.k.shape} "
            f"value{self.v.shape} E={p.embed_dim} kdim={p.kdim} vdim={p.vdim} kv_dim={p.kv_dim} "
            f"biases={biases} {opts}"
        ).rstrip()

    def asking_weights(self) -> MHACase:
        return replace(
            self, options={**self.options, "return_weights": True}, tags=self.tags | {"return_weights"}
        )

    def repro(self, backend_name: str, device: str | None, **extra: Any) -> str:
        """A self-contained snippet: rebuild the case, call the backend and the golden."""
        dt = "ml_dtypes.bfloat16" if self.dtype == "bfloat16" else f"np.{self.dtype}"
        lines = [
            "import numpy as np, ml_dtypes",
            "import attnspec.spec",
            "from attnspec.conformance.pytest_helpers import resolve_backend",
            f"b = resolve_backend({backend_name!r})",
        ]
        inputs = (("query", self.q), ("key", self.k), ("value", self.v))
        lines += [f"{name} = {array_source(x, dt)}" for name, x in inputs]
        prm = ", ".join(
            f"{f}={array_source(getattr(self.params, f), dt)}"
            for f in PARAM_FIELDS
            if getattr(self.params, f) is not None
        )
        lines.append(f"params = attnspec.spec.MHAParams({prm})")
        opts = [
            f"{k}={array_source(v, dt) if isinstance(v, np.ndarray) else repr(v)}"
            for k, v in sorted({**self.options, **extra}.items())
        ]
        dev = f", device={device!r}" if device else ""
        lines += [
            f"golden = attnspec.spec.mha(query, key, value, params, {', '.join(opts)})",
            f"to = lambda x: b.asarray(x{dev}) if isinstance(x, np.ndarray) else x",
            "args = {" + ", ".join(f"{o.split('=')[0]!r}: to({o.split('=', 1)[1]})" for o in opts) + "}",
            "out = b.mha(to(query), to(key), to(value), params, **args)",
            "first = lambda r: r[0] if isinstance(r, tuple) else r",
            "print(np.abs(b.to_numpy(first(out)).astype(float) - first(golden).astype(float)).max())",
        ]
        return "\n".join(lines)


def mha_plan(case: MHACase):
    """The validated plan of the case's per-head sdpa call (q (..., H, n, hd) and so on)."""
    o = case.options
    return plan_mha_numpy(
        "mha",
        case.q,
        case.k,
        case.v,
        case.params,
        o["num_heads"],
        o.get("num_kv_heads"),
        o.get("mask"),
        o.get("bias"),
        {k: o[k] for k in SDPA_OPTIONS if k in o},
    )


@st.composite
def mha_cases(draw, dtype: str, features: tuple[str, ...] = MHA_FEATURES) -> MHACase:
    """One mha layer and call exercising a drawn feature, in ``dtype`` (params included)."""
    feature = draw(st.sampled_from(features))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    tags = {"mha", feature, dtype}  # "mha" keeps sdpa cases from crediting mha deviations

    heads = draw(st.sampled_from([1, 2, 4]))
    kv_heads = heads
    if feature in ("gqa", "combined"):
        heads = draw(st.sampled_from([2, 4, 6]))
        kv_heads = draw(
            st.sampled_from(
                [d for d in range(1, heads + 1) if heads % d == 0 and (d < heads or feature == "combined")]
            )
        )
    if feature == "mqa":
        heads, kv_heads = draw(st.sampled_from([2, 4])), 1
    hd = draw(st.sampled_from(HEAD_DIMS))
    e = heads * hd
    kdim = vdim = e
    if feature in ("kdim_vdim", "combined"):
        kdim = draw(st.sampled_from([1, 3, 5, e]))
        vdim = draw(st.sampled_from([2, 4, 7, e]))
    with_bias = feature != "no_bias" and (feature != "combined" or draw(st.booleans()))
    npdt = NP_DTYPES[dtype]
    params = MHAParams.init(
        e,
        heads,
        num_kv_heads=kv_heads,
        kdim=kdim,
        vdim=vdim,
        bias=with_bias,
        seed=int(rng.integers(2**31)),
        dtype=npdt,
    )
    if kv_heads < heads:
        tags.add("gqa")
    if kdim != e or vdim != e:
        tags.add("kdim_vdim")
    if not with_bias:
        tags.add("no_bias")

    batch = draw(st.sampled_from([(), (2,), (1, 3)]))
    n, m = draw(st.sampled_from(_SIDES)), draw(st.sampled_from(_SIDES))
    if feature == "empty":
        n, m = draw(st.sampled_from([(0, m), (n, 0), (0, 0)]))
    if n != m:
        tags.add("n_ne_m")
    q_batch = kv_batch = batch
    if feature == "batch_broadcast" and batch:
        kv_batch = (1,) * len(batch)  # key/value broadcast against the query's batch
    if feature == "rank2":
        q_batch = kv_batch = batch = ()
    query = rng.standard_normal((*q_batch, n, e)).astype(npdt)
    key = rng.standard_normal((*kv_batch, m, kdim)).astype(npdt)
    value = rng.standard_normal((*kv_batch, m, vdim)).astype(npdt)

    options: dict[str, Any] = {"num_heads": heads}
    if kv_heads != heads:
        options["num_kv_heads"] = kv_heads
    full = (*batch, heads, n, m)
    if feature in ("mask", "combined", "no_visible_rows"):
        options["mask"] = draw_mask(draw, rng, feature, n, full, [(n, m), full, (*batch, 1, n, m)])
    if feature == "scale":
        options["scale"] = float(draw(st.sampled_from([0.05, 0.5, 2.0])))
    if feature in ("bias", "bias_neg_inf", "combined"):
        bias = rng.standard_normal(draw(st.sampled_from([(n, m), full]))) * 2
        if feature != "bias":
            bias = np.where(rng.random(bias.shape) < 0.3, -np.inf, bias)
        options["bias"] = bias.astype(npdt)
    if feature in ("causal_upper_left", "window", "combined"):
        options["causal"] = draw(
            st.sampled_from(["upper_left", None] if feature == "window" else ["upper_left"])
        )
        if options["causal"] is None:
            del options["causal"]
    if feature == "causal_lower_right" or (feature == "combined" and draw(st.booleans())):
        options["causal"] = "lower_right"
    if feature in ("window", "combined"):
        options["window"] = (draw(st.integers(0, 4)), draw(st.integers(0, 4)))
    if feature in ("kv_lengths", "no_visible_rows", "combined"):
        options["kv_lengths"] = rng.integers(
            0 if feature == "no_visible_rows" else min(1, m), m + 1, size=batch
        )
    if feature in ("q_lengths", "combined"):
        options["q_lengths"] = rng.integers(0, n + 1, size=batch)
    if feature in MHA_VARIANT_FEATURES:
        _draw_variants(draw, rng, feature, options, batch, heads, n, m, npdt)
        tags.add("variants")
    case = MHACase(feature, dtype, query, key, value, params, options, frozenset(tags), seed)
    return retag(case)


def _draw_variants(
    draw, rng, feature: str, options: dict[str, Any], batch, heads: int, n: int, m: int, npdt
) -> None:
    """One variant (or all, ``variants_combined``) into ``options``, as sdpa's variant cases draw
    them, with the layer's H query heads."""
    every = feature == "variants_combined"
    if feature == "softcap" or every:
        options["softcap"] = float(draw(st.sampled_from([0.5, 2.0, 5.0, 30.0])))
    if feature == "alibi" or every:
        shape = draw(st.sampled_from([(heads,), (*batch, heads)]))
        options["alibi_slopes"] = (2.0 ** -rng.uniform(0, 8, size=shape)).astype(np.float32)
        if draw(st.booleans()):  # n != m under lower-right alignment is where ALiBi's anchor shows
            options["causal"] = "lower_right"
    if feature == "sinks" or every:
        options["sinks"] = (rng.standard_normal(heads) * 2).astype(npdt)
    if feature in ("lse", "sinks") or every:
        options["return_lse"] = True
    draw_packing_and_dropout(draw, rng, feature, every, options, batch, heads, n, m)


def retag(case: MHACase) -> MHACase:
    """The case with the tags that depend on its final visibility and options added."""
    tags = set(case.tags)
    o = case.options
    plan = mha_plan(case)
    vis = full_visibility(plan, o)
    if plan.n and (plan.m == 0 or not vis.any(axis=-1).all()):
        tags.add("no_visible_row")
    if o.get("bias") is not None and np.isneginf(o["bias"].astype(np.float64)).any():
        tags.add("bias_neg_inf")
    if o.get("causal"):
        tags.add(f"causal_{o['causal']}")
    for name in ("mask", "bias", "window", "kv_lengths", "q_lengths", "scale", "return_weights"):
        if o.get(name) is not None and o.get(name) is not False:
            tags.add(name)
    tags.update(variant_features(o))
    return replace(case, tags=frozenset(tags))


def golden_for_mha(case: MHACase) -> MHAGolden:
    """The float64 golden of the case and its allowed errors (`attnspec.spec.tolerance_mha`)."""
    opts = {k: v for k, v in case.options.items() if k != "return_weights"}
    return mha_golden(case.q, case.k, case.v, case.params, **opts)  # with the lse when return_lse


def call_mha(backend, case: MHACase, device: str | None, *, as_arrays: bool = False, params=None):
    """Run the case on ``backend``: inputs through ``asarray``; params as the NumPy MHAParams, or,
    with ``as_arrays``, as an MHAArrays made by ``backend.asparams`` in the case dtype."""
    conv = {
        name: backend.asarray(v, device=device) if isinstance(v, np.ndarray) else v
        for name, v in case.options.items()
    }
    params = case.params if params is None else params
    if as_arrays:
        params = backend.asparams(params, case.dtype, device)
    return backend.mha(
        backend.asarray(case.q, device=device),
        backend.asarray(case.k, device=device),
        backend.asarray(case.v, device=device),
        params,
        **conv,
    )
