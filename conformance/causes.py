"""Naming the semantic cause of a failed sdpa case, so a failure says *why* before *how much*.

`sdpa_causes` compares a backend's output (and weights) with the golden row by row and names a
rule of the spec only where the case shows it broken; where nothing is shown it names nothing,
and the message's comparison lines give the numbers. Every cause starts with one of
`CAUSE_PREFIXES`:

- "row with no visible key: expected 0, got NaN" (or "got mean(V) over all keys", "got values up
  to X"): only where the row's golden is 0 and the keys hidden from it are all finite;
- "a hidden key's NaN/inf reached visible row ..." or "... reached row with no visible key ...":
  the row is NaN/inf, its golden is not, and a key hidden from that row holds NaN or inf;
- "hidden keys took weight there, as under a finite mask fill of F ...": the failing rows equal
  attention in which the hidden keys got the finite logit F (-1e4, -1e6, -1e9, -0.7 * finfo.max
  or finfo.min) in place of their logit or added to it, simulated in float64 (`_fill_match`);
- "row with a visible key came out 0, as a row with no visible key would ...": exactly 0 where the
  golden is not (ONNX Runtime, for a row whose only visible key sits at a bias of finfo.min);
- "GQA heads tiled: ...": the output is the golden with kv head h % Hkv in place of h // G;
- "visible weights leak to hidden keys": returned weights are nonzero on a hidden key;
- "raised ...": the call raised (stated by the suite's judge, `attnspec.conformance.conftest`).

`fp8_causes` does the same for `sdpa_fp8`: "the output is the golden with <a descale left out or
applied twice> ...: a descale bug", or "the output is within the budget of P rounded to e4m3 ..."
under a float32 claim.

An empty list means no rule-specific cause was found (a plain numerical difference, or a
difference this module cannot explain).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["CAUSE_PREFIXES", "fp8_causes", "sdpa_causes"]

#: how every cause begins (the last is the judge's, for a call that raised)
CAUSE_PREFIXES = (
    "row with no visible key",
    "row with a visible key came out 0",
    "a hidden key's NaN/inf reached",
    "hidden keys took weight",
    "GQA heads tiled",
    "visible weights leak to hidden keys",
    "raised ",
)

#: rows named in a message, at most
SHOWN = 3
#: a row's visible logits at or below this are "at a finite floor" (named in the zero-row cause)
FLOOR = -1e4
#: a simulated fill matches a row within the case's allowed error plus this share of how far the
#: fill moves that row from the golden (the backend rounds the fill's logits its own way)
FILL_SLACK = 0.02


def _rows(idx: np.ndarray) -> str:
    shown = ", ".join(str(tuple(int(i) for i in row)) for row in idx[:SHOWN])
    more = f" and {len(idx) - SHOWN} more" if len(idx) > SHOWN else ""
    return f"{shown}{more}"


def _per_head(plan, x, lead: tuple[int, ...]) -> np.ndarray:
    """k or v as float64, kv head h // G read by query head h: (*batch, Hq, m, d)."""
    x = np.asarray(x, np.float64)
    if x.ndim == 2:
        x = x[None]
    x = np.repeat(x, plan.group, axis=-3)  # (..., Hq, m, d)
    return np.broadcast_to(x, (*lead, *x.shape[-2:]))


