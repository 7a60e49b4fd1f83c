"""Naming the semantic cause of a failed sdpa case, so a failure says *why* before *how much*.

`sdpa_causes` compares a backend's output (and weights) with the golden row by row and names
the rules of the spec the difference lands on:

- "row with no visible key: expected 0, got NaN" (or "got mean(V)", "got values up to X");
- "a hidden key's NaN/inf reached visible row (...)";
- "visible weights leak to hidden keys";
- "rows whose visible logits are all <= -1e4 differ: hidden keys took weight there" (a finite mask
  fill such as -1e9 or finfo.min, instead of excluding the keys).

An empty list means no rule-specific cause was found (a plain numerical difference).
"""

from __future__ import annotations

import numpy as np

__all__ = ["sdpa_causes"]

#: rows named in a message, at most
SHOWN = 3


def _rows(idx: np.ndarray) -> str:
    shown = ", ".join(str(tuple(int(i) for i in row)) for row in idx[:SHOWN])
    more = f" and {len(idx) - SHOWN} more" if len(idx) > SHOWN else ""
    return f"{shown}{more}"


def _mean_v(v: np.ndarray, group: int, full_shape: tuple[int, ...]) -> np.ndarray:
    """mean over all m keys of each query head's values: (*batch, Hq, 1, dv)."""
    v = v.astype(np.float64)
    if v.ndim == 2:
        v = v[None]
    with np.errstate(invalid="ignore", over="ignore"):
        mean = v.mean(axis=-2, keepdims=True)  # (..., Hkv, 1, dv)
    mean = np.repeat(mean, group, axis=-3)  # (..., Hq, 1, dv)
    return np.broadcast_to(mean, (*full_shape[:-2], 1, mean.shape[-1]))


def sdpa_causes(plan, vis: np.ndarray, q, k, v, got: np.ndarray, golden: np.ndarray, allowed: float,
                got_w: np.ndarray | None = None, bias: np.ndarray | None = None) -> list[str]:
    """Causes for one sdpa case. ``vis`` is the case's visibility (*batch, Hq, n, m); ``got`` and
    ``golden`` are outputs in float64 (any shape holding (*batch, Hq, n, dv) elements)."""
    full = (*vis.shape[:-1], plan.dv)
    if got.size != int(np.prod(full)) or golden.size != got.size:
        return []
    got, golden = got.reshape(full), golden.reshape(full)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(got - golden)
        bad = (err > allowed) | (np.isfinite(golden) != np.isfinite(got)) | (np.isnan(got) & ~np.isnan(golden))
    bad_rows = bad.any(axis=-1)  # (*batch, Hq, n)
    empty = ~vis.any(axis=-1)  # (*batch, Hq, n)
    causes = []
    hit = bad_rows & empty
    if hit.any():
        rows = got[hit]  # (rows, dv)
        idx = np.argwhere(hit)
        if np.isnan(rows).any():
            what = "NaN"
        else:
            mean = _mean_v(v, plan.group, vis.shape)
            mean = np.broadcast_to(mean, full)[hit]
            with np.errstate(invalid="ignore", over="ignore"):
                close = np.abs(rows - mean) <= allowed + 1e-2 * np.abs(mean)
            what = "mean(V) over all keys" if close.all() else f"values up to {np.abs(rows).max():.3g}"
        causes.append(f"row with no visible key: expected 0, got {what} (rows {_rows(idx)} of (*batch, Hq, n))")
    hidden_nonfinite = _hidden_nonfinite(plan, vis, k, v)
    leak = bad_rows & ~empty & ~np.isfinite(got).all(axis=-1) & np.isfinite(golden).all(axis=-1)
    if hidden_nonfinite and leak.any():
        causes.append(f"a hidden key's NaN/inf reached visible row {_rows(np.argwhere(leak))}")
    floor = bad_rows & ~empty & (_row_max_logit(plan, vis, q, k, bias) <= FLOOR)
    if floor.any():
        causes.append(f"rows whose visible logits are all <= {FLOOR:g} differ (rows {_rows(np.argwhere(floor))}): "
                      "hidden keys took weight there, as under a finite mask fill (-1e4, -1e9, finfo.min) "
                      "instead of excluding them")
    if not causes and plan.group > 1 and plan.hkv > 1 and _matches_tiled(plan, q, k, v, vis, got, allowed):
        causes.append("GQA heads tiled: query head h reads kv head h % Hkv; the spec's is h // G "
                      f"(G = Hq / Hkv = {plan.group})")
    if got_w is not None and got_w.size == vis.size:
        w = got_w.reshape(vis.shape)
        with np.errstate(invalid="ignore"):
            leaks = (~vis & (w != 0)).any(axis=-1) & ~empty
        if leaks.any():
            causes.append(f"visible weights leak to hidden keys (rows {_rows(np.argwhere(leaks))})")
    return causes


#: a row whose visible logits all lie at or below this is where a finite mask fill shows
FLOOR = -1e4


def _row_max_logit(plan, vis: np.ndarray, q, k, bias) -> np.ndarray:
    """The largest visible logit scale * q.k + bias of each row, (*batch, Hq, n); -inf if none."""
    q64, k64 = (np.asarray(x, np.float64) for x in (q, k))
    if q64.ndim == 2:
        q64, k64 = q64[None], k64[None]
    k64 = np.repeat(k64, plan.group, axis=-3)  # (..., Hq, m, dk): query head h reads kv head h // G
    with np.errstate(invalid="ignore", over="ignore"):
        s = plan.scale * (q64 @ np.swapaxes(k64, -1, -2))  # (..., Hq, n, m)
        if bias is not None:
            s = s + np.asarray(bias, np.float64)
        s = np.broadcast_to(s, vis.shape)
        return np.where(vis, s, -np.inf).max(axis=-1, initial=-np.inf)


def _hidden_nonfinite(plan, vis: np.ndarray, k, v) -> bool:
    """Whether some key hidden from some row holds NaN or inf in k or v."""
    kv = np.asarray(k, np.float64)
    if k.shape[:-1] == v.shape[:-1]:
        kv = np.concatenate([kv, np.asarray(v, np.float64)], axis=-1)
    bad_key = ~np.isfinite(kv).all(axis=-1)  # (..., Hkv, m)
    return bool(bad_key.any() and (~vis).any())


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
