import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
x, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
allowed = torch.tensor([True, True, False, True, False]).expand(3, 5)  # True = may attend
out, _ = mha(x, kv, kv, attn_mask=allowed, need_weights=False)
hidden_keys_only, _ = mha(x, kv[:, [2, 4]], kv[:, [2, 4]], need_weights=False)
assert torch.allclose(out, hidden_keys_only, atol=1e-6)  # the spec: attend to keys 0, 1 and 3