def sdpa_causes(
    plan,
    vis: np.ndarray,
    q,
    k,
    v,
    got: np.ndarray,
    golden: np.ndarray,
    allowed: float,
    got_w: np.ndarray | None = None,
    bias: np.ndarray | None = None,
) -> list[str]:
    """Causes for one sdpa case. ``vis`` is the case's visibility (*batch, Hq, n, m); ``got`` and
    ``golden`` are outputs in float64 (any shape holding (*batch, Hq, n, dv) elements)."""
    full = (*vis.shape[:-1], plan.dv)
    if got.size != int(np.prod(full)) or golden.size != got.size:
        return []
    got, golden = got.reshape(full), golden.reshape(full)
    lead = vis.shape[:-2]  # (*batch, Hq)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - golden)
        bad = (
            (err > allowed) | (np.isfinite(golden) != np.isfinite(got)) | (np.isnan(got) & ~np.isnan(golden))
        )
    bad_rows = bad.any(axis=-1)  # (*batch, Hq, n)
    empty = ~vis.any(axis=-1)  # (*batch, Hq, n)
    got_finite, golden_finite = np.isfinite(got).all(axis=-1), np.isfinite(golden).all(axis=-1)
    key_bad = ~np.isfinite(_per_head(plan, k, lead)).all(axis=-1) | ~np.isfinite(
        _per_head(plan, v, lead)
    ).all(axis=-1)  # (*batch, Hq, m)
    hidden_bad = (~vis & key_bad[..., None, :]).any(axis=-1)  # (*batch, Hq, n): a hidden key holds NaN/inf
    causes = []

    hit = bad_rows & empty & (golden == 0).all(axis=-1)
    leak_empty = hit & hidden_bad & ~got_finite
    if leak_empty.any():
        what = "NaN" if np.isnan(got[leak_empty]).any() else "inf"
        causes.append(
            f"a hidden key's NaN/inf reached row with no visible key: expected 0, got {what} "
            f"(rows {_rows(np.argwhere(leak_empty))} of (*batch, Hq, n))"
        )
    hit &= ~hidden_bad
    if hit.any():
        causes.append(
            f"row with no visible key: expected 0, got {_empty_got(plan, v, got, hit, allowed, full)} "
            f"(rows {_rows(np.argwhere(hit))} of (*batch, Hq, n))"
        )

    leak = bad_rows & ~empty & ~got_finite & golden_finite & hidden_bad
    if leak.any():
        causes.append(f"a hidden key's NaN/inf reached visible row {_rows(np.argwhere(leak))}")

    rows = ~empty & got_finite & golden_finite  # where a finite fill could explain the output
    zero = bad_rows & rows & (got == 0).all(axis=-1)
    if (bad_rows & rows).any():
        s, bias_inf = _logits(plan, vis, q, k, bias)
        fill, filled = _fill_match(
            plan, vis, s, bias_inf, _per_head(plan, v, lead), got, golden, allowed, rows, bad_rows, zero
        )
        if fill is not None:
            causes.append(
                f"hidden keys took weight there, as under a finite mask fill of {fill} "
                f"(rows {_rows(np.argwhere(filled))} of (*batch, Hq, n))"
            )
            zero &= ~filled
        if zero.any():
            top = float(np.where(vis, s, -np.inf)[zero].max())
            why = (
                f": its visible keys (logits up to {top:.3g}) were treated as hidden" if top <= FLOOR else ""
            )
            causes.append(
                f"row with a visible key came out 0, as a row with no visible key would{why} "
                f"(rows {_rows(np.argwhere(zero))} of (*batch, Hq, n))"
            )

    if not causes and plan.group > 1 and plan.hkv > 1 and _matches_tiled(plan, q, k, v, vis, got, allowed):
        causes.append(
            "GQA heads tiled: query head h reads kv head h % Hkv; the spec's is h // G "
            f"(G = Hq / Hkv = {plan.group})"
        )
    if got_w is not None and got_w.size == vis.size:
        w = got_w.reshape(vis.shape)
        with np.errstate(invalid="ignore"):
            leaks = (~vis & (w != 0)).any(axis=-1) & ~empty
        if leaks.any():
            causes.append(f"visible weights leak to hidden keys (rows {_rows(np.argwhere(leaks))})")
    return causes


def _empty_got(plan, v, got: np.ndarray, hit: np.ndarray, allowed: float, full) -> str:
    """What the empty rows ``hit`` hold: NaN, mean(V) over all keys, or values up to X."""
    rows = got[hit]  # (rows, dv)
    if np.isnan(rows).any():
        return "NaN"
    mean = _per_head(plan, v, full[:-2]).mean(axis=-2, keepdims=True)  # (*batch, Hq, 1, dv)
    mean = np.broadcast_to(mean, full)[hit]
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(rows - mean) <= allowed + 1e-2 * np.abs(mean)
    return "mean(V) over all keys" if close.all() else f"values up to {np.abs(rows).max():.3g}"


def _logits(plan, vis: np.ndarray, q, k, bias) -> tuple[np.ndarray, np.ndarray]:
    """(scale * q.k + finite bias, where the bias is -inf), both (*batch, Hq, n, m), in float64."""
    q64 = np.asarray(q, np.float64)
    q64 = q64[None] if q64.ndim == 2 else q64
    k64 = _per_head(plan, k, vis.shape[:-2])
    with np.errstate(invalid="ignore", over="ignore"):
        s = plan.scale * (q64 @ np.swapaxes(k64, -1, -2))  # (..., Hq, n, m)
        if bias is None:
            return np.broadcast_to(s, vis.shape), np.zeros(vis.shape, bool)
        b = np.broadcast_to(np.asarray(bias, np.float64), vis.shape)
        bias_inf = b == -np.inf
        return np.broadcast_to(s + np.where(bias_inf, 0.0, b), vis.shape), bias_inf


