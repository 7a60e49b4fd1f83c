"""A FlashAttention-3-style FP8 attention in torch, and three FP8 bugs, for ``attnspec check``.

``fa3_style`` has FA3's ``flash_attn_func`` keywords (q (B, n, Hq, d), k and v (B, m, Hkv, d);
``q_descale``, ``k_descale``, ``v_descale`` float32 (B, Hkv)). On FP8 inputs it computes as FA3
does: q . k on the stored FP8 values upcast to float32, the softmax scale folded with
q_descale * k_descale, P @ V on the stored v, v_descale applied at the output, bfloat16 out.
Other dtypes (FA3's fp16 and bf16 path, and float32 / float64 here) run the same code with no
descales and return q's dtype. Causal and windows are lower-right aligned; GQA maps query head h
to kv head h // G; softcap bends the scaled logits; a row with no visible key returns 0.

    attnspec check examples/fp8/fp8_attention.py:fa3_style --convention flash3_fp8
    attnspec check examples/fp8/fp8_attention.py:forget_descale --convention flash3_fp8 -k fp8
    attnspec check examples/fp8/fp8_attention.py:p_e4m3 --convention flash3_fp8 -k fp8 \\
        --fp8-p-precision float8_e4m3fn

The mutants (each one bug, on the FP8 path only):
- ``forget_descale``: folds only the softmax scale; q_descale and k_descale are never applied;
- ``descale_twice``: applies v_descale to v and again at the output;
- ``p_e4m3``: rounds P to e4m3 before P @ V as FA3 does (the row's largest scaled to 2**8); it
  fails while its user claims float32 P, and passes once the claim is e4m3.
"""

from __future__ import annotations

import math

import torch

from attnspec.backends import get_convention

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def fa3_style(
    q,
    k,
    v,
    softmax_scale=None,
    causal=False,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    window_size=(-1, -1),
    softcap=0.0,
    return_attn_probs=False,
    out_dtype=None,
    *,
    _bug=None,
):
    """FA3's flash_attn_func, correct: FP8 in with descales, bfloat16 out (``_bug`` makes the mutants below)."""
    bug = _bug
    B, n, Hq, d = q.shape
    m, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    fp8 = q.dtype in FP8
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    ones = torch.ones(B, Hkv, dtype=acc, device=q.device)
    qd, kd, vd = (ones if x is None or not fp8 else x.to(acc) for x in (q_descale, k_descale, v_descale))
    qd, kd, vd = (x.repeat_interleave(G, dim=1) for x in (qd, kd, vd))  # (B, Hq): head h reads h // G
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(d)
    fold = scale * qd * kd if bug != "forget_descale" else scale * torch.ones_like(qd)  # (B, Hq)
    qf = q.to(acc).permute(0, 2, 1, 3)  # (B, Hq, n, d)
    kf = k.to(acc).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)  # (B, Hq, m, d)
    vf = v.to(acc).permute(0, 2, 1, 3).repeat_interleave(G, dim=1)  # (B, Hq, m, dv)
    if bug == "descale_twice":
        vf = vf * vd[:, :, None, None]
    s = (qf @ kf.transpose(-1, -2)) * fold[:, :, None, None]  # (B, Hq, n, m)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(n, device=q.device)[:, None] + (m - n)  # lower-right anchor of each query row
    j = torch.arange(m, device=q.device)[None, :]
    left, right = window_size
    visible = torch.ones(n, m, dtype=torch.bool, device=q.device)
    if causal or right >= 0:
        visible &= j <= i + (0 if causal else right)
    if left >= 0:
        visible &= j >= i - left
    s = s.masked_fill(~visible, -math.inf)
    if m == 0:  # no key at all: every row sees nothing, and returns 0
        s = s.new_full((*s.shape[:-1], 1), -math.inf)
        vf = vf.new_zeros((*vf.shape[:-2], 1, vf.shape[-1]))
    row_max = s.amax(dim=-1, keepdim=True)  # (B, Hq, n, 1)
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    P = torch.exp(s - row_max)  # (B, Hq, n, m), in [0, 1]
    Z = P.sum(dim=-1, keepdim=True)  # the unrounded sum, as FA3 keeps it
    if bug == "p_e4m3":  # FA3's rounding: the row's largest at 2**8, inside e4m3's range
        P = (P * 256).to(torch.float8_e4m3fn).to(acc) / 256
    out = (P @ vf) / torch.where(Z == 0, torch.ones_like(Z), Z) * vd[:, :, None, None]  # (B, Hq, n, dv)
    wanted = getattr(torch, out_dtype) if out_dtype else torch.bfloat16 if fp8 else q.dtype
    out = out.permute(0, 2, 1, 3).to(wanted)  # (B, n, Hq, dv)
    if not return_attn_probs:
        return out
    lse = (
        (torch.log(Z) + row_max).squeeze(-1).to(torch.float32 if acc == torch.float32 else acc)
    )  # (B, Hq, n)
    return out, lse, None


def forget_descale(q, k, v, **kwargs):
    """Wrong: q_descale and k_descale never reach the softmax scale."""
    return fa3_style(q, k, v, **kwargs, _bug="forget_descale")


def descale_twice(q, k, v, **kwargs):
    """Wrong: v_descale dequantises v and scales the output too."""
    return fa3_style(q, k, v, **kwargs, _bug="descale_twice")


def p_e4m3(q, k, v, **kwargs):
    """FA3's P rounding to e4m3: wrong under a float32 claim, right under the e4m3 one."""
    return fa3_style(q, k, v, **kwargs, _bug="p_e4m3")


#: flash3_fp8 for a function that also returns float32 when asked (``out_dtype="float32"``): the
#: FP8 property's float32 cases, where P precision shows, then run (FA3 itself returns bfloat16)
FLASH3_FP8_F32 = get_convention("flash3_fp8").extend(
    "flash3_fp8_f32", fp8_out_dtypes=("bfloat16", "float32"), fp8_out_keyword="out_dtype"
)
