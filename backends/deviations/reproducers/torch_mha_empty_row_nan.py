import torch

torch.manual_seed(0)
mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
x, kv = torch.randn(2, 3, 8), torch.randn(2, 5, 8)
padding = torch.tensor([[True] * 5, [False] * 5])  # batch 0: every key is padding
out, w = mha(x, kv, kv, key_padding_mask=padding)  # need_weights=True by default
assert out[0].isnan().all() and w[0].isnan().all()  # the spec: out_proj.bias, weights 0
out, _ = mha(x, kv, kv, key_padding_mask=padding, need_weights=False)
assert torch.allclose(out[0], mha.out_proj.bias.expand(3, 8))  # its SDPA path agrees with the spec
