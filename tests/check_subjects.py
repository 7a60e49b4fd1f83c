"""Functions `attnspec check` is tried on in tests/test_check.py: correct ones written here by
hand from the spec's definition (never through attnspec), broken ones, and a few lines wrapping
the frameworks' own primitives with `from_function`.

Shape letters as in `attnspec.spec.sdpa`.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import torch

from attnspec.backends import from_function


def _torch_attend(q, k, v, vis, s):
    """softmax over visible keys only, in float64; hidden keys add nothing, an empty row gives 0."""
    if s.shape[-1] == 0:  # no key at all: every row is empty
        return torch.zeros(*s.shape[:-1], v.shape[-1], dtype=s.dtype)
    vis = vis.expand(s.shape)
    s = s.masked_fill(~vis, -math.inf)
    top = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(top), top, torch.zeros_like(top))).masked_fill(~vis, 0)
    total = e.sum(dim=-1, keepdim=True)
    w = e / torch.where(total == 0, torch.ones_like(total), total)  # (..., Hq, n, m)
    terms = w[..., :, :, None] * v[..., None, :, :]  # (..., Hq, n, m, dv)
    return torch.where(vis[..., None], terms, torch.zeros((), dtype=terms.dtype)).sum(dim=-2)


def _torch_sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, expand):
    dtype = query.dtype
    q, k, v = (x.double() for x in (query, key, value))
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        k, v = expand(k, q.shape[-3] // k.shape[-3]), expand(v, q.shape[-3] // k.shape[-3])
    n, m = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-2, -1)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)  # (..., n, m)
    vis = torch.ones(n, m, dtype=torch.bool)
    if is_causal:
        vis = torch.ones(n, m, dtype=torch.bool).tril()  # upper-left: j <= i
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        vis = vis & attn_mask
    elif attn_mask is not None:
        vis = vis & (attn_mask != -math.inf)
        s = s + attn_mask.double()
    return _torch_attend(q, k, v, vis, s).to(dtype)


def _interleaved(x, g):
    return x.repeat_interleave(g, dim=-3)  # query head h reads kv head h // G


def _tiled(x, g):
    return x.repeat(*([1] * (x.ndim - 3)), g, 1, 1)  # query head h reads kv head h % Hkv


def correct_torch_sdpa(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch's SDPA signature, computed as the spec defines it."""
    return _torch_sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, _interleaved)


def tiled_gqa_sdpa(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """The same, but GQA heads tiled: query head h reads kv head h % Hkv (onnx PR 7274's bug)."""
    return _torch_sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, _tiled)


def flash_numpy(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1)):
    """FlashAttention's signature on (B, L, H, D) NumPy arrays: causal and window lower-right."""
    dtype = q.dtype
    q, k, v = (np.swapaxes(x, 1, 2).astype(np.float64) for x in (q, k, v))  # (B, H, L, d)
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    n, m = q.shape[2], k.shape[2]
    i, j = np.arange(n)[:, None], np.arange(m)[None, :]
    diag = i + m - n  # the lower-right diagonal
    vis = np.ones((n, m), bool)
    if causal:
        vis &= j <= diag
    left, right = window_size
    if left >= 0:
        vis &= j >= diag - left
    if right >= 0:
        vis &= j <= diag + right
    with np.errstate(invalid="ignore", over="ignore"):
        s = np.where(
            vis, (q @ np.swapaxes(k, -1, -2)) * (softmax_scale or 1 / math.sqrt(q.shape[-1])), -np.inf
        )
        top = s.max(axis=-1, keepdims=True, initial=-np.inf)
        e = np.where(vis, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
        total = e.sum(axis=-1, keepdims=True)
        w = e / np.where(total == 0, 1, total)
        out = np.where(vis[..., None], w[..., None] * v[..., None, :, :], 0).sum(axis=-2)
    return np.swapaxes(out, 1, 2).astype(dtype)  # (B, n, H, dv)


def float32_only(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Refuses every dtype but float32, as some kernels do: the probe must find that."""
    if query.dtype != torch.float32:
        raise TypeError(f"float32_only: got {query.dtype}")
    return correct_torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


#: ``CHECK_SUBJECTS_FAULTS=PATH:N``: the two functions below fail only on their first N calls with
#: n > m of a run, counted in the file PATH across the run's processes and restarts (an
#: intermittent fault). Every restart after a crash or hang costs a child's start (torch's import,
#: the suite's collection); a run with a fault on every n > m case restarted its child 20 times,
#: minutes of the kit's tests. Unset: every call with n > m fails.
FAULTS_ENV = "CHECK_SUBJECTS_FAULTS"


def _faults(query, key) -> bool:
    """Whether this call fails: n > m, and within the run's first N such calls if a limit is set."""
    if query.shape[-2] <= key.shape[-2]:
        return False
    if not os.environ.get(FAULTS_ENV):
        return True
    path, _, limit = os.environ[FAULTS_ENV].rpartition(":")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # one byte a call: atomic across processes
    try:
        os.write(fd, b"x")
        return os.fstat(fd).st_size <= int(limit)
    finally:
        os.close(fd)


def aborts_when_n_gt_m(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Kills the interpreter when n > m (a segfaulting kernel); correct otherwise."""
    if _faults(query, key):
        os.abort()
    return correct_torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def hangs_when_n_gt_m(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """Never returns when n > m (a deadlocked kernel); correct otherwise."""
    if _faults(query, key):
        time.sleep(3600)
    return correct_torch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)


NOT_CALLABLE = 42


# -- the frameworks' own primitives, each wrapped in a line ---------------------------------------


def torch_sdpa_backend():
    import torch.nn.functional as F

    return from_function(
        F.scaled_dot_product_attention,
        "torch_sdpa",
        name="check_subjects:torch_sdpa_backend",
        deviations="torch-native",
    )


def jax_sdpa_backend():
    import jax

    return from_function(
        jax.nn.dot_product_attention, "jax", name="check_subjects:jax_sdpa_backend", deviations="jax-native"
    )
