import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
x, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
_, w = mha(x, kv, kv)
_, per_head = mha(x, kv, kv, average_attn_weights=False)
assert w.shape == (2, 3, 5) and torch.allclose(w, per_head.mean(dim=1))  # the spec: (2, 2, 3, 5)
