"""Deliberately broken backends: the conformance suite must catch every one.

`Naive` is an independent, deliberately plain NumPy implementation of the spec (float64, explicit
visibility, a where-guarded weighted sum). With no bug switched on it is the control: it must pass
the suite. Each mutant switches on one bug that real implementations have shipped.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from attnspec.backends.base import VARIANT_FEATURES, Backend
from attnspec.spec.options import OPTIONS, Option, take, with_options
from attnspec.spec.validate import plan_options


class Naive(Backend):
    name = "naive"
    bug = None
    variants = frozenset(VARIANT_FEATURES)  # all of issue #15's, so their mutants can be switched on

    def asarray(self, x, dtype=None, device=None):
        return np.array(x, dtype=dtype)

    def to_numpy(self, x):
        return np.asarray(x)

    @with_options()
    def sdpa(self, q, k, v, **options):
        fn = f"{self.name}.sdpa"
        o = SimpleNamespace(**take(fn, options))
        p, _ = plan_options(fn, q, k, v, vars(o))
        bug = self.bug
        ct = np.float32 if bug == "f32_accumulation" and p.dtype == "float64" else np.float64

        def lift(x):  # (..., H, L, d), batch dims broadcast out
            x = x if x.ndim > 2 else x[None]
            return np.broadcast_to(x, (*p.batch, *x.shape[-3:])).astype(ct)

        q, k, v = lift(q), lift(k), lift(v)
        heads = np.arange(p.hq) % p.hkv if bug == "gqa_modulo" else np.arange(p.hq) // p.group
        k, v = k[..., heads, :, :], v[..., heads, :, :]  # (..., Hq, m, d)
        if o.scale is None:
            o.scale = 1.0 / p.dk if bug == "scale_1_over_dk" else 1.0 / np.sqrt(p.dk)
        if bug == "no_scale":
            o.scale = 1.0
        s = np.einsum("...id,...jd->...ij", q, k) * ct(o.scale)  # (..., Hq, n, m)
        if o.softcap is not None and bug != "softcap_after_bias":
            s = ct(o.softcap) * np.tanh(s / ct(o.softcap))
        i, j = np.arange(p.n)[:, None], np.arange(p.m)[None, :]
        q_ids = None if o.q_segment_ids is None else np.broadcast_to(o.q_segment_ids, (*p.batch, p.n))
        kv_ids = None if o.kv_segment_ids is None else np.broadcast_to(o.kv_segment_ids, (*p.batch, p.m))
        anchor = self._anchor(p, o.causal, q_ids, kv_ids)[..., None, :, None]  # (..., 1, n, 1): i'
        vis = np.ones(p.full_weights_shape, bool)
        if o.causal is not None:
            vis &= (j <= anchor + 1) if bug == "causal_off_by_one" else (j <= anchor)
        if o.window is not None:
            right = o.window[1] + (bug == "window_right_plus_one")  # one key too many on the right
            vis &= (j >= anchor - o.window[0]) & (j <= anchor + right)
        if o.kv_lengths is not None:
            vis &= j < p.kv_lengths[..., None, None, None]
        if o.q_lengths is not None:
            vis &= i < p.q_lengths[..., None, None, None]
        if q_ids is not None:
            qi, kj = q_ids[..., None, :, None], kv_ids[..., None, None, :]  # (..., 1, n, 1), (..., 1, 1, m)
            vis &= ((qi <= kj) if bug == "segments_le" else (qi == kj)) & (qi >= 0)
        if o.mask is not None:
            vis &= o.mask
        if o.bias is not None:
            vis &= o.bias != -np.inf
            if bug != "bias_ignored":
                s = s + np.where(o.bias == -np.inf, 0, o.bias).astype(ct)
        if o.alibi_slopes is not None:
            if bug == "alibi_upper_left_anchor":
                anchor = np.arange(p.n)[:, None]
            elif bug == "alibi_lower_right_anchor":
                anchor = np.arange(p.n)[:, None] + p.m - p.n
            slopes = np.broadcast_to(o.alibi_slopes.astype(ct), (*p.batch, p.hq))[..., None, None]
            distance = np.abs(anchor - j).astype(ct)  # (..., 1, n, m)
            s = s + slopes * distance if bug == "alibi_wrong_sign" else s - slopes * distance
        if o.softcap is not None and bug == "softcap_after_bias":
            s = ct(o.softcap) * np.tanh(s / ct(o.softcap))
        sink = None if o.sinks is None else o.sinks.astype(ct)[:, None, None]  # (Hq, 1, 1)
        if bug is not None and bug.startswith("finite_fill"):
            # excluded keys get a large finite logit instead of none; patched as real code is:
            # rows with no visible key give 0, hidden keys' values are zeroed (no NaN leaks)
            fill = ct(finite_fill(bug, p.dtype))
            w = _softmax(np.where(vis, s, fill), -1)
            w = np.where(vis.any(-1, keepdims=True), w, 0)
            out = (w[..., None] * np.where(vis[..., None], v[..., None, :, :], 0)).sum(-2)
        elif bug == "fill_minus_1e9":
            s = np.where(vis, s, -1e9)
            w = _softmax(s, -1)
            out = w @ v  # 0 * NaN: masked NaN leaks; empty rows become mean(V)
        else:
            if sink is not None:
                w, p_sink = _softmax_with_sink(np.where(vis, s, -np.inf), sink)
            elif bug == "no_renormalize":
                w = _softmax(s, -1) * vis
            elif bug == "softmax_wrong_axis":
                w = _softmax(np.where(vis, s, -np.inf), -2)
            else:
                w = _softmax(np.where(vis, s, -np.inf), -1)
            # a row with no visible key has 0/0 = NaN weights: it gives 0; a NaN logit on a visible
            # key (a NaN bias) leaves its row NaN, as the spec says (corner_nan_bias)
            w = np.where(vis & vis.any(-1, keepdims=True), w, 0)
            if o.dropout_mask is not None:
                keep = o.dropout_mask.astype(ct)
                w = w * keep if bug == "dropout_not_rescaled" else w * keep / ct(1.0 - o.dropout_p)
            out = np.where(vis[..., None], w[..., None] * v[..., None, :, :], 0).sum(-2)
            if bug == "empty_rows_mean":
                empty = ~vis.any(-1, keepdims=True)
                out = np.where(empty, v.mean(-2, keepdims=True), out)
            if sink is not None and bug == "sink_in_numerator":
                out = out + p_sink  # as if the sink had a value vector of ones
        dt = _np_dtype(p.dtype)
        result = [out.astype(dt).reshape(p.out_shape)]
        if o.return_weights:
            result.append(w.astype(dt).reshape(p.weights_shape))
        if o.return_lse:
            lse = _logsumexp(np.where(vis, s, -np.inf), sink, shifted=bug == "lse_no_max")
            result.append(lse.astype(_np_dtype(p.lse_dtype)).reshape(p.lse_shape))
        return result[0] if len(result) == 1 else tuple(result)

    def _anchor(self, p, causal, q_ids, kv_ids) -> np.ndarray:
        """i' (*batch, n) of each query row, written out row by row for lower_right_lengths."""
        i = np.arange(p.n)
        lengths_on_padded = self.bug == "lengths_on_padded"
        if (causal == "lower_right" and self.bug != "wrong_alignment") or (
            causal == "lower_right_lengths" and lengths_on_padded
        ):
            return np.broadcast_to(i + p.m - p.n, (*p.batch, p.n))
        anchor = np.broadcast_to(i, (*p.batch, p.n)).copy()
        if causal != "lower_right_lengths":
            return anchor
        for b in np.ndindex(*p.batch):
            q_len = p.n if p.q_lengths is None else int(p.q_lengths[b])
            kv_len = p.m if p.kv_lengths is None else int(p.kv_lengths[b])
            for r in range(p.n):
                if q_ids is None:
                    anchor[b][r] = r + kv_len - q_len
                    continue
                sid = q_ids[b][r]  # the ends of row r's own sequence, within the lengths
                q_end = max((x + 1 for x in range(q_len) if q_ids[b][x] == sid), default=0)
                kv_end = max((x + 1 for x in range(kv_len) if kv_ids[b][x] == sid), default=0)
                anchor[b][r] = r + kv_end - q_end
        return anchor