def fill_candidates(dtype: str) -> list[tuple[str, float]]:
    """The finite mask fills real code uses, named, for inputs of ``dtype``: -1e4, -1e6, -1e9 (as
    written, and rounded to ``dtype`` where that differs), -0.7 * finfo.max and finfo.min of
    ``dtype`` (and of float32, where fused kernels compute the logits of 16-bit inputs)."""
    from attnspec.spec.dtypes import NUMPY_DTYPES

    npdt = NUMPY_DTYPES[dtype]
    out: list[tuple[str, float]] = []
    for name, x in (("-1e4", -1e4), ("-1e6", -1e6), ("-1e9", -1e9)):
        out.append((name, x))
        with np.errstate(over="ignore"):
            r = float(np.asarray(x).astype(npdt))
        if np.isfinite(r) and r != x:
            out.append((f"{name} in {dtype} ({r:g})", r))
    for name in dict.fromkeys((dtype, "float32" if dtype in ("float16", "bfloat16") else dtype)):
        fi = ml_dtypes.finfo(npdt if name == dtype else np.float32)
        out += [(f"-0.7 * finfo({name}).max", -0.7 * float(fi.max)), (f"finfo({name}).min", float(fi.min))]
    return out


#: how a fill F reaches a hidden key's logit: in its place, or added to it
READINGS = ("replacing their logits", "added to their logits")
#: fills are simulated on at most this many values (rows * m * dv): on every row with a visible
#: key where they fit, else on the failing rows, else on the first failing rows that fit
SIM_VALUES = 1 << 22


