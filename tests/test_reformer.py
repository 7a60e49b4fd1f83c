"""attnspec.spec.reformer against the real libraries: Hugging Face's LSHSelfAttention and
reformer-pytorch's LSHAttention, run in float64; expected values are always the library's output.

Tolerance: 1e-9 absolute (the bound issue #17 sets). Both sides compute in float64 from the same
inputs and rotations, so they differ by summation order only: over at most nh * W <= 4 * 64 terms
of magnitude O(10), a few hundred ulp of 1, ~1e-13; measured worst ~1e-11. A bucket that differs
(a hash margin below float64 rounding) would show as an O(1) error, not a small one.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attnspec import SpecError
from attnspec.spec import lsh_attention
from attnspec.spec.reformer import hf_lsh_self_attention, lucidrains_lsh_attention

torch = pytest.importorskip("torch", reason="the Reformer interop tests need torch")
modeling = pytest.importorskip(
    "transformers.models.reformer.modeling_reformer",
    reason="needs transformers (pip install attnspec[reformer])",
)
reformer_pytorch = pytest.importorskip(
    "reformer_pytorch", reason="needs reformer-pytorch (pip install attnspec[reformer])"
)
from transformers import ReformerConfig  # noqa: E402

ATOL = 1e-9


def hf_layer(nh=2, nb=4, chunk=8, before=1, after=0, decoder=False, heads=2, hd=6, seed=0, **extra):
    cfg = ReformerConfig(
        hidden_size=heads * hd,
        num_attention_heads=heads,
        attention_head_size=hd,
        num_hashes=nh,
        num_buckets=nb,
        lsh_attn_chunk_length=chunk,
        lsh_num_chunks_before=before,
        lsh_num_chunks_after=after,
        hash_seed=seed + 17,
        is_decoder=decoder,
        lsh_attention_probs_dropout_prob=0.0,
        **extra,
    )
    torch.manual_seed(seed)
    return modeling.LSHSelfAttention(cfg, layer_idx=0).double().eval()


def padding(B, L, seed):
    """A (B, L) 0/1 mask: a padded tail on one row, a hole in the middle of another."""
    mask = torch.ones(B, L, dtype=torch.long)
    rng = np.random.default_rng(seed)
    mask[B - 1, L - int(rng.integers(1, L // 2)) :] = 0
    mask[0, int(rng.integers(0, L))] = 0
    return mask


def run_hf(layer, h, mask):
    with torch.no_grad():
        expected = layer(h, attention_mask=mask).hidden_states.numpy()
    got = hf_lsh_self_attention(layer, h, mask)
    assert got.shape == expected.shape, f"out.shape={got.shape}, but should be {expected.shape}"
    assert got.dtype == np.float64
    err = float(np.abs(got - expected).max())
    assert err <= ATOL, f"max |attnspec - HF| = {err:.3e} > {ATOL}"
    return err


HF_CASES = [  # (n_hashes, n_buckets, chunks before, chunks after, decoder, padded)
    (nh, nb, before, after, dec, pad)
    for nh, nb, (before, after), dec, pad in itertools.product(
        (1, 2, 3, 4), (2, 4, 8), ((1, 0), (0, 1), (2, 1), (0, 0)), (False, True), (False, True)
    )
    if (nh + nb + before + after + dec + pad) % 3 == 0 or (nh, before, after) in ((4, 2, 1), (1, 0, 0))
]


@pytest.mark.parametrize("nh,nb,before,after,decoder,padded", HF_CASES)
def test_hf_matches(nh, nb, before, after, decoder, padded):
    layer = hf_layer(nh, nb, 8, before, after, decoder, seed=nh * 31 + nb)
    h = torch.randn(
        2, 32, layer.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(nb)
    )
    run_hf(layer, h, padding(2, 32, nh) if padded else None)


@pytest.mark.parametrize("decoder,padded", [(False, False), (True, True), (False, True)])
def test_hf_short_sequence_is_full_attention(decoder, padded):
    """L <= chunk_length: HF skips hashing and attends over all positions (self and mask rules kept)."""
    layer = hf_layer(2, 4, 16, decoder=decoder)
    h = torch.randn(3, 16, layer.hidden_size, dtype=torch.float64)
    run_hf(layer, h, padding(3, 16, 5) if padded else None)


def test_hf_factorized_and_automatic_buckets():
    """num_buckets as a list (factorized hash) and None (set from L by the layer's forward)."""
    h = torch.randn(2, 64, 12, dtype=torch.float64)
    run_hf(hf_layer(2, [2, 4], 8, seed=3), h, None)
    layer = hf_layer(3, None, 4, seed=4, max_position_embeddings=64)  # 2 * 64 / 4 = 32 > limit: [4, 8]
    run_hf(layer, h, padding(2, 64, 1))
    assert layer.num_buckets == [4, 8]  # the layer's own forward (run last) chose the factorized form


def test_hf_multiple_heads_and_batch():
    layer = hf_layer(2, 8, 8, 1, 1, True, heads=4, hd=8, seed=9)
    h = torch.randn(3, 64, layer.hidden_size, dtype=torch.float64)
    run_hf(layer, h, padding(3, 64, 2))


LR_CASES = [
    (nh, C, causal, masked)
    for nh, C, causal, masked in itertools.product((1, 2, 3, 4), (2, 4, 8), (False, True), (False, True))
]


@pytest.mark.parametrize("nh,C,causal,masked", LR_CASES)
def test_lucidrains_matches(nh, C, causal, masked):
    """n_buckets = L / bucket_size: L = 32 gives 4, 8 and 16 buckets; L = 16 with C = 8 gives 2."""
    L = 16 if C == 8 and nh % 2 else 32
    module = reformer_pytorch.LSHAttention(bucket_size=C, n_hashes=nh, causal=causal)
    gen = torch.Generator().manual_seed(nh * 10 + C)
    qk = torch.randn(2, L, 6, dtype=torch.float64, generator=gen)
    v = torch.randn(2, L, 6, dtype=torch.float64, generator=gen)
    mask = None
    if masked:  # shorter than L (the module pads it with True), a hole and a padded tail
        mask = torch.ones(2, L - 3, dtype=torch.bool)
        mask[1, L // 2 :] = False
        mask[0, 2] = False
    seed = 1000 + nh
    torch.manual_seed(seed)
    with torch.no_grad():
        expected = module(qk, v, input_mask=mask)[0].numpy()
    got = lucidrains_lsh_attention(module, qk, v, seed, mask)
    err = float(np.abs(got - expected).max())
    assert err <= ATOL, f"max |attnspec - reformer-pytorch| = {err:.3e} > {ATOL}"
    if not masked:  # without a mask the library *is* the spec's lsh_attention
        rot = torch.randn(
            (1, 6, nh, L // C // 2), generator=torch.Generator().manual_seed(seed), dtype=torch.float64
        )[0].numpy()
        spec = lsh_attention(
            qk.numpy(), v.numpy(), rotations=rot, chunk_length=C, causal=causal, scale=6**-0.5
        )
        err = float(np.abs(spec - expected).max())
        assert err <= ATOL, f"max |lsh_attention - reformer-pytorch| = {err:.3e} > {ATOL}"


def test_leaves_torch_random_state_alone():
    module = reformer_pytorch.LSHAttention(bucket_size=4, n_hashes=2)
    qk = torch.randn(1, 16, 4, dtype=torch.float64)
    layer, h = hf_layer(), torch.randn(1, 32, 12, dtype=torch.float64)
    state = torch.get_rng_state()
    lucidrains_lsh_attention(module, qk, qk, 5)
    hf_lsh_self_attention(layer, h)
    assert torch.equal(state, torch.get_rng_state())


def test_unsupported_settings_raise():
    qk = torch.randn(1, 16, 4, dtype=torch.float64)
    for kwargs, match in (
        ({"allow_duplicate_attention": False}, "allow_duplicate_attention"),
        ({"attend_across_buckets": False}, "attend_across_buckets"),
        ({"dropout": 0.1}, "dropout"),
    ):
        module = reformer_pytorch.LSHAttention(bucket_size=4, n_hashes=2, **kwargs)
        with pytest.raises(SpecError, match=match):
            lucidrains_lsh_attention(module, qk, qk, 0)
    with pytest.raises(SpecError, match="divisible by 2 \\* bucket_size"):
        lucidrains_lsh_attention(
            reformer_pytorch.LSHAttention(bucket_size=4, n_hashes=2), qk[:, :12], qk[:, :12], 0
        )
    layer = hf_layer()
    layer.hash_seed = None
    with pytest.raises(SpecError, match="hash_seed"):
        hf_lsh_self_attention(layer, torch.randn(1, 32, 12, dtype=torch.float64))
