import torch
import torch.nn.functional as F

q, k, v = torch.randn(1, 3, 4), torch.randn(1, 5, 4), torch.randn(1, 5, 4)
q, k, v = q[None], k[None], v[None]  # rank 4: the flash kernel
q[0, 0, 1, 0] = float("nan")
out = F.scaled_dot_product_attention(q, k, v)
assert (out[0, 0, 1] == 0).all()  # the spec: NaN
