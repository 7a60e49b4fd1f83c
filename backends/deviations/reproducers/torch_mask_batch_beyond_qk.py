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
