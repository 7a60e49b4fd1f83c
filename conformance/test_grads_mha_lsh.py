"""Conformance properties of mha_vjp and lsh_attention_vjp: gradients, tensor by tensor, against the golden.

Cases are the forward suites' (`mha_cases`, `lsh_cases`) plus an upstream gradient d_out drawn
from the case's seed, tagged ``vjp``. Every gradient tensor has its own tolerance from
`attnspec.spec.tolerance_grads`: for mha the three inputs' and every parameter's (and the
bias's), for LSH dv and dx, dx in two parts (``dx`` and ``dx_zero_x``, see `lsh_vjp_allowed`).

LSH buckets are constants of the vjp, so a batch element holding a low-margin position (whose
bucket a backend may legitimately compute otherwise: see `attnspec.conformance.lsh_cases`) is
left out of the comparison, and the count goes into the verdict's ``reason``. A gradient of an
input broadcast over batch elements sums over them, so it is compared only where every batch
element it sums is kept.

Each property runs a third of the profile's examples per dtype (4 in ``dev``, 33 in ``ci``): an
autodiff backend traces and compiles the whole layer's backward for every new shape (JAX took
~18 s a property and dtype at the full 12), and the dev profile runs in CI.
"""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnspec.conformance import lsh_cases as lc
from attnspec.conformance.grads_cases import empty_row_problems
from attnspec.conformance.hypothesis_helpers import NP_DTYPES, full_visibility
from attnspec.conformance.lsh_cases import LSHCase, lsh_cases
from attnspec.conformance.mha_cases import MHA_BASE_FEATURES, MHACase, mha_cases, mha_plan, retag
from attnspec.conformance.pytest_helpers import Verdict, check_metadata, comparison_lines
from attnspec.spec.grads_lsh import lsh_attention_vjp
from attnspec.spec.grads_mha import mha_vjp
from attnspec.spec.lsh import NORM_EPS, validate_lsh
from attnspec.spec.mha import MHAParams
from attnspec.spec.tolerance import Comparison, compare
from attnspec.spec.tolerance_grads import (
    PARAM_FIELDS,
    lsh_vjp_allowed,
    mha_grads_by_name,
    mha_vjp_allowed,
    reference_lsh_vjp,
    reference_mha_vjp,
)
from attnspec.spec.validate import FLOAT_DTYPES, numpy_info

DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES)


