import pytest
import torch

import kernels.ops.attention.kernel as attention_mod
from kernels import TileConfig, attention, reference
from kernels.config import cdiv
from tests.ops.limits import BF16, H200
from tests.tolerances import DTYPES, assert_close, f64, float16_here

# (Tq, Tk): single token, awkward lengths, a long one, and queries over a cache that holds a prefix.
LENGTHS = [(1, 1), (17, 17), (127, 127), (1000, 1000), (17, 40), (1, 127), (100, 1000)]
CONFIGS = [
    None,
    TileConfig(block_m=16, block_n=16, num_warps=1, num_stages=1),
    TileConfig(block_m=32, block_n=64),
    TileConfig(block_m=64, block_n=16, num_warps=2),
]


def _qkv(device, dtype, batch, heads, tq, tk, head_dim):
    q = torch.randn(batch, heads, tq, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, heads, tk, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, heads, tk, head_dim, device=device, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tq,tk", LENGTHS)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_causal_attention_matches_reference(device, dtype, tq, tk, cfg):
    if tk == 1000 and cfg is not None and cfg.block_m == 16 and device.type == "cpu":
        pytest.skip("1000 keys in 16x16 tiles are slow in the interpreter; smaller lengths cover those tiles")
    float16_here(device, dtype, cfg is None)  # float16 in the default tiles at every length, on CPU
    batch, heads = (1, 2) if tk == 1000 else (2, 3)
    q, k, v = _qkv(device, dtype, batch, heads, tq, tk, 64)
    o = attention(q, k, v, causal=True, config=cfg)
    assert_close("attention", o, reference.attention(*f64(q, k, v), causal=True), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tq,tk", [(1, 1), (17, 17), (17, 40), (127, 127)])
@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=str)
def test_attention_without_mask(device, dtype, tq, tk, cfg):
    q, k, v = _qkv(device, dtype, 2, 3, tq, tk, 64)
    o = attention(q, k, v, causal=False, config=cfg)
    assert_close("attention", o, reference.attention(*f64(q, k, v), causal=False), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 40, 128])
def test_attention_head_dims(device, dtype, head_dim):
    q, k, v = _qkv(device, dtype, 1, 2, 33, 50, head_dim)
    o = attention(q, k, v, config=TileConfig(block_m=16, block_n=32))
    assert_close("attention", o, reference.attention(*f64(q, k, v)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_over_cache_views(device, dtype):
    """Prefill writes into a preallocated cache and attends over a slice of it: strided K and V."""
    cache_k = torch.randn(2, 3, 64, 32, device=device, dtype=dtype)
    cache_v = torch.randn(2, 3, 64, 32, device=device, dtype=dtype)
    q = torch.randn(2, 17, 3, 32, device=device, dtype=dtype).transpose(1, 2)  # (B, H, T, D) view of (B, T, H, D)
    k, v = cache_k[:, :, :29], cache_v[:, :, :29]
    o = attention(q, k, v, config=TileConfig(block_m=16, block_n=16))
    assert_close("attention", o, reference.attention(*f64(q, k, v)), dtype)


def test_attention_rejects_fewer_keys_than_queries(device):
    q, k, v = _qkv(device, torch.float32, 1, 1, 8, 4, 16)
    with pytest.raises(ValueError, match=r"keys \(4\) must be at least as many as queries \(8\)"):
        attention(q, k, v)


# --- Requests between L2 and the SMs, against a walk over the kernel's program grid.


def attention_keys(tq, tk, bm, bn, causal):
    """Keys each query tile of the flash kernel loads, following its two loops and the load mask."""
    offset, keys = tk - tq, 0
    for start_m in range(cdiv(tq, bm)):
        if causal:
            full_hi = (offset + start_m * bm + 1) // bn * bn
            hi = min(offset + (start_m + 1) * bm, tk)
        else:
            full_hi, hi = tk // bn * bn, tk
        for lo_, hi_ in ((0, full_hi), (full_hi, hi)):
            for start_n in range(lo_, hi_, bn):
                keys += sum(1 for c in range(start_n, start_n + bn) if c < tk)
    return keys


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk,bm,bn", [(100, 300, 32, 64), (1024, 1024, 64, 64), (77, 77, 128, 32)])
def test_attention_l2_reads_match_the_kernels_loops(tq, tk, bm, bn, causal):
    b, h, d, item = 2, 3, 64, 2
    cfg = TileConfig(block_m=bm, block_n=bn)
    t = attention_mod.traffic(b, h, tq, tk, d, item, causal=causal, config=cfg, dtype=BF16, device=H200)
    q = b * h * tq * d * item
    assert t.bytes_read == q + 2 * b * h * d * item * attention_keys(tq, tk, bm, bn, causal)
    assert t.bytes_written == q
