"""The declared deviations of torch's own attention (``torch-native``: SDPA and
nn.MultiheadAttention), measured on torch 2.13 CPU. Part of `attnspec.backends.deviations`."""

from __future__ import annotations

from attnspec.backends import deviation_cases as c
from attnspec.backends.deviation_probe import Deviation

__all__ = ["TORCH_DEVIATIONS"]

# -- reproducers (framework only) -------------------------------------------------------------

_TORCH = """\
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4)
"""

_TORCH_MHA = """\
import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
x, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
"""

TORCH_DEVIATIONS: tuple[Deviation, ...] = (
    Deviation(
        deviation_id="torch.masked-nonfinite-k",
        tags=frozenset(["masked_nonfinite"]),
        backend="torch-native",
        feature="sdpa: NaN/inf in a masked key",
        spec_says="a masked key is absent: its k never reaches any row",
        native_does="a NaN in a key masked from every row makes every output NaN; a masked +inf "
        "makes NaN the rows where q . k is +inf or NaN (the boolean mask is applied "
        "by adding -inf, and +inf + -inf = NaN)",
        reproducer=_TORCH
        + """\
k[:, 4] = float("nan")  # key 4 is masked from every query
out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.arange(5) < 4)
assert out.isnan().all()  # the spec: finite, key 4 is absent
""",
        fixed_by="torch: _drop_hidden_keys zeroes keys no row sees; otherwise the exact path _exact",
        case=c.hidden_nan_key,
        shows=c.any_nan,
    ),
    Deviation(
        deviation_id="torch.masked-nonfinite-v",
        tags=frozenset(["masked_nonfinite"]),
        backend="torch-native",
        feature="sdpa: NaN/inf in a masked value",
        spec_says="a masked key is absent: its v never reaches any row",
        native_does="NaN or inf in the value of a masked key makes every row NaN in those "
        "columns (weight 0 times NaN or inf is NaN)",
        reproducer=_TORCH
        + """\
v[:, 4] = float("inf")  # key 4 is masked from every query
out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.arange(5) < 4)
assert out.isnan().all()  # the spec: finite, key 4 is absent
""",
        fixed_by="torch: _drop_hidden_keys zeroes keys no row sees; otherwise the exact path _exact",
        case=c.hidden_nan_value,
        shows=c.any_nan,
    ),
    Deviation(
        deviation_id="torch.nonfinite-query-row-zeroed",
        backend="torch-native",
        feature="sdpa: NaN or inf in a query",
        spec_says="NaN propagates: a row whose logits are NaN gives NaN",
        native_does="without attn_mask, the CPU flash kernel (chosen for rank-4 inputs with "
        "dk == dv) returns 0 for a query row whose logits are all NaN (a NaN or inf "
        "in q), as if the row saw no key; with a mask, or in the math kernel, NaN. Which rows "
        "zero depends on how the keys split into the CPU's vector lanes: on AVX2 "
        "float32 with few keys zeroes, float64 gives NaN; AVX-512 zeroed float64 too",
        reproducer=_TORCH
        + """\
q, k, v = q[None], k[None], v[None]  # rank 4: the flash kernel
q[0, 0, 1, 0] = float("nan")
out = F.scaled_dot_product_attention(q, k, v)
assert (out[0, 0, 1] == 0).all()  # the spec: NaN
""",
        fixed_by="torch: a non-finite q sends the call to the exact path _exact",
        case=c.nan_query_row,
        shows=c.row1_is_zero,
    ),
    Deviation(
        deviation_id="torch.mask-batch-beyond-qk",
        tags=frozenset(["mask_batch_beyond_qk"]),
        backend="torch-native",
        feature="sdpa: an attn_mask with batch axes that q and k lack (v carries them)",
        spec_says="q, k, v and the mask broadcast together: each may carry batch axes the others lack "
        "(the output has the broadcast batch)",
        native_does="RuntimeError 'output with shape [...] doesn't match the broadcast shape [...]': the "
        "mask is added in place to q @ k^T, which has q and k's batch only (without a mask, a batch "
        "v alone carries broadcasts)",
        reproducer="""\
import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4), torch.randn(2, 1, 5, 4)
mask = torch.ones(2, 1, 3, 5, dtype=torch.bool)  # the call's batch (2,), as v's
assert F.scaled_dot_product_attention(q, k, v).shape == (2, 1, 3, 4)  # no mask: broadcasts
try:
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # the spec: (2, 1, 3, 4)
except RuntimeError as e:
    assert "broadcast shape" in str(e)
else:
    raise AssertionError("torch broadcast the mask's batch")
""",
        fixed_by="torch: TorchBackend.sdpa expands q, k and v to the call's batch (views) before any kernel",
        case=c.mask_batch_beyond_qk,
        shows=c.refused,
    ),
    # -- torch.nn.MultiheadAttention (function="mha": the case is (query, key, value, options) with
    # params and num_heads in options; the result is (out, weights) from `run_mha`) --
    Deviation(
        deviation_id="torch.mha-mask-polarity",
        function="mha",
        tags=frozenset(["mha", "mask"]),
        backend="torch-native",
        feature="mha: a boolean mask, passed to torch.nn.MultiheadAttention as attn_mask",
        spec_says="mask True = may attend (as in sdpa and torch SDPA's attn_mask)",
        native_does="a boolean attn_mask (and key_padding_mask) of nn.MultiheadAttention is True = "
        "blocked, so the spec's mask passed as it is attends to exactly the keys it "
        "hides (a row it allows fully is blocked fully)",
        reproducer=_TORCH_MHA
        + """\
allowed = torch.tensor([True, True, False, True, False]).expand(3, 5)  # True = may attend
out, _ = mha(x, kv, kv, attn_mask=allowed, need_weights=False)
hidden_keys_only, _ = mha(x, kv[:, [2, 4]], kv[:, [2, 4]], need_weights=False)
assert torch.allclose(out, hidden_keys_only, atol=1e-6)  # the spec: attend to keys 0, 1 and 3
""",
        fixed_by="torch: mha hands the mask to self.sdpa, which reads True = may attend",
        case=c.mha_mask,
        shows=c.attends_to_complement,
    ),
    Deviation(
        deviation_id="torch.mha-empty-row-nan",
        function="mha",
        tags=frozenset(["mha", "no_visible_row", "return_weights"]),
        backend="torch-native",
        feature="mha: a query row with no visible key, with need_weights=True (torch's default)",
        spec_says="attention output 0, so the layer's output is b_o; the row's weights are 0",
        native_does="NaN output and NaN weights for the row (all keys padded by key_padding_mask, "
        "or blocked by a boolean or -inf float attn_mask); need_weights=False takes "
        "its SDPA path, which gives b_o as the spec does",
        reproducer=_TORCH_MHA
        + """\
padding = torch.tensor([[True] * 5, [False] * 5])  # batch 0: every key is padding
out, w = mha(x, kv, kv, key_padding_mask=padding)  # need_weights=True by default
assert out[0].isnan().all() and w[0].isnan().all()  # the spec: out_proj.bias, weights 0
out, _ = mha(x, kv, kv, key_padding_mask=padding, need_weights=False)
assert torch.allclose(out[0], mha.out_proj.bias.expand(3, 8))  # its SDPA path agrees with the spec
""",
        fixed_by="torch: mha calls self.sdpa, whose rows with no visible key are 0, so out = b_o",
        case=c.mha_padded_batch,
        shows=c.batch0_nan,
    ),
    Deviation(
        deviation_id="torch.mha-weights-head-averaged",
        function="mha",
        tags=frozenset(["mha", "return_weights"]),
        backend="torch-native",
        feature="mha: attention weights (need_weights=True)",
        spec_says="weights per head, (..., H, n, m)",
        native_does="weights averaged over the heads, (N, n, m): average_attn_weights=True is the "
        "default; average_attn_weights=False gives (N, H, n, m)",
        reproducer=_TORCH_MHA
        + """\
_, w = mha(x, kv, kv)
_, per_head = mha(x, kv, kv, average_attn_weights=False)
assert w.shape == (2, 3, 5) and torch.allclose(w, per_head.mean(dim=1))  # the spec: (2, 2, 3, 5)
""",
        fixed_by="torch: mha returns self.sdpa's per-head weights",
        case=c.mha_weights,
        shows=c.weights_head_mean,
    ),
)
