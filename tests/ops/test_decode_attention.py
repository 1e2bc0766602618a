import pytest
import torch

import kernels.ops.decode_attention.kernel as decode_mod
from kernels import TileConfig, arrival, decode_attention, reference
from kernels.config import SECTOR, DeviceLimits, cdiv
from kernels.ops.decode_attention.kernel import decode_split, launch_plan, resolve_decode_config
from tests.ops.limits import BF16, H200
from tests.tolerances import DTYPES, assert_close, f64, float16_here, in_turn_here

CONFIGS = [
    None,
    TileConfig(block_n=16, split_k=1, num_warps=1),
    TileConfig(block_n=16, split_k=4),
    TileConfig(block_n=32, split_k=16, num_warps=2),
    TileConfig(block_n=128, split_k=2, num_warps=4),  # 4 warps: a 128-key tile too big to hold, the vector loop
]
SHAPES = [(130, [1, 17, 127]), (17, [17, 1]), (1000, [1000, 513]), (64, [64])]  # (max_len, lengths)


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
@pytest.mark.parametrize("max_len,lengths", SHAPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_decode_attention_unequal_lengths(device, dtype, max_len, lengths, cfg):
    float16_here(device, dtype, cfg is None)  # float16 in the default tiles at every shape, on CPU
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


# (batch, heads, T_max, lengths, head_dim, block_n): awkward sizes, empty sequences among them, with
# key tiles small enough that split_k up to 8 gives up to 8 splits (17 keys make at most 2).
ONE_LAUNCH_SHAPES = [
    (1, 1, 1, [1], 17, 16),
    (2, 3, 17, [0, 17], 64, 16),
    (3, 2, 127, [1, 16, 127], 17, 16),
    (3, 1, 1000, [0, 999, 1000], 64, 64),
    (1, 3, 1000, [16], 17, 64),
]


# A sequence of length 0 has no split with a finite max: the merge's exp2(m - max) is -inf - -inf = NaN in
# lanes its tl.where then drops, and the interpreter's numpy says so.
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_k", [1, 2, 4, 8])
@pytest.mark.parametrize("batch,heads,max_len,lengths,head_dim,block_n", ONE_LAUNCH_SHAPES, ids=str)
def test_one_launch_equals_two_launches_and_leaves_the_counters_at_zero(
    device, dtype, split_k, batch, heads, max_len, lengths, head_dim, block_n
):
    """The last split to arrive merges with the merge kernel's code on the same tile shapes: the same bits
    (in the interpreter; on a GPU the merge kernel's 4 warps and this kernel's num_warps may order the sums
    differently, see test_one_launch_replays_in_a_cuda_graph). Sequences of length 0 get zeros."""
    assert len(lengths) == batch
    # two of the four split counts per shape in the interpreter, in turn ({1, 4} or {2, 8}); all four on a GPU
    shape = ONE_LAUNCH_SHAPES.index((batch, heads, max_len, lengths, head_dim, block_n))
    in_turn_here(device, shape, [1, 2, 4, 8].index(split_k) % 2, 2)
    q, k, v, lens = _cache(device, dtype, batch, heads, max_len, head_dim, lengths)
    cfg = TileConfig(block_n=block_n, split_k=split_k, num_warps=4)  # the merge kernel's warps (see above)
    two = decode_attention(q, k, v, lens, config=cfg)
    one = decode_attention(q, k, v, lens, config=cfg, one_launch=True)
    assert torch.equal(arrival.counters(device, 1), torch.zeros_like(arrival.counters(device, 1)))
    assert torch.equal(one, two)
    assert_close("attention", one, _reference(q, k, v, lens), dtype)
    again = decode_attention(q, k, v, lens, config=cfg, one_launch=True)
    assert torch.equal(again, one)
    assert not arrival.counters(device, 1).any()


def test_one_launch_splits_as_asked():
    """The shapes above reach 8 splits (so most programs are not the last to arrive) and 1 (no atomics)."""
    splits = {
        decode_split(
            max_len, resolve_decode_config(TileConfig(block_n=n, split_k=s), 1, max_len, d, torch.float32, "cpu")
        )[1]
        for _, _, max_len, _, d, n in ONE_LAUNCH_SHAPES
        for s in (1, 8)
    }
    assert {1, 2, 8} <= splits


def test_one_launch_refuses_more_pairs_than_there_are_counters(device):
    batch = arrival.SLOTS + 1
    q = torch.zeros(batch, 1, 1, 1, device=device)
    k = torch.zeros(batch, 1, 32, 1, device=device)
    lens = torch.ones(batch, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"decode_attention: one_launch=True with 65537 \(sequence, head\) pairs"):
        decode_attention(q, k, k, lens, config=TileConfig(block_n=16, split_k=2), one_launch=True)
    with pytest.raises(ValueError, match="one_launch must be True or False, got 'yes'"):
        decode_attention(q[:1], k[:1], k[:1], lens[:1], one_launch="yes")


@pytest.mark.gpu
def test_one_launch_replays_in_a_cuda_graph(device):
    """Each replay leaves every counter at 0 for the next; the result is the same every replay and agrees
    with the two launches (bit for bit where both merge in 4 warps)."""
    q, k, v, lens = _cache(device, torch.float16, 2, 4, 4096, 64, [4096, 4096])
    cfg = TileConfig(split_k=64, num_warps=2)
    decode_attention(q, k, v, lens, config=cfg, one_launch=True)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, lens, config=cfg, one_launch=True)
    for lengths in ([5, 4000], [4096, 1], [0, 2000], [0, 2000]):
        lens.copy_(torch.tensor(lengths, device=device))
        graph.replay()
        torch.cuda.synchronize()
        assert not arrival.counters(device, 1).any()
        first = out.clone()
        graph.replay()
        assert torch.equal(out, first)
        assert_close("attention", out, _reference(q, k, v, lens), torch.float16)
        assert_close("attention", out, decode_attention(q, k, v, lens, config=cfg), torch.float16)
    four = TileConfig(split_k=64, num_warps=4)
    two_launches = decode_attention(q, k, v, lens, config=four)
    assert torch.equal(decode_attention(q, k, v, lens, config=four, one_launch=True), two_launches)


