import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4)
v[:, 4] = float("inf")  # key 4 is masked from every query
out = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.arange(5) < 4)
assert out.isnan().all()  # the spec: finite, key 4 is absent
