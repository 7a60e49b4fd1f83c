"""Conformance properties of mha: every backend, module shape, visibility feature and dtype."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from attnspec.conformance.mha_cases import (
    MHA_VARIANT_FEATURES,
    SDPA_OPTIONS,
    MHACase,
    call_mha,
    golden_for_mha,
    mha_cases,
    retag,
)
from attnspec.conformance.pytest_helpers import Verdict, bad_input_verdict, check_metadata, comparison_lines
from attnspec.spec.bad_inputs import MHA_BAD_INPUTS
from attnspec.spec.mha import MHAParams, merge_heads, split_heads
from attnspec.spec.sdpa import sdpa
from attnspec.spec.tolerance import Comparison, compare
from attnspec.spec.tolerance_mha import MHAGolden
from attnspec.spec.validate import FLOAT_DTYPES

DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES)
#: sdpa's keywords, which mha passes through to every head
SDPA_KEYWORDS = ("mask", "bias", *SDPA_OPTIONS)


def _message(
    backend_name: str,
    prop: str,
    case: MHACase,
    device,
    comparisons: dict[str, Comparison],
    problems: list[str],
    note: str = "",
) -> str:
    lines = [f"[{backend_name}] mha {prop}: {case.describe()} device={device}"]
    lines += [f"  {note}"] if note else []
    lines += [f"  {p}" for p in problems]
    lines += comparison_lines(comparisons)
    lines.append("  reproduce with:")
    lines += ["    " + line for line in case.repro(backend_name, device).splitlines()]
    return "\n".join(lines)


def _judge(backend, device, prop: str, case: MHACase, result, g: MHAGolden, note: str = "") -> Verdict:
    """Metadata and values of ``result`` (out, then weights and lse when the case asks for them)
    against the expected arrays ``g`` holds (the golden's, or a property's own), within its allowed
    errors."""
    want_w, want_lse = bool(case.options.get("return_weights")), bool(case.options.get("return_lse"))
    parts = list(result) if isinstance(result, tuple) else [result]
    out = parts[0]
    problems = check_metadata(backend, out, g.out.shape, case.dtype, device)
    if len(parts) != 1 + want_w + want_lse:
        problems.append(
            f"returned {len(parts)} arrays, expected {1 + want_w + want_lse} "
            f"(out{', weights' * want_w}{', lse' * want_lse})"
        )
        parts = [out, None, None]
    weights = parts[1] if want_w else None
    lse = parts[-1] if want_lse else None
    comparisons = {"out": compare(backend.to_numpy(out).astype(np.float64), g.out, g.allowed_out)}
    if want_w and weights is not None:
        problems += [
            p.replace("out.", "weights.")
            for p in check_metadata(backend, weights, g.weights.shape, case.dtype, device)
        ]
        comparisons["weights"] = compare(backend.to_numpy(weights).astype(np.float64), g.weights, g.allowed_w)
    if want_lse and lse is not None:
        assert g.lse is not None  # the golden has the lse when the case asks for it
        lse_dtype = "float64" if case.dtype == "float64" else "float32"
        problems += [
            p.replace("out.", "lse.") for p in check_metadata(backend, lse, g.lse.shape, lse_dtype, device)
        ]
        comparisons["lse"] = compare(backend.to_numpy(lse).astype(np.float64), g.lse, g.allowed_lse)
    if problems or not all(c.ok for c in comparisons.values()):
        return Verdict(
            "failed", comparisons, _message(backend.name, prop, case, device, comparisons, problems, note)
        )
    return Verdict("passed", comparisons)


@DTYPES
@given(data=st.data())
def test_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """Output and per-head weights equal the golden within the mha tolerance rule, whether the
    parameters come as the NumPy MHAParams or as the backend's own MHAArrays."""
    case = data.draw(mha_cases(dtype), label="case")
    if data.draw(st.booleans(), label="return_weights"):
        case = case.asking_weights()
    as_arrays = data.draw(st.booleans(), label="params_as_backend_arrays")

    def body():
        g = golden_for_mha(case)
        result = call_mha(attn_backend, case, attn_device, as_arrays=as_arrays)
        note = f"params passed as {'MHAArrays' if as_arrays else 'MHAParams'}"
        return _judge(attn_backend, attn_device, "matches_golden", case, result, g, note)

    judge("mha", "matches_golden", case, body, feature_case=case.feature_case)