def _fill_match(plan, vis, s, bias_inf, v, got, golden, allowed, rows, bad_rows, zero):
    """The finite fill(s) the failing rows match, described, and the rows they explain.

    Each candidate F (`fill_candidates`) is simulated in float64 on the rows with a visible key,
    in every reading: F replacing each hidden key's logit or added to it; keys hidden by a -inf
    bias filled too or still excluded; the hidden keys' values kept or zeroed (as a backend does
    to stop NaN leaking). A simulation explains a row where it moves the row off the golden by more
    than ``allowed`` and the backend's row is within ``allowed + FILL_SLACK * that move`` of it and
    nearer it than the golden. A candidate is dropped where it would move a row that passed and the
    backend did not follow it. The winner explains the most failing rows that are not exactly 0
    (at least one: an all-zero row is as well explained by a key treated as hidden), then the most
    zero rows; every reading with the same rows is named.
    """
    per_row = vis.shape[-1] * v.shape[-1]
    sel = rows if int(rows.sum()) * per_row <= SIM_VALUES else rows & bad_rows
    if int(sel.sum()) * per_row > SIM_VALUES:
        keep = np.flatnonzero(sel)[: max(1, SIM_VALUES // per_row)]
        sel = np.zeros(sel.shape, bool)
        sel.flat[keep] = True
    S, B, Vis = s[sel], bias_inf[sel], vis[sel]  # (r, m)
    Vv = np.broadcast_to(v[..., None, :, :], (*vis.shape[:-1], *v.shape[-2:]))[sel]  # (r, m, dv)
    G, X, bad, Z = golden[sel], got[sel], bad_rows[sel], zero[sel]  # (r, dv), (r,)
    d_g = np.abs(X - G).max(axis=-1, initial=0.0)
    hidden_by_bias = B & ~Vis
    best, names = None, []
    for name, f in fill_candidates(plan.dtype):
        for reading in READINGS:
            for bias_excluded in (False, True) if hidden_by_bias.any() else (False,):
                for zeroed in (False, True):
                    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                        hid = np.full(S.shape, f) if reading == READINGS[0] else S + f
                        x = np.where(Vis, S, hid)
                        if bias_excluded:
                            x = np.where(hidden_by_bias, -np.inf, x)
                        w = np.exp(x - x.max(axis=-1, keepdims=True))
                        w = w / w.sum(axis=-1, keepdims=True)  # (r, m)
                        vals = np.where(zeroed & ~Vis[..., None], 0.0, Vv)
                        sim = (w[..., None] * vals).sum(axis=-2)  # (r, dv)
                        d_sg = np.abs(sim - G).max(axis=-1, initial=0.0)
                        d_s = np.abs(sim - X).max(axis=-1, initial=0.0)
                    moved = np.isfinite(sim).all(axis=-1) & (d_sg > allowed)
                    follows = d_s <= allowed + FILL_SLACK * d_sg
                    if (moved & ~bad & ~follows).any():
                        continue
                    explains = moved & bad & follows & (d_s <= 0.5 * d_g)
                    score = (int((explains & ~Z).sum()), int((explains & Z).sum()))
                    if score[0] == 0:
                        continue
                    label = (name, reading, zeroed)
                    if best is None or score > best[0]:
                        best, names = (score, explains), [label]
                    elif score == best[0] and np.array_equal(explains, best[1]):
                        names.append(label)
    if best is None:
        return None, None
    filled = np.zeros(rows.shape, bool)
    filled[sel] = best[1]
    fills = list(dict.fromkeys(n for n, _, _ in names))
    readings = list(dict.fromkeys(r for _, r, _ in names))
    what = fills[0] if len(fills) == 1 else ", ".join(fills[:-1]) + f" or {fills[-1]}"
    how = readings[0] if len(readings) == 1 else "replacing or added to their logits"
    if all(z for _, _, z in names):
        how += ", their values zeroed"
    return f"{what} {how}", filled


def _matches_tiled(plan, q, k, v, vis, got, allowed) -> bool:
    """Whether ``got`` is the golden of the same call with kv heads tiled (h reads h % Hkv)."""
    from attnspec.spec import sdpa

    if k.ndim < 3:
        return False
    heads = np.arange(plan.hq) % plan.hkv  # the tiled mapping
    kt, vt = (np.take(x.astype(np.float64), heads, axis=-3) for x in (k, v))  # (..., Hq, m, d)
    with np.errstate(invalid="ignore", over="ignore"):
        tiled = sdpa(q.astype(np.float64), kt, vt, mask=vis)
        diff = np.abs(tiled.reshape(got.shape) - got)
    return bool(np.all((diff <= allowed) | (np.isnan(tiled.reshape(got.shape)) & np.isnan(got))))


# -- sdpa_fp8 --------------------------------------------------------------------------------

#: the descale bugs `fp8_causes` recognises: what the output equals, and the descales of that call
#: (None: left out, "twice": squared)
DESCALE_BUGS = (
    ("every descale left out", {"q_descale": None, "k_descale": None, "v_descale": None}),
    ("q_descale and k_descale left out of the softmax scale", {"q_descale": None, "k_descale": None}),
    ("k_descale left out", {"k_descale": None}),
    ("q_descale left out", {"q_descale": None}),
    ("v_descale not applied", {"v_descale": None}),
    ("v_descale applied twice", {"v_descale": "twice"}),
    ("q_descale and k_descale applied twice", {"q_descale": "twice", "k_descale": "twice"}),
)


def fp8_causes(q, k, v, options: dict, got, allowed: float, claim: str) -> list[str]:
    """What a failing `sdpa_fp8` output is, when it is a known bug: the golden of the same call
    (stored ``q, k, v`` and the call's ``options``) with a descale left out or applied twice, or,
    under a float32 ``claim``, a P rounded to e4m3 before P @ V. The suite's FP8 property and the
    FP8 vectors' verify both ask here."""
    from attnspec.spec.fp8 import sdpa_fp8
    from attnspec.spec.tolerance import compare
    from attnspec.spec.tolerance_fp8 import fp8_golden

    got = np.asarray(got, np.float64)
    base = {key: val for key, val in options.items() if key not in ("return_lse", "return_weights")}
    for what, change in DESCALE_BUGS:
        opts, changed = dict(base), False
        for name, how in change.items():
            if opts.get(name) is not None:
                opts[name] = None if how is None else np.asarray(opts[name] * opts[name], np.float32)
                changed = True
        if not changed:
            continue
        try:
            wrong = np.asarray(sdpa_fp8(q, k, v, **{**opts, "out_dtype": "float64"}))
        except Exception:  # a variant the spec refuses is no explanation
            continue
        off = (
            np.nanmax(np.abs(wrong - got.reshape(wrong.shape)), initial=0.0)
            if wrong.size == got.size
            else None
        )
        if off is not None and off <= allowed:
            return [f"the output is the golden with {what} (within the allowed error): a descale bug"]
    if claim == "float32":
        g8 = fp8_golden(q, k, v, p_precision="float8_e4m3fn", **options)
        if g8.out.size == got.size and compare(got.reshape(g8.out.shape), g8.out, g8.allowed_out).ok:
            return [
                "the output is within the budget of P rounded to e4m3 before P @ V (FlashAttention-3's "
                "rounding), not of float32 P: if the kernel rounds P, claim fp8_p_precision="
                "'float8_e4m3fn' (attnspec check --fp8-p-precision float8_e4m3fn)"
            ]
    return []
