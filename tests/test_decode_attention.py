import pytest
import torch

from kernels import TileConfig, decode_attention, reference
from tests.tolerances import DTYPES, assert_close, f64

CONFIGS = [
    None,
    TileConfig(block_n=16, split_k=1, num_warps=1),
    TileConfig(block_n=16, split_k=4),
    TileConfig(block_n=32, split_k=16, num_warps=2),
    TileConfig(block_n=128, split_k=2),
]


def _cache(device, dtype, batch, heads, max_len, head_dim, lengths):
    q = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, heads, max_len, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, heads, max_len, head_dim, device=device, dtype=dtype)
    # Positions past each length hold NaN: a kernel that reads them poisons its output.
    for b, n in enumerate(lengths):
        k[b, :, n:] = float("nan")
        v[b, :, n:] = float("nan")
    return q, k, v, torch.tensor(lengths, device=device, dtype=torch.int32)


def _reference(q, k, v, lengths):
    """Each sequence on its own, over exactly its keys."""
    q, k, v = f64(q, k, v)
    return torch.cat(
        [
            reference.attention(q[b : b + 1], k[b : b + 1, :, :n], v[b : b + 1, :, :n], causal=False)
            for b, n in enumerate(lengths.tolist())
        ]
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("max_len,lengths", [(130, [1, 17, 127]), (17, [17, 1]), (1000, [1000, 513]), (64, [64])])
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_decode_attention_unequal_lengths(device, dtype, max_len, lengths, cfg):
    q, k, v, lens = _cache(device, dtype, len(lengths), 3, max_len, 64, lengths)
    o = decode_attention(q, k, v, lens, config=cfg)
    assert o.shape == q.shape
    assert_close("attention", o, _reference(q, k, v, lens), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_attention_int64_lengths_and_head_dim_40(device, dtype):
    q, k, v, lens = _cache(device, dtype, 2, 2, 50, 40, [7, 50])
    o = decode_attention(q, k, v, lens.long(), config=TileConfig(block_n=16, split_k=4))
    assert_close("attention", o, _reference(q, k, v, lens), dtype)


def test_torch_twin_masks_the_same_keys(device):
    """The torch backend's masked decode (no host sync) agrees with per-sequence attention."""
    q, k, v, lens = _cache(device, torch.float32, 3, 2, 40, 16, [3, 40, 20])
    k, v = torch.nan_to_num(k), torch.nan_to_num(v)  # masked SDPA multiplies NaN by zero weights
    assert_close("attention", reference.decode_attention(q, k, v, lens), _reference(q, k, v, lens), torch.float32)


def test_decode_attention_rejects_two_queries(device):
    q = torch.randn(1, 2, 2, 16, device=device)
    k = torch.randn(1, 2, 8, 16, device=device)
    with pytest.raises(ValueError, match="one new token per sequence"):
        decode_attention(q, k, k, torch.tensor([8], device=device))


@pytest.mark.gpu
def test_decode_attention_replays_in_a_cuda_graph(device):
    """The grid depends on the cache size only: one captured graph serves any lengths."""
    q, k, v, lens = _cache(device, torch.float16, 2, 4, 256, 64, [256, 256])
    decode_attention(q, k, v, lens)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, lens)
    for lengths in ([5, 200], [256, 1], [77, 130]):
        lens.copy_(torch.tensor(lengths, device=device))
        graph.replay()
        torch.cuda.synchronize()
        assert_close("attention", out, _reference(q, k, v, lens), torch.float16)