@DTYPES
@given(data=st.data())
def test_variants_match_golden(attn_backend, attn_device, judge, dtype, data):
    """sdpa's variants (softcap, ALiBi, sinks, lse, segment ids, lower_right_lengths, dropout) reach
    every head: output, weights and lse against the golden within the mha tolerance rule.
    matches_golden draws these too, among all the features; this property draws only them."""
    case = data.draw(mha_cases(dtype, MHA_VARIANT_FEATURES), label="case")
    if data.draw(st.booleans(), label="return_weights"):
        case = case.asking_weights()

    def body():
        g = golden_for_mha(case)
        result = call_mha(attn_backend, case, attn_device)
        return _judge(attn_backend, attn_device, "variants_match_golden", case, result, g)

    judge("mha", "variants_match_golden", case, body, feature_case=case.feature_case)


def _identity_case(case: MHACase, return_weights: bool) -> MHACase:
    """The case's call with identity projections and no biases: key and value get P features."""
    p = case.params
    dt = case.q.dtype
    eye = lambda size: np.eye(size, dtype=dt)  # noqa: E731
    params = MHAParams(w_q=eye(p.embed_dim), w_k=eye(p.kv_dim), w_v=eye(p.kv_dim), w_o=eye(p.embed_dim))
    rng = np.random.default_rng(case.seed)
    key = rng.standard_normal((*case.k.shape[:-1], p.kv_dim)).astype(dt)
    value = rng.standard_normal((*case.v.shape[:-1], p.kv_dim)).astype(dt)
    case = replace(case, k=key, v=value, params=params)
    return retag(case.asking_weights() if return_weights else case)


@DTYPES
@given(data=st.data())
def test_head_split_merge(attn_backend, attn_device, judge, dtype, data):
    """With identity projections, mha is sdpa on the spec's split heads, merged back: head h is
    columns h*hd:(h+1)*hd in and out; out is (..., n, E) and the weights (..., H, n, m)."""
    case = _identity_case(
        data.draw(mha_cases(dtype), label="case"), data.draw(st.booleans(), label="return_weights")
    )
    o = case.options
    h, hkv = o["num_heads"], o.get("num_kv_heads", o["num_heads"])
    kw = {k: o[k] for k in SDPA_KEYWORDS if k in o}  # the variants too: each head gets them
    f64 = {k: v.astype(np.float64) if k in ("bias", "sinks") else v for k, v in kw.items()}
    q, k, v = (
        split_heads(x.astype(np.float64), heads) for x, heads in ((case.q, h), (case.k, hkv), (case.v, hkv))
    )
    heads_res = sdpa(q, k, v, return_weights=True, **f64)  # (..., H, n, hd), (..., H, n, m)[, (..., H, n)]
    expected = merge_heads(heads_res[0])  # (..., n, E)

    def body():
        g = golden_for_mha(case)  # only its allowed errors: the expected values come from sdpa
        result = call_mha(attn_backend, case, attn_device)
        lse = heads_res[2] if len(heads_res) > 2 else None
        g = replace(g, out=expected, weights=heads_res[1], lse=lse)
        note = "identity projections: expected merge_heads(sdpa(split_heads(...)))"
        return _judge(attn_backend, attn_device, "head_split_merge", case, result, g, note)

    judge("mha", "head_split_merge", case, body, feature_case=case.feature_case)


def _expanded(params: MHAParams, heads: int, kv_heads: int) -> MHAParams:
    """The same layer without grouping: each kv head's k/v projection rows repeated G = H // Hkv
    times, so that plain head h holds kv head h // G (the spec's rule)."""
    hd = params.embed_dim // heads
    group = heads // kv_heads

    def rep(x):
        if x is None:
            return None
        x = x.reshape(kv_heads, hd, *x.shape[1:])  # (Hkv, hd, ...)
        return np.repeat(x, group, axis=0).reshape(heads * hd, *x.shape[2:])  # (H*hd, ...)

    return replace(params, w_k=rep(params.w_k), b_k=rep(params.b_k), w_v=rep(params.w_v), b_v=rep(params.b_v))