def _fewer(test):
    """A third of the loaded profile's examples (the plugin loads it before this module is imported)."""
    default = settings.default
    assert default is not None  # Hypothesis loads its "default" profile when it is imported
    return settings(max_examples=max(2, default.max_examples // 3))(test)


def _d_out(seed: int, shape, dtype: str) -> np.ndarray:
    """The upstream gradient: standard normal from the case's seed, in its dtype."""
    return np.random.default_rng(seed ^ 0x5EED).standard_normal(shape).astype(NP_DTYPES[dtype])


def _err_ref(ref: np.ndarray, golden: np.ndarray) -> float:
    err = compare(ref, golden, np.inf).max_abs_err
    return err if np.isfinite(err) else 0.0  # a non-finite mismatch is judged by compare, not here


def _failed(backend, fn: str, prop: str, case, device, problems, comparisons=None, note: str = "") -> Verdict:
    lines = [f"[{backend.name}] {fn} {prop}: {case.describe()} device={device}"]
    lines += [f"  {line}" for line in ([note] if note else []) + list(problems)]
    lines += comparison_lines(comparisons or {})
    lines.append("  reproduce with (the forward; the vjp takes d_out = the case seed's normal draw):")
    lines += ["    " + line for line in case.repro(backend.name, device).splitlines()]
    return Verdict("failed", comparisons or {}, "\n".join(lines))


def _as_float64(backend, x) -> np.ndarray:
    return backend.to_numpy(x).astype(np.float64)


# -- mha_vjp ------------------------------------------------------------------------------------

MHA = "mha_vjp"


def _mha_vjp_case(case: MHACase) -> tuple[MHACase, np.ndarray]:
    batch = np.broadcast_shapes(case.q.shape[:-2], case.k.shape[:-2], case.v.shape[:-2])
    shape = (*batch, case.q.shape[-2], case.params.embed_dim)
    case = replace(
        case,
        options={k: v for k, v in case.options.items() if k != "return_weights"},
        tags=case.tags | {"vjp"},
    )
    return case, _d_out(case.seed, shape, case.dtype)


def golden_mha_vjp(case: MHACase, d_out: np.ndarray) -> tuple[dict, dict]:
    """({name: float64 golden gradient}, {name: allowed}) for one mha_vjp case."""
    o = case.options
    p = case.params

    def b64(b: np.ndarray | None) -> np.ndarray | None:
        return None if b is None else b.astype(np.float64)

    params64 = MHAParams(
        w_q=p.w_q.astype(np.float64),
        w_k=p.w_k.astype(np.float64),
        w_v=p.w_v.astype(np.float64),
        w_o=p.w_o.astype(np.float64),
        b_q=b64(p.b_q),
        b_k=b64(p.b_k),
        b_v=b64(p.b_v),
        b_o=b64(p.b_o),
    )
    f64 = {k: v.astype(np.float64) if k == "bias" else v for k, v in o.items()}
    q64, k64, v64 = (x.astype(np.float64) for x in (case.q, case.k, case.v))
    with np.errstate(all="ignore"):
        golden = mha_grads_by_name(mha_vjp(q64, k64, v64, params64, d_out.astype(np.float64), **f64))
    ref = reference_mha_vjp(case.q, case.k, case.v, case.params, d_out, **o)
    err_ref = {name: _err_ref(ref[name], golden[name]) for name in golden}
    allowed = mha_vjp_allowed(case.q, case.k, case.v, case.params, d_out, err_ref, **o)
    return golden, allowed


def call_mha_vjp(backend, case: MHACase, d_out: np.ndarray, device):
    """The case through ``backend.mha_vjp``, parameters as the backend's MHAArrays."""
    conv = {
        k: backend.asarray(v, device=device) if isinstance(v, np.ndarray) else v
        for k, v in case.options.items()
    }
    return backend.mha_vjp(
        *(backend.asarray(x, device=device) for x in (case.q, case.k, case.v)),
        backend.asparams(case.params, case.dtype, device),
        backend.asarray(d_out, device=device),
        **conv,
    )


def judge_mha_grads(
    backend, device, prop: str, case: MHACase, d_out, grads, golden_case=None, extra_problems=()
) -> Verdict:
    golden, allowed = golden_mha_vjp(golden_case or case, d_out)
    problems = list(extra_problems)
    want = 5 if "bias" in case.options else 4
    if (
        not isinstance(grads, tuple)
        or len(grads) != want
        or not all(hasattr(grads[3], f) for f in PARAM_FIELDS)
    ):
        problems.append(
            f"returned {type(grads).__name__}, but should return a tuple of {want}: (d_query, "
            f"d_key, d_value, d_params{', d_bias' if want == 5 else ''}), d_params an MHAArrays"
        )
        return _failed(backend, MHA, prop, case, device, problems)
    named = mha_grads_by_name(grads)
    if set(named) != set(golden):
        problems.append(
            f"gradients {sorted(named)}, but should be {sorted(golden)} (None exactly for the "
            "parameters that are None)"
        )
    comparisons: dict[str, Comparison] = {}
    for name, g in golden.items():
        if name not in named:
            continue
        problems += [
            p.replace("out.", f"{name}.")
            for p in check_metadata(backend, named[name], g.shape, case.dtype, device)
        ]
        comparisons[name] = compare(_as_float64(backend, named[name]), g, allowed[name])
    if problems or not all(c.ok for c in comparisons.values()):
        return _failed(backend, MHA, prop, case, device, problems, comparisons)
    return Verdict("passed", comparisons)


@DTYPES
@_fewer
@given(data=st.data())
def test_mha_vjp_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """d_query, d_key, d_value, every parameter's gradient (and d_bias) each equal the golden
    within the gradient tolerance rule."""
    case, d_out = _mha_vjp_case(data.draw(mha_cases(dtype, MHA_BASE_FEATURES), label="case"))

    def body():
        return judge_mha_grads(
            attn_backend,
            attn_device,
            "matches_golden",
            case,
            d_out,
            call_mha_vjp(attn_backend, case, d_out, attn_device),
        )

    judge(MHA, "matches_golden", case, body, feature_case=case.feature_case)


_PADDABLE = (
    "plain",
    "no_bias",
    "kdim_vdim",
    "gqa",
    "mqa",
    "rank2",
    "causal_lower_right",
    "window",
    "q_lengths",
)


@DTYPES
@_fewer
@given(data=st.data())
def test_mha_vjp_masked_keys_get_zero(attn_backend, attn_device, judge, dtype, data):
    """Keys at or beyond kv_length, holding a large finite poison, get d_key = d_value = 0
    exactly, and every other gradient (the key and value projections' included) equals the golden
    of the same case with ordinary keys there: a hidden key adds nothing anywhere.

    (Finite poison: a NaN key row would reach d_w_k through sum over rows of dk^T key, as
    0 * NaN, in the spec too.)"""
    base = data.draw(mha_cases(dtype, _PADDABLE), label="case")
    batch = np.broadcast_shapes(base.q.shape[:-2], base.k.shape[:-2], base.v.shape[:-2])
    m = base.k.shape[-2]
    kv = np.random.default_rng(base.seed).integers(0, m + 1, size=batch)
    hidden = np.arange(m) >= kv[..., None]  # (*batch, m)
    poison = data.draw(st.sampled_from([1e3, -1e3]), label="poison")
    clean, d_out = _mha_vjp_case(retag(base.with_options(kv_lengths=kv)))
    key = np.where(hidden[..., None], poison, np.broadcast_to(base.k, (*batch, *base.k.shape[-2:])))
    value = np.where(hidden[..., None], poison, np.broadcast_to(base.v, (*batch, *base.v.shape[-2:])))
    poisoned = replace(clean, k=key.astype(base.k.dtype), v=value.astype(base.v.dtype))
    golden_case = replace(
        clean, k=np.broadcast_to(base.k, key.shape).copy(), v=np.broadcast_to(base.v, value.shape).copy()
    )

    def body():
        grads = call_mha_vjp(attn_backend, poisoned, d_out, attn_device)
        problems = []
        if isinstance(grads, tuple) and len(grads) >= 3:
            for name, g in (("d_key", grads[1]), ("d_value", grads[2])):
                got = _as_float64(attn_backend, g)[hidden] if tuple(g.shape[:-1]) == hidden.shape else None
                if got is not None and got.size and not (got == 0).all():
                    problems.append(
                        f"{name} of the {int(hidden.sum())} keys at or beyond kv_length is not "
                        f"exactly 0: max |{name}| = {np.nanmax(np.abs(got), initial=0):.3e}"
                    )
        return judge_mha_grads(
            attn_backend,
            attn_device,
            "masked_keys_get_zero",
            poisoned,
            d_out,
            grads,
            golden_case=golden_case,
            extra_problems=problems,
        )

    judge(MHA, "masked_keys_get_zero", poisoned, body, feature_case=poisoned.feature_case)


@DTYPES
@_fewer
@given(data=st.data())
def test_mha_vjp_empty_rows_zero_and_finite(attn_backend, attn_device, judge, dtype, data):
    """Every gradient is finite, and a query row that sees no key in any head gets d_query = 0."""
    case, d_out = _mha_vjp_case(
        data.draw(mha_cases(dtype, ("no_visible_rows", "q_lengths", "bias_neg_inf")), label="case")
    )
    vis = full_visibility(mha_plan(case), case.options)  # (*batch, H, n, m)
    empty = ~vis.any(axis=(-3, -1))  # (*batch, n): no visible key in any head

    def body():
        grads = call_mha_vjp(attn_backend, case, d_out, attn_device)
        problems = []
        if isinstance(grads, tuple) and len(grads) >= 4:
            arrays = {name: _as_float64(attn_backend, g) for name, g in mha_grads_by_name(grads).items()}
            rows = "rows with no visible key in any head"
            problems = empty_row_problems(arrays, "d_query", empty, rows)
        return judge_mha_grads(
            attn_backend,
            attn_device,
            "empty_rows_zero_and_finite",
            case,
            d_out,
            grads,
            extra_problems=problems,
        )

    judge(MHA, "empty_rows_zero_and_finite", case, body, feature_case=case.feature_case)


def _differences(backend, a: dict, b: dict) -> list[str]:
    diffs = []
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            diffs.append(f"{name}: returned by one call only")
            continue
        x, y = _as_float64(backend, a[name]), _as_float64(backend, b[name])
        if x.shape != y.shape:
            diffs.append(f"{name}: shapes {x.shape} and {y.shape}")
        elif not np.array_equal(x, y, equal_nan=True):
            diffs.append(f"{name}: max |a - b| = {np.nanmax(np.abs(x - y), initial=0):.3e}")
    return diffs


@DTYPES
@_fewer
@given(data=st.data())
def test_mha_vjp_deterministic(attn_backend, attn_device, judge, dtype, data):
    """Two identical mha_vjp calls give bit-identical gradients (NaN where NaN)."""
    case, d_out = _mha_vjp_case(data.draw(mha_cases(dtype, MHA_BASE_FEATURES), label="case"))

    def body():
        a, b = (mha_grads_by_name(call_mha_vjp(attn_backend, case, d_out, attn_device)) for _ in range(2))
        if diffs := _differences(attn_backend, a, b):
            problem = "two identical calls differ: " + "; ".join(diffs)
            return _failed(attn_backend, MHA, "deterministic", case, attn_device, [problem])
        return Verdict("passed")

    judge(MHA, "deterministic", case, body, feature_case=case.feature_case)


# -- lsh_attention_vjp --------------------------------------------------------------------------

LSH = "lsh_attention_vjp"


def _lsh_vjp_case(case: LSHCase) -> tuple[LSHCase, np.ndarray]:
    batch = np.broadcast_shapes(case.x.shape[:-2], case.v.shape[:-2])
    return replace(case, tags=case.tags | {"vjp"}), _d_out(
        case.seed, (*batch, *case.v.shape[-2:]), case.dtype
    )


def _lsh_plan(case: LSHCase):
    return validate_lsh(
        LSH,
        numpy_info(LSH, "x", case.x),
        numpy_info(LSH, "v", case.v),
        numpy_info(LSH, "rotations", case.rotations),
        **case.options,
    )


def _in_range(golden: np.ndarray, dtype: str) -> np.ndarray:
    """The golden where it fits the dtype; where it does not, its rounding (+-inf): the spec casts
    its float64 result to the dtype, so overflow is the defined result, not an error."""
    top = float(ml_dtypes.finfo(NP_DTYPES[dtype]).max)
    return np.where(np.abs(golden) > top, golden.astype(NP_DTYPES[dtype]).astype(np.float64), golden)


def _kept(keep: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Which entries of a gradient of input shape (..., L, f) may be compared: those whose every
    summed batch element is kept. ``keep`` is (*batch,) bool."""
    lead = keep.ndim - (len(shape) - 2)
    k = np.asarray(keep.all(axis=tuple(range(lead)))) if lead > 0 else keep
    axes = tuple(i for i, s in enumerate(shape[:-2]) if s == 1 and k.shape[i] != 1)
    return np.broadcast_to(k.all(axis=axes, keepdims=True) if axes else k, shape[:-2])


def golden_lsh_vjp(case: LSHCase, d_out: np.ndarray):
    """(golden {dx, dv} float64 in range of the dtype, allowed {dx, dx_zero_x, dv}, zero (..., L)
    bool: the positions of x whose ||x|| <= NORM_EPS) for one case."""
    plan = _lsh_plan(case)
    o = case.options
    with np.errstate(all="ignore"):
        dx, dv = lsh_attention_vjp(
            case.x.astype(np.float64),
            case.v.astype(np.float64),
            d_out.astype(np.float64),
            rotations=case.rotations,
            **o,
        )
    golden = {"dx": _in_range(dx, case.dtype), "dv": _in_range(dv, case.dtype)}
    x = case.x.astype(np.float64)
    zero = np.sqrt((np.where(np.isfinite(x), x, 0) ** 2).sum(-1)) <= NORM_EPS  # (..., L)
    ref = reference_lsh_vjp(plan, case.x, case.v, d_out, case.rotations)
    err_ref = {
        "dv": _err_ref(ref["dv"], golden["dv"]),
        "dx": _err_ref(ref["dx"][~zero], golden["dx"][~zero]),
        "dx_zero_x": _err_ref(ref["dx"][zero], golden["dx"][zero]),
    }
    return golden, lsh_vjp_allowed(plan, case.x, case.v, d_out, err_ref), zero


def call_lsh_vjp(backend, case: LSHCase, d_out: np.ndarray, device):
    x, v, options = lc.backend_inputs(backend, case, device)
    return backend.lsh_attention_vjp(x, v, backend.asarray(d_out, device=device), **options)


def judge_lsh_grads(
    backend, device, prop: str, case: LSHCase, d_out, grads, golden_case=None, extra_problems=()
) -> Verdict:
    gcase = golden_case or case
    golden, allowed, zero = golden_lsh_vjp(gcase, d_out)
    rep = lc.margins(gcase)
    keep = ~rep.excluded  # (*batch,)
    reason = rep.text
    problems = list(extra_problems)
    if not isinstance(grads, tuple) or len(grads) != 2:
        problems.append(f"returned {type(grads).__name__}, but should return a tuple (dx, dv)")
        return _failed(backend, LSH, prop, case, device, problems, note=reason)
    got = {}
    for name, g in zip(("dx", "dv"), grads):
        problems += [
            p.replace("out.", f"{name}.")
            for p in check_metadata(backend, g, golden[name].shape, case.dtype, device)
        ]
        got[name] = _as_float64(backend, g) if tuple(g.shape) == golden[name].shape else None
    if problems:
        return _failed(backend, LSH, prop, case, device, problems, note=reason)
    dx, dv = got["dx"], got["dv"]
    assert dx is not None and dv is not None  # None only for a wrong shape, a problem returned above
    kx = _kept(keep, golden["dx"].shape)[..., None]  # (..., 1): x's batch elements compared
    kv = _kept(keep, golden["dv"].shape)  # v's
    comparisons = {
        "dx": compare(dx[kx & ~zero], golden["dx"][kx & ~zero], allowed["dx"]),
        "dv": compare(dv[kv], golden["dv"][kv], allowed["dv"]),
    }
    if (kx & zero).any():
        comparisons["dx_zero_x"] = compare(dx[kx & zero], golden["dx"][kx & zero], allowed["dx_zero_x"])
    if not (kv.all() and kx.all()):
        reason += (
            f"; gradient batch elements compared: dx {int(kx.sum())} of {kx.size}, "
            f"dv {int(kv.sum())} of {kv.size}"
        )
    if not all(c.ok for c in comparisons.values()):
        return _failed(backend, LSH, prop, case, device, problems, comparisons, note=reason)
    return Verdict("passed", comparisons, reason=reason)


@DTYPES
@_fewer
@given(data=st.data())
def test_lsh_attention_vjp_matches_golden(attn_backend, attn_device, judge, dtype, data):
    """dx (the query path and the normalized-key path) and dv each equal the golden within the
    gradient tolerance rule, on batch elements without a low-margin position."""
    case, d_out = _lsh_vjp_case(data.draw(lsh_cases(dtype), label="case"))

    def body():
        return judge_lsh_grads(
            attn_backend,
            attn_device,
            "matches_golden",
            case,
            d_out,
            call_lsh_vjp(attn_backend, case, d_out, attn_device),
        )

    judge(LSH, "matches_golden", case, body)


@DTYPES
@_fewer
@given(data=st.data())
def test_lsh_attention_vjp_padded_zero_and_finite(attn_backend, attn_device, judge, dtype, data):
    """Positions at or beyond kv_length, whose x, v and d_out hold NaN, inf or 1e4, get dx = dv = 0
    exactly (they are absent keys and query rows that see nothing); every gradient is finite, and
    the other positions' equal the golden of the same case with ordinary values there. (dx at
    x[t] = 0 is dk_hat / NORM_EPS, which overflows float16 by definition: the comparison judges
    it, as inf, not the finiteness check.)"""
    base = data.draw(lsh_cases(dtype, ("kv_lengths", "causal", "hashes", "dedup", "ragged")), label="case")
    batch = np.broadcast_shapes(base.x.shape[:-2], base.v.shape[:-2])
    L = base.x.shape[-2]
    kv = np.random.default_rng(base.seed).integers(0, L + 1, size=batch)
    hidden = np.arange(L) >= kv[..., None]  # (*batch, L)
    x = np.broadcast_to(base.x, (*batch, *base.x.shape[-2:])).copy()
    v = np.broadcast_to(base.v, (*batch, *base.v.shape[-2:])).copy()
    clean, d_out = _lsh_vjp_case(
        replace(base, x=x, v=v, options={**base.options, "kv_lengths": kv}, tags=base.tags | {"kv_lengths"})
    )
    poison = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e4]), label="poison")
    npdt = NP_DTYPES[dtype]
    poisoned = replace(
        clean,
        x=np.where(hidden[..., None], poison, x).astype(npdt),
        v=np.where(hidden[..., None], poison, v).astype(npdt),
        tags=clean.tags | {"masked_nonfinite"},
    )
    d_poisoned = np.where(hidden[..., None], poison, d_out).astype(npdt)
    zero_x = (x.astype(np.float64) ** 2).sum(-1) <= NORM_EPS**2  # (*batch, L)

    def body():
        grads = call_lsh_vjp(attn_backend, poisoned, d_poisoned, attn_device)
        problems = []
        if isinstance(grads, tuple) and len(grads) == 2:
            for name, g in zip(("dx", "dv"), grads):
                a = _as_float64(attn_backend, g)
                bad = ~np.isfinite(a) & ~(zero_x & ~hidden)[..., None] if name == "dx" else ~np.isfinite(a)
                if bad.any():
                    problems.append(f"{name} has {int(bad.sum())} NaN/inf entries")
                if a.shape[:-1] == hidden.shape and not (a[hidden] == 0).all():
                    problems.append(
                        f"{name} of the {int(hidden.sum())} padded positions is not exactly 0 "
                        f"(max |{name}| there {np.nanmax(np.abs(a[hidden]), initial=0):.3e})"
                    )
        return judge_lsh_grads(
            attn_backend,
            attn_device,
            "padded_zero_and_finite",
            poisoned,
            d_out,
            grads,
            golden_case=clean,
            extra_problems=problems,
        )

    judge(LSH, "padded_zero_and_finite", poisoned, body)


@DTYPES
@_fewer
@given(data=st.data())
def test_lsh_attention_vjp_deterministic(attn_backend, attn_device, judge, dtype, data):
    """Two identical lsh_attention_vjp calls give bit-identical gradients (NaN where NaN)."""
    case, d_out = _lsh_vjp_case(data.draw(lsh_cases(dtype), label="case"))

    def body():
        a, b = (
            dict(zip(("dx", "dv"), call_lsh_vjp(attn_backend, case, d_out, attn_device))) for _ in range(2)
        )
        if diffs := _differences(attn_backend, a, b):
            problem = "two identical calls differ: " + "; ".join(diffs)
            return _failed(attn_backend, LSH, "deterministic", case, attn_device, [problem])
        return Verdict("passed")

    judge(LSH, "deterministic", case, body)
