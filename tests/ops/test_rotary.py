"""Rotary position embedding (the Llama family's positions) against PyTorch in float64 and transformers."""

import pytest
import torch

from kernels import reference, rotary
from kernels.ops.rotary import traffic
from tests.tolerances import DTYPES, assert_close, f64

# (batch, heads, tokens, head_dim): lengths 1, 17, 127, 1000; SmolLM2's head of 64, and 32, 128 and 40 (whose
# half, 20, is not a power of two).
SHAPES = [(1, 1, 1, 64), (2, 3, 17, 64), (1, 2, 127, 32), (1, 1, 1000, 64), (2, 1, 5, 128), (1, 2, 9, 40)]


def _positions(batch, tokens, device):
    """Each sequence at its own offset into the cache, as in a batch of unequal prompts."""
    return torch.arange(tokens, device=device)[None, :] + torch.randint(0, 50, (batch, 1), device=device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rotary_matches_reference(device, dtype, shape):
    batch, heads, tokens, head_dim = shape
    x = torch.randn(shape, device=device, dtype=dtype)
    positions = _positions(batch, tokens, device)
    y = rotary(x, positions, theta=100000.0)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_close("rotary", y, reference.rotary(*f64(x), positions.cpu(), theta=100000.0), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_reads_strided_rows_and_small_row_blocks(device, dtype):
    """q as the projection leaves it: (B, T, H, D) seen as (B, H, T, D); one row a program."""
    qkv = torch.randn(2, 17, 3, 64, device=device, dtype=dtype)
    q = qkv.transpose(1, 2)
    positions = _positions(2, 17, device)
    y = rotary(q, positions, block_m=1)
    assert_close("rotary", y, reference.rotary(*f64(q), positions.cpu()), dtype)


def test_rotary_is_llamas(device):
    """The same numbers as transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb (float32)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0)
    q, k = torch.randn(1, 9, 33, 64), torch.randn(1, 3, 33, 64)
    positions = torch.arange(33)[None, :] + 7
    cos, sin = LlamaRotaryEmbedding(cfg)(q, positions)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    assert_close("rotary", rotary(q.to(device), positions.to(device), 100000.0), q_hf, torch.float32)
    assert_close("rotary", rotary(k.to(device), positions.to(device), 100000.0), k_hf, torch.float32)


def test_rotary_says_what_is_wrong(device):
    x = torch.randn(1, 2, 3, 64, device=device)
    with pytest.raises(ValueError, match=r"rotary: x must be \(B, H, T, D\) with D even"):
        rotary(torch.randn(1, 2, 3, 63, device=device), torch.zeros(1, 3, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match=r"rotary: positions must be integers of shape \(B=1, T=3\)"):
        rotary(x, torch.zeros(1, 4, dtype=torch.long, device=device))
    with pytest.raises(ValueError, match="rotary: positions must be integers"):
        rotary(x, torch.zeros(1, 3, device=device))
    with pytest.raises(ValueError, match="rotary: theta=1.0 must be above 1"):
        rotary(x, torch.zeros(1, 3, dtype=torch.long, device=device), theta=1.0)


def test_rotary_moves_each_row_once():
    t = traffic(2, 9, 100, 64, 2)
    rows = 2 * 9 * 100 * 64 * 2
    assert t.bytes_written == t.hbm_written == rows
    assert t.hbm_read == rows + 2 * 100 * 8  # each sequence's positions reach the SMs from HBM once
    assert t.bytes_read == rows + 2 * 9 * 100 * 8  # and every head requests them
