"""Decode attention with grouped-query heads (a few key/value heads serve many query heads) against PyTorch
in float64 and against transformers' Llama attention maths."""

import pytest
import torch

from kernels import arrival, grouped_attention, grouped_decode_attention, kv_write, reference
from kernels.ops.grouped_decode_attention import kernel as grouped
from tests.tolerances import DTYPES, assert_close, f64

# (heads, kv_heads, head_dim, lengths, cache positions): SmolLM2's 9 over 3 heads of 64; groups of 1 (plain
# multi-head), 4 and 8; head dims 40 and 128; lengths 0, 1, 17, 127 and 1000, unequal within a batch.
CASES = [
    (9, 3, 64, [1, 17], 40),
    (9, 3, 64, [1000], 1000),
    (4, 4, 32, [127, 0, 5], 130),
    (8, 2, 40, [17, 64], 80),
    (8, 1, 128, [33], 40),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,lengths,t_max", CASES, ids=str)
@pytest.mark.parametrize("block_n,split_k", [(None, None), (16, None), (16, 4)], ids=str)
def test_grouped_decode_attention_matches_reference(
    device, dtype, heads, kv_heads, head_dim, lengths, t_max, block_n, split_k
):
    """With the device's default splits, with 16-key tiles, and with 4 splits merged by the last to arrive
    (splits of 1 to 63 keys, and empty ones past a short sequence's length)."""
    if block_n == 16 and max(lengths) >= 1000 and device.type == "cpu":
        pytest.skip("1000 keys in 16-key tiles are slow in the interpreter; the default tiles cover 1000 keys")
    batch = len(lengths)
    q = torch.randn(batch, heads, 1, head_dim, device=device, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, t_max, head_dim, device=device, dtype=dtype) for _ in range(2))
    n = torch.tensor(lengths, device=device, dtype=torch.int32)
    o = grouped_decode_attention(q, k, v, n, block_n=block_n, split_k=split_k)
    expected = reference.grouped_decode_attention(*f64(q, k, v), n.cpu())
    expected[n.cpu() == 0] = 0.0  # a sequence of length 0 attends to nothing (PyTorch's softmax of nothing: NaN)
    assert_close("attention", o, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 3], ids=str)