def _softmax(s, axis):
    with np.errstate(invalid="ignore", over="ignore"):
        top = np.max(s, axis=axis, keepdims=True, initial=-np.inf)
        e = np.exp(s - np.where(np.isfinite(top), top, 0))
        return e / e.sum(axis=axis, keepdims=True)


def _softmax_with_sink(s, sink):
    """Weights (..., Hq, n, m) and the sink's share (..., Hq, n, 1) of a softmax with one extra
    logit per head that has no key."""
    with np.errstate(invalid="ignore", over="ignore"):
        top = np.maximum(np.max(s, axis=-1, keepdims=True, initial=-np.inf), sink)
        e = np.exp(s - top)
        e_sink = np.exp(sink - top)
        z = e.sum(axis=-1, keepdims=True) + e_sink
        return e / z, e_sink / z


def _logsumexp(s, sink, shifted=False):
    """log(sum_j exp(s_j) + exp(sink)) over the last axis; ``shifted`` leaves out the max."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = np.max(s, axis=-1, keepdims=True, initial=-np.inf)
        if sink is not None:
            top = np.maximum(top, sink)
        top = np.where(top == -np.inf, 0, top)
        z = np.exp(s - top).sum(axis=-1, keepdims=True)
        if sink is not None:
            z = z + np.exp(sink - top)
        return np.log(z)[..., 0] if shifted else (top + np.log(z))[..., 0]


def naive_visibility(p, causal, window, q_lengths, kv_lengths, mask, bias) -> np.ndarray:
    """Which keys each query sees, (..., Hq, n, m), written out rule by rule (the blocked and
    gradient mutants' own, independent of the spec's masks module)."""
    i, j = np.arange(p.n)[:, None], np.arange(p.m)[None, :]
    shift = p.m - p.n if causal == "lower_right" else 0
    vis = np.ones(p.full_weights_shape, bool)
    if causal is not None:
        vis &= j <= i + shift
    if window is not None:
        vis &= (j >= i + shift - window[0]) & (j <= i + shift + window[1])
    if kv_lengths is not None:
        vis &= j < p.kv_lengths[..., None, None, None]
    if q_lengths is not None:
        vis &= i < p.q_lengths[..., None, None, None]
    if mask is not None:
        vis &= mask
    if bias is not None:
        vis &= bias != -np.inf
    return vis


def _np_dtype(name):
    from attnspec.spec.tolerance import _NP

    return _NP[name]


# mutant name -> (bug, a feature whose failure the suite must report): each mutant is its bug
_FEATURE_OF = {
    "no_scale": "plain",
    "scale_1_over_dk": "plain",
    "causal_off_by_one": "causal_upper_left",
    # found by mutation testing (#28): only the corner_window_edge corner shows it in dev
    "window_right_plus_one": "window",
    "wrong_alignment": "causal_lower_right",
    "fill_minus_1e9": "masked_nonfinite",
    "softmax_wrong_axis": "plain",
    "gqa_modulo": "gqa",
    "empty_rows_mean": "no_visible_rows",
    "bias_ignored": "bias",
    "f32_accumulation": "plain",
    "no_renormalize": "mask",
}
MUTANTS = {bug: (bug, feature) for bug, feature in _FEATURE_OF.items()}
#: pytest -k of a `MUTANTS` run: sdpa's forward matches_golden (test_sdpa.py), the property that
#: names each one's feature. The whole suite (all chapters) took 476 s of the kit's tests for these
#: twelve, most of it Hypothesis shrinking the failures of properties that name no feature of theirs.
#: The derandomized profiles seed each property by its own name and parameters
#: (`attnspec.conformance.plugin.stable_case_key`), so this selection draws the very cases the
#: whole suite does for it.
MUTANT_RUN = "test_sdpa and test_matches_golden"
# A finite mask fill F, patched (empty rows 0, hidden values zeroed). Why the suite must catch each:
# its corner rows (conformance/corners.py) see keys only at a bias level l with q = 0, so their
# logits are exactly l, and F gives each hidden key exp(F - l) times a visible key's weight. For
# l = finfo.min every finite F >= l, so the hidden keys take at least half the weight and the
# row's output shrinks toward 0 (their zeroed values); `FILL_CAUGHT_IN` derives the dtypes.
FINITE_FILLS = ("minus_1e4", "minus_1e9", "finfo_min", "minus_0_7_finfo_max")


def finite_fill(bug: str, dtype: str) -> float:
    """The fill of the mutant ``finite_fill_<name>`` for inputs of ``dtype``."""
    import ml_dtypes

    fi = ml_dtypes.finfo(_np_dtype(dtype))
    return {
        "minus_1e4": -1e4,
        "minus_1e9": -1e9,
        "finfo_min": float(fi.min),
        "minus_0_7_finfo_max": -0.7 * float(fi.max),
    }[bug.removeprefix("finite_fill_")]


def fill_caught_in(bug: str) -> set[str]:
    """The dtypes where the corner rows must expose ``finite_fill_<name>``: those with a floor
    level l <= F + 20 (exp(F - l) >= e^-20 relative weight: far above any tolerance there)."""
    from attnspec.conformance.corners import floor_levels
    from attnspec.spec.validate import FLOAT_DTYPES

    return {d for d in FLOAT_DTYPES if min(floor_levels(d)) <= finite_fill(bug, d) + 20}


FILL_MUTANTS = {
    f"finite_fill_{name}": (f"finite_fill_{name}", "corner_finite_floor") for name in FINITE_FILLS
}
#: pytest -k of a fill mutant's run: sdpa's forward matches_golden, whose corner_finite_floor rows the
#: test reads (all five forward sdpa properties ran before, the other four shrinking failures no test read)
FILL_RUN = MUTANT_RUN
# the attention variants of issue #15; their runs are restricted to the variant tests (`VARIANT_RUN`)
VARIANT_MUTANTS = {
    "softcap_after_bias": ("softcap_after_bias", "softcap"),  # TransformerEngine's order (TE PR 3391)
    "alibi_upper_left_anchor": ("alibi_upper_left_anchor", "alibi"),  # |i - j| under lower_right
    "alibi_lower_right_anchor": ("alibi_lower_right_anchor", "alibi"),  # |i + m - n - j| always
    "alibi_wrong_sign": ("alibi_wrong_sign", "alibi"),
    "sink_in_numerator": ("sink_in_numerator", "sinks"),  # the sink's share added to the output
    "lse_no_max": ("lse_no_max", "lse"),  # log of the max-shifted sum
    "segments_le": ("segments_le", "segments"),  # q_id <= kv_id instead of ==
    "dropout_not_rescaled": ("dropout_not_rescaled", "dropout"),  # no 1 / (1 - p)
    "lengths_on_padded": ("lengths_on_padded", "causal_lower_right_lengths"),  # = lower_right
}
#: the control's run: every chapter a mutant's run draws from (MUTANT_RUN, FILL_RUN, variant_run), whole
CONTROL_RUN = "test_sdpa or test_variants"
#: mutant -> the sdpa properties that failed it when it ran through more of the suite, recorded from
#: those runs' results (2026-11: the whole suite for `MUTANTS`, where matches_golden named each one's
#: feature; all of test_variants.py for the variant mutants, CONTRIBUTING.md's "caught by" column):
#: each must go on failing it. Its run is these properties alone (`MUTANT_RUN`, `variant_run`).
KILLED_BY = {
    **{m: ("matches_golden",) for m in MUTANTS},
    "softcap_after_bias": ("softcap_before_bias", "variants_match_golden"),
    "alibi_upper_left_anchor": ("alibi_anchor",),
    "alibi_lower_right_anchor": ("alibi_anchor",),
    "alibi_wrong_sign": ("alibi_anchor", "variants_match_golden"),
    "sink_in_numerator": ("variants_match_golden", "sink_share"),
    "lse_no_max": ("variants_match_golden", "sink_share"),
    "segments_le": ("variants_match_golden",),
    "dropout_not_rescaled": ("dropout_keep_all", "variants_match_golden"),
    "lengths_on_padded": ("variants_match_golden",),
}
#: a variant property (as the results name it) -> its test in conformance/test_variants.py
VARIANT_TESTS = {
    "variants_match_golden": "test_variants_match_golden",
    "softcap_before_bias": "test_softcap_before_bias",
    "alibi_anchor": "test_alibi_anchor",
    "sink_share": "test_sink_takes_its_share",
    "dropout_keep_all": "test_dropout_keep_all_rescales",
}


def variant_run(mutant: str) -> str:
    """pytest -k of a variant mutant's run: the variant properties that catch it (`KILLED_BY`); all
    six of test_variants.py took 75 to 140 s a mutant, shrinking failures no test read."""
    return f"test_variants.py and ({' or '.join(VARIANT_TESTS[p] for p in KILLED_BY[mutant])})"


def make(bug):
    return type(f"Mutant_{bug}", (Naive,), {"name": f"mutant-{bug}", "bug": bug})


def control():
    return Naive()


for _name, (_bug, _) in {**MUTANTS, **VARIANT_MUTANTS, **FILL_MUTANTS}.items():
    globals()[f"mutant_{_name}"] = (lambda b: lambda: make(b)())(_bug)


class Crasher(Naive):
    """Aborts the process (as a segfaulting kernel would) for float32 with n > m; correct elsewhere."""

    name = "crasher"

    def sdpa(self, q, k, v, **kw):
        if q.dtype == np.float32 and q.shape[-2] > k.shape[-2]:
            import os

            os.abort()
        return super().sdpa(q, k, v, **kw)


class DeviceFault(Naive):
    """A GPU kernel's fault, which is sticky: for float32 with n > m it raises CUDA's "misaligned
    address", and from then on every call in the process raises it too (torch's AcceleratorError
    does this on a real GPU). Correct until then."""

    name = "device-fault"
    faulted = False

    def sdpa(self, q, k, v, **kw):
        if DeviceFault.faulted or (q.dtype == np.float32 and q.shape[-2] > k.shape[-2]):
            DeviceFault.faulted = True
            raise RuntimeError("CUDA error: misaligned address\nCompile with `TORCH_USE_CUDA_DSA` ...")
        return super().sdpa(q, k, v, **kw)


class Hanger(Naive):
    """Never returns (a deadlocked kernel) for float32 with n > m; correct elsewhere."""

    name = "hanger"

    def sdpa(self, q, k, v, **kw):
        if q.dtype == np.float32 and q.shape[-2] > k.shape[-2]:
            import time

            time.sleep(3600)
        return super().sdpa(q, k, v, **kw)


class SignatureDrift(Naive):
    """Correct numbers, but sdpa's signature drifted from the spec's: the variants' keywords are
    gone, and dropout_p, read by nothing, defaults to 0.0 rather than None. Its own run must fail."""

    name = "signature-drift"
    drifted = (*(o for o in OPTIONS if o.variant is None), Option("dropout_p", "float", 0.0, "value"))

    @with_options(table=drifted)
    def sdpa(self, q, k, v, **options):
        options = take(f"{self.name}.sdpa", options, table=self.drifted)
        del options["dropout_p"]
        return super().sdpa(q, k, v, **options)