def _forms(batch_heads, max_len, head_dim, cfg, device="cpu"):
    """The loop form a launch takes (kernels.ops.decode_attention): 'held' (one key tile at once), 'vector', 'dot'."""
    plan = launch_plan(cfg, batch_heads, max_len, head_dim, torch.float16, device)
    return "held" if plan[5] else "dot" if plan[6] else "vector"


def test_the_cases_cover_every_loop_form():
    """The interpreter runs all three forms in the tests above: one key tile held, one tile in the vector loop,
    several tiles in the dot form."""
    seen = {_forms(3 * len(lengths), n, 64, cfg) for n, lengths in SHAPES for cfg in CONFIGS}
    assert seen == {"held", "vector", "dot"}


def test_default_tiles_take_the_dot_form_for_long_splits_on_an_h200():
    """At B=1 the splits of 1000 and 8192 keys are one tile each (held, vector); longer caches and larger
    batches give splits of several tiles, which loop in the dot form with about three programs per SM."""
    h200 = DeviceLimits("H100/H200", 232448, 132, (9, 0), True)
    assert _forms(12, 1001, 64, None, h200) == "held"
    assert _forms(12, 8192, 64, None, h200) == "vector"
    for batch, keys, splits in ((1, 32768, 32), (8, 8192, 4), (32, 2048, 1)):
        assert _forms(12 * batch, keys, 64, None, h200) == "dot"
        cfg = launch_plan(None, 12 * batch, keys, 64, torch.bfloat16, h200)[0]
        assert (cfg.block_n, cfg.num_warps, cfg.split_k) == (64, 4, splits)


# --- Requests between L2 and the SMs, against a walk over the kernel's program grid.