@DTYPES
@given(data=st.data())
def test_kv_head_mapping(attn_backend, attn_device, judge, dtype, data):
    """Metamorphic: mha with Hkv kv heads equals mha with H kv heads whose projection rows repeat
    each kv head G times (query head h reads kv head h // G)."""
    case = data.draw(mha_cases(dtype, features=("gqa", "mqa")), label="case")
    o = case.options
    h, hkv = o["num_heads"], o["num_kv_heads"]
    plain = replace(
        case,
        params=_expanded(case.params, h, hkv),
        options={k: v for k, v in o.items() if k != "num_kv_heads"},
    )

    def body():
        g = golden_for_mha(case)
        grouped = attn_backend.to_numpy(call_mha(attn_backend, case, attn_device)).astype(np.float64)
        result = call_mha(attn_backend, plain, attn_device)
        # each call may be off the common golden by allowed_out, so they may differ by twice that
        g = replace(g, out=grouped, allowed_out=2 * g.allowed_out)
        note = (
            f"out of num_kv_heads={hkv} (the expected values) vs. the same layer with {h} kv heads, "
            "rows repeated (the result)"
        )
        return _judge(attn_backend, attn_device, "kv_head_mapping", case, result, g, note)

    judge("mha", "kv_head_mapping", case, body, feature_case=case.feature_case)


@DTYPES
@given(data=st.data())
def test_deterministic(attn_backend, attn_device, judge, dtype, data):
    """Two identical calls give bit-identical results (NaN where NaN)."""
    case = data.draw(mha_cases(dtype), label="case")

    def body():
        def first(r):
            return r[0] if isinstance(r, tuple) else r  # the output; lse too would be compared alike

        a = attn_backend.to_numpy(first(call_mha(attn_backend, case, attn_device))).astype(np.float64)
        b = attn_backend.to_numpy(first(call_mha(attn_backend, case, attn_device))).astype(np.float64)
        if a.shape == b.shape and np.array_equal(a, b, equal_nan=True):
            return Verdict("passed")
        diff = np.abs(a - b) if a.shape == b.shape else np.array([np.inf])
        return Verdict(
            "failed",
            message=(
                f"[{attn_backend.name}] mha deterministic: {case.describe()}\n"
                f"  two identical calls differ: shapes {a.shape} and {b.shape}, max |a - b| = "
                f"{np.nanmax(diff, initial=0):.3e}"
            ),
        )

    judge("mha", "deterministic", case, body, feature_case=case.feature_case)


@dataclass
class _BadCase:
    """What ``judge`` reads of a bad-input case."""

    feature: str
    dtype: str
    q: Any
    k: Any
    v: Any
    options: dict[str, Any]
    tags: frozenset[str]
    seed: int = 0

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {"query": self.q.shape, "key": self.k.shape, "value": self.v.shape}

    def describe(self) -> str:
        return f"feature=bad_input {sorted(self.tags - {'bad_input'})[0]}"

    def repro(self, backend_name: str, device, **extra) -> str:
        return f"# see attnspec.spec.bad_inputs.MHA_BAD_INPUTS, entry {self.describe()}"


@pytest.mark.parametrize("bad", MHA_BAD_INPUTS, ids=lambda b: b.id)
def test_bad_input_raises_spec_error(attn_backend, attn_device, judge, bad):
    """Every mha call the spec refuses raises SpecError from the backend, with the spec's message."""
    (query, key, value), params, options = bad.build()
    dtype = bad.dtypes[0] if bad.dtypes[0] in FLOAT_DTYPES else "float32"
    case = _BadCase("bad_input", dtype, query, key, value, options, frozenset({"bad_input", bad.id}))

    def body():
        be = attn_backend
        opts = {
            k: be.asarray(v, device=attn_device) if isinstance(v, np.ndarray) else v
            for k, v in options.items()
        }
        prm = be.asparams(params, "float32", attn_device) if bad.params == "raw" else params
        args = [be.asarray(x, device=attn_device) for x in (query, key, value)]
        return bad_input_verdict(
            be.name,
            "mha",
            bad.id,
            bad.match,
            lambda: be.mha(*args, prm, **opts),
            named=f"{be.name}.mha: ",
            named_first=True,
        )

    judge("mha", "bad_input", case, body, feature_case={"bad_input": True})