def test_a_max_that_grows_along_the_keys_rescales_what_came_before(device, dtype, split_k):
    """Scores that rise along the cache by many times 2^8 (so the loop rescales its output tile after tile),
    with a spike in the middle that later keys stay below (so the max stays stale for a while), over 16-key
    tiles in one split and in three, in one warp (the plan's loop from 8 pairs on)."""
    q = torch.randn(2, 9, 1, 64, device=device, dtype=dtype)
    ramp = torch.linspace(0.05, 4.0, 300, device=device)[:, None]
    k = torch.randn(2, 3, 300, 64, device=device) * ramp
    k[:, :, 150] = 8 * q.view(2, 3, 3, 64)[:, :, 0].float()  # the first head of each group: a spike
    k, v = k.to(dtype), torch.randn(2, 3, 300, 64, device=device, dtype=dtype)
    n = torch.tensor([300, 233], device=device)
    o = grouped_decode_attention(q, k, v, n, block_n=16, split_k=split_k, num_warps=1)
    assert_close("attention", o, reference.grouped_decode_attention(*f64(q, k, v), n.cpu()), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_batch_of_eight_over_long_caches(device, dtype):
    """Eight sequences of unequal lengths over 1100 positions, at the default plan: on a GPU a loop of 32-key
    tiles in one warp, whose last tile a length cuts in most splits, merged apart; on the CPU one split."""
    lengths = [1100, 17, 1, 640, 999, 1024, 300, 1093]
    q = torch.randn(8, 9, 1, 64, device=device, dtype=dtype)
    k, v = (torch.randn(8, 3, 1100, 64, device=device, dtype=dtype) for _ in range(2))
    n = torch.tensor(lengths, device=device, dtype=torch.int32)
    if device.type == "cuda":
        p = grouped.plan(24, 1100, device, group=3, head_dim=64)
        assert p.num_warps == 1 and p.chunk > p.block_n and p.apart
    o = grouped_decode_attention(q, k, v, n)
    assert_close("attention", o, reference.grouped_decode_attention(*f64(q, k, v), n.cpu()), dtype)


def test_split_keys_leave_the_arrival_counters_at_zero(device):
    """Two calls in a row over 8 splits merged by the last to arrive: the second finds its counters reset by
    the first's last arrivals."""
    q = torch.randn(2, 9, 1, 64, device=device)
    k, v = (torch.randn(2, 3, 128, 64, device=device) for _ in range(2))
    n = torch.tensor([128, 50], device=device)
    assert not grouped.plan(6, 128, device, block_n=16, split_k=8).apart
    for _ in range(2):
        o = grouped_decode_attention(q, k, v, n, block_n=16, split_k=8)
        assert_close("attention", o, reference.grouped_decode_attention(*f64(q, k, v), n.cpu()), torch.float32)
    assert not arrival.counters(torch.device(device), 6)[:6].any()


def test_the_most_splits_are_merged_by_a_second_launch(device):
    """128 splits of one 16-key tile each (the most; their keys requested before the length arrives), those
    past a short length empty, merged apart; a head of 40 dimensions merged in slices of 16. Twice in a row:
    the second merge reads only its own partials."""
    q = torch.randn(2, 8, 1, 40, device=device)
    n = torch.tensor([2048, 3], device=device)
    p = grouped.plan(4, 2048, device, block_n=16, split_k=1000)
    assert p.apart and p.splits == grouped.MAX_SPLITS and p.chunk == p.block_n
    for _ in range(2):
        k, v = (torch.randn(2, 2, 2048, 40, device=device) for _ in range(2))
        o = grouped_decode_attention(q, k, v, n, block_n=16, split_k=1000)
        assert_close("attention", o, reference.grouped_decode_attention(*f64(q, k, v), n.cpu()), torch.float32)


def test_under_pdl_the_newest_rows_come_from_the_kernel_just_before(device):
    """As in a decode step: the cache write launches, then attention under PDL in splits of one key tile, which
    load the older rows before they wait for the write and the newest row after it."""
    q = torch.randn(2, 9, 1, 64, device=device)
    k, v = (torch.randn(2, 3, 64, 64, device=device) for _ in range(2))
    n = torch.tensor([17, 64], device=device)
    for _ in range(2):  # the second time over rows the first call read as they were before the write
        k_new, v_new = (torch.randn(2, 3, 1, 64, device=device) for _ in range(2))
        kv_write(k_new, v_new, k, v, n - 1)
        o = grouped_decode_attention(q, k, v, n, block_n=16, split_k=4, pdl=True)
        assert_close("attention", o, reference.grouped_decode_attention(*f64(q, k, v), n.cpu()), torch.float32)


def test_grouped_decode_attention_reads_strided_queries(device):
    """q as the projection leaves it, (B, 1, H, D) seen as (B, H, 1, D)."""
    q = torch.randn(2, 1, 9, 64, device=device).transpose(1, 2)
    k, v = (torch.randn(2, 3, 20, 64, device=device) for _ in range(2))
    n = torch.tensor([20, 7], device=device)
    o = grouped_decode_attention(q, k, v, n)
    assert_close("attention", o, reference.grouped_decode_attention(*f64(q, k, v), n.cpu()), torch.float32)


def test_grouped_decode_attention_is_llamas(device):
    """transformers' own grouping (repeat_kv) and scaled dot product, in float32."""
    from transformers.models.llama.modeling_llama import repeat_kv

    q = torch.randn(1, 9, 1, 64)
    k, v = torch.randn(1, 3, 25, 64), torch.randn(1, 3, 25, 64)
    scores = (q @ repeat_kv(k, 3).transpose(2, 3)) / 8.0
    expected = torch.softmax(scores, dim=-1) @ repeat_kv(v, 3)
    n = torch.tensor([25], device=device)
    assert_close(
        "attention", grouped_decode_attention(q.to(device), k.to(device), v.to(device), n), expected, torch.float32
    )


def test_grouped_decode_attention_says_what_is_wrong(device):
    q = torch.randn(1, 9, 1, 64, device=device)
    k = torch.randn(1, 2, 8, 64, device=device)
    with pytest.raises(ValueError, match="H a multiple of H_kv"):
        grouped_decode_attention(q, k, k, torch.tensor([8], device=device))
    k = torch.randn(1, 3, 8, 64, device=device)
    with pytest.raises(ValueError, match="one new token per sequence"):
        grouped_decode_attention(torch.randn(1, 9, 2, 64, device=device), k, k, torch.tensor([8], device=device))
    with pytest.raises(ValueError, match="lengths must be an int32/int64 tensor"):
        grouped_decode_attention(q, k, k, torch.tensor([8.0], device=device))
    with pytest.raises(ValueError, match="must share a dtype"):
        grouped_decode_attention(q, k.half(), k.half(), torch.tensor([8], device=device))


def test_each_key_value_head_is_read_once_for_its_group():
    """SmolLM2's 9 query heads over 3 key/value heads read a third of the cache bytes that 9 heads would."""
    grouped_bytes = grouped.traffic([1000], 9, 3, 64, 2)
    full = grouped.traffic([1000], 9, 9, 64, 2)
    kv = 2 * 3 * 1000 * 64 * 2
    assert grouped_bytes.hbm_read - 2 * 9 * 64 * 2 // 2 - 32 == kv
    assert full.hbm_read - grouped_bytes.hbm_read == 2 * kv


def test_the_model_counts_the_rows_each_split_loads():
    """Over 1024 positions in 32-key tiles: splits of one tile request theirs whole, before the length arrives,
    whatever the length; splits of 256 keys load only their rows below it. The floor counts the rows attended."""
    model = lambda n, split_k: grouped.traffic([n], 9, 3, 64, 2, max_len=1024, block_n=32, split_k=split_k)
    kv_row = 2 * 3 * 64 * 2  # a position's key and value in the 3 key/value heads
    assert grouped.plan(3, 1024, "cpu", block_n=32, split_k=32).chunk == 32
    assert model(1, 32).hbm_read == model(300, 32).hbm_read == model(1024, 32).hbm_read
    assert model(300, 4).hbm_read - model(256, 4).hbm_read == 44 * kv_row
    assert model(1024, 4).hbm_read - model(1, 4).hbm_read == 1023 * kv_row
    assert model(300, 32).min_bytes - model(256, 32).min_bytes == 44 * kv_row


# Prefill: (batch, heads, kv_heads, tq, tk, head_dim): SmolLM2's 9 over 3; groups of 1, 2 and 8; queries 1, 17,
# 127; keys past the queries (a prompt after a cached prefix); head dims 40 and 128.
PREFILL = [(1, 9, 3, 17, 17, 64), (2, 4, 2, 1, 33, 32), (1, 8, 1, 127, 127, 40), (1, 3, 3, 17, 40, 128)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", PREFILL, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_grouped_attention_matches_reference(device, dtype, shape, causal):
    batch, heads, kv_heads, tq, tk, head_dim = shape
    q = torch.randn(batch, heads, tq, head_dim, device=device, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, tk, head_dim, device=device, dtype=dtype) for _ in range(2))
    o = grouped_attention(q, k, v, causal=causal)
    assert_close("attention", o, reference.grouped_attention(*f64(q, k, v), causal=causal), dtype)


def test_grouped_attention_over_1000_positions_in_small_tiles(device):
    q = torch.randn(1, 6, 1000, 32, device=device)
    k, v = (torch.randn(1, 2, 1000, 32, device=device) for _ in range(2))
    # 64 rows a tile, 21 positions of the group's 3 heads: 48 query tiles per key/value head over 16 key tiles
    o = grouped_attention(q, k, v, block_m=64, block_n=64)
    assert_close("attention", o, reference.grouped_attention(*f64(q, k, v)), torch.float32)


def test_grouped_attention_says_what_is_wrong(device):
    q = torch.randn(1, 9, 4, 64, device=device)
    with pytest.raises(ValueError, match="H a multiple of H_kv"):
        grouped_attention(q, torch.randn(1, 2, 4, 64, device=device), torch.randn(1, 2, 4, 64, device=device))
    with pytest.raises(ValueError, match=r"keys \(3\) must be at least as many as queries \(4\)"):
        grouped_attention(q, torch.randn(1, 3, 3, 64, device=device), torch.randn(1, 3, 3, 64, device=device))