def test_decode_attention_counts_whole_sectors_for_scalar_partials():
    t = decode_mod.decode_traffic([8192], 12, 8192, 64, 2, dtype=BF16, device=H200)
    cfg = decode_mod.resolve_decode_config(None, 12, 8192, 64, BF16, H200)
    _, splits = decode_mod.decode_split(8192, cfg)
    # per program: a 64-float partial and two scalars, each scalar a whole sector; then the output
    assert t.bytes_written == 12 * splits * (64 * 4 + 2 * SECTOR) + 12 * 64 * 2
    assert t.hbm_written == 12 * splits * (64 + 2) * 4 + 12 * 64 * 2


def decode_walk(lengths, heads, max_len, head_dim, item, cfg, one_launch):
    """(bytes read, bytes written) between L2 and the SMs, walking the decode grid program by program:
    q, the length's sector and the chunk's keys and values; then the partial (one sector per scalar),
    or with one split and one launch the output; then the merge, by the merge kernel or by the last
    split to arrive, which also pays for its atomic and, once per pair, the counter's reset."""
    chunk = cdiv(cdiv(max_len, cfg.split_k), cfg.block_n) * cfg.block_n
    splits = cdiv(max_len, chunk)
    block_d = max(16, 1 << (head_dim - 1).bit_length())
    row = head_dim * item
    read = written = 0
    for n in lengths:
        for _h in range(heads):
            for split in range(splits):
                keys = max(0, min(split * chunk + chunk, n) - split * chunk)
                read += row + SECTOR + 2 * keys * row
                if one_launch and splits == 1:
                    written += row
                    continue
                written += block_d * 4 + 2 * SECTOR + (SECTOR if one_launch else 0)
            if splits > 1 or not one_launch:  # the merge: every split's vector, the maxes and sums in sectors
                read += splits * block_d * 4 + 2 * cdiv(splits * 4, SECTOR) * SECTOR
                written += row + (SECTOR if one_launch else 0)
    return read, written


@pytest.mark.parametrize("one_launch", [False, True])
@pytest.mark.parametrize(
    "lengths,max_len,head_dim,cfg",
    [
        ([8192], 8192, 64, None),
        ([0, 17, 999], 1000, 17, TileConfig(block_n=16, split_k=8)),
        ([5, 1], 64, 40, TileConfig(block_n=64, split_k=1)),
    ],
)
def test_decode_attention_l2_traffic_matches_a_walk_over_the_grid(lengths, max_len, head_dim, cfg, one_launch):
    heads = 3
    t = decode_mod.decode_traffic(
        lengths, heads, max_len, head_dim, 2, config=cfg, dtype=BF16, device=H200, one_launch=one_launch
    )
    resolved = decode_mod.resolve_decode_config(cfg, len(lengths) * heads, max_len, head_dim, BF16, H200)
    assert (t.bytes_read, t.bytes_written) == decode_walk(lengths, heads, max_len, head_dim, 2, resolved, one_launch)


def test_decode_attention_in_one_launch_adds_the_counters_and_nothing_else_at_hbm():
    two = decode_mod.decode_traffic([8192] * 4, 12, 8192, 64, 2, dtype=BF16, device=H200)
    one = decode_mod.decode_traffic([8192] * 4, 12, 8192, 64, 2, dtype=BF16, device=H200, one_launch=True)
    counters = cdiv(4 * 12 * 4, SECTOR) * SECTOR  # 48 int32 slots, read cold and written back
    assert (one.hbm_read, one.hbm_written) == (two.hbm_read + counters, two.hbm_written + counters)
    assert (one.flops, one.min_bytes, one.bytes_read) == (two.flops, two.min_bytes, two.bytes_read)
    single = TileConfig(block_n=128, split_k=1)  # nothing to merge: q, lengths and cache in, the output out
    alone = decode_mod.decode_traffic([100], 12, 8192, 64, 2, config=single, device=H200, one_launch=True)
    assert (alone.hbm_read, alone.hbm_written) == (12 * 64 * 2 + 8 + 2 * 100 * 12 * 64 * 2, 12 * 64 * 2)
