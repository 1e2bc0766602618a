"""The traffic models at both levels, against references that do not restate their formulas: the
SM-request level by walking each kernel's program grid in plain Python, the HBM level by the bounds
any cache must respect (never more than the loads issued, never less than each input once)."""

from dataclasses import replace

import pytest
import torch

import kernels.attn.decode as decode_mod
import kernels.attn.kernel as attention_mod
import kernels.elementwise.kernel as elementwise
import kernels.kv_cache.kernel as kv_write_mod
import kernels.matmul.kernel as linear_mod
import kernels.norm.kernel as layer_norm_mod
from kernels.config import SECTOR, DeviceLimits, TileConfig, Traffic, cdiv, device_limits

H200 = DeviceLimits("NVIDIA H200", 232448, 132, (9, 0), True, l2_bytes=50 * 1024 * 1024)
BF16 = torch.bfloat16


def test_traffic_without_hbm_fields_equals_its_l2_level_and_adds_up():
    t = Traffic(10, 20, 3, 30)  # how explorer/ builds the cache write and the embedding
    assert (t.hbm_read, t.hbm_written, t.hbm_bytes) == (10, 20, 30)
    total = t + Traffic(1, 2, 3, 4, 0, 2)
    assert total == Traffic(11, 22, 6, 34, 10, 22)


def test_device_limits_keep_their_positional_form_and_default_l2():
    limits = DeviceLimits("T4", 65536, 40, (7, 5), False)
    assert limits.l2_bytes == 50 * 1024 * 1024 == device_limits("cpu").l2_bytes


def linear_loads(rows, out, inp, item, cfg):
    """Bytes of x, weight and bias each program of the tiled kernel loads, walking its grid."""
    tiles_m, tiles_n = cdiv(rows, cfg.block_m), cdiv(out, cfg.block_n)
    total = 0
    for pid in range(tiles_m * tiles_n):
        group = cfg.group_m * tiles_n
        first_m = (pid // group) * cfg.group_m
        pid_m = first_m + (pid % group) % min(tiles_m - first_m, cfg.group_m)
        pid_n = (pid % group) // min(tiles_m - first_m, cfg.group_m)
        tile_rows = {(pid_m * cfg.block_m + i) % rows for i in range(cfg.block_m)}  # wrapped rows repeat
        tile_cols = {(pid_n * cfg.block_n + j) % out for j in range(cfg.block_n)}
        valid_cols = [c for c in range(pid_n * cfg.block_n, (pid_n + 1) * cfg.block_n) if c < out]
        total += (len(tile_rows) + len(tile_cols)) * inp * item + len(valid_cols) * item  # x, weight, bias
    return total


@pytest.mark.parametrize(
    "rows,out,inp,cfg",
    [
        (100, 300, 70, TileConfig(block_m=32, block_n=64, block_k=32, group_m=2)),
        (1024, 3072, 768, None),
        (20, 96, 64, TileConfig(block_m=64, block_n=32, block_k=32, group_m=8)),
    ],
)
def test_linear_l2_reads_match_a_walk_over_the_grid(rows, out, inp, cfg):
    t = linear_mod.traffic(rows, out, inp, 2, activation="gelu", config=cfg, dtype=BF16, device=H200)
    cfg = linear_mod.resolve_config(cfg, rows, out, inp, BF16, H200)
    assert t.bytes_read == linear_loads(rows, out, inp, 2, cfg)
    assert t.bytes_written == rows * out * 2


def test_linear_split_k_l2_reads_match_a_walk_over_the_grid():
    rows, out, inp, item = 3, 3072, 768, 2
    t = linear_mod.traffic(rows, out, inp, item, dtype=BF16, device=H200)
    cfg = linear_mod.resolve_config(None, rows, out, inp, BF16, H200)
    assert cfg.split_k > 1
    per_split = cdiv(cdiv(inp, cfg.split_k), cfg.block_k) * cfg.block_k
    loads = partials = 0
    for _pid_n in range(cdiv(out, cfg.block_n)):
        for lo in range(0, inp, per_split):
            width = min(lo + per_split, inp) - lo
            loads += (rows + cfg.block_n) * width * item  # x rows are masked, weight columns wrap
            partials += rows * cfg.block_n * 4
    loads += partials + out * item  # the reduce kernel: every partial, then the bias
    assert t.bytes_read == loads
    assert t.bytes_written == partials + rows * out * item


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


def models(device):
    """Every model at a small and a large shape, with the bytes of its inputs read once."""
    ln = 2 * 768 * 2
    out = []
    for rows in (64, 65536):
        out.append((layer_norm_mod.traffic(rows, 768, 2, residual=True, device=device), 2 * rows * 768 * 2 + ln))
        out.append((layer_norm_mod.traffic_unfused(rows, 768, 2, residual=True, device=device), 2 * rows * 768 * 2))
    for rows, n, k in ((1, 3072, 768), (1024, 3072, 768), (8192, 8192, 8192)):
        floor = (rows * k + n * k + n) * 2
        out.append((linear_mod.traffic(rows, n, k, 2, activation="gelu", dtype=BF16, device=device), floor))
        out.append((linear_mod.traffic_unfused(rows, n, k, 2, activation="gelu", device=device), floor))
    for b, t in ((1, 1024), (1, 65536)):
        qkv = 3 * b * 12 * t * 64 * 2
        out.append((attention_mod.traffic(b, 12, t, t, 64, 2, dtype=BF16, device=device), qkv))
        out.append((attention_mod.traffic_naive(b, 12, t, t, 64, 2, device=device), qkv))
        out.append((attention_mod.traffic_floor(b, 12, t, t, 64, 2), qkv))
    out.append((decode_mod.decode_traffic([8192] * 4, 12, 8192, 64, 2, dtype=BF16, device=device), 0))
    one = decode_mod.decode_traffic([8192] * 4, 12, 8192, 64, 2, dtype=BF16, device=device, one_launch=True)
    out.append((one, 0))
    out.append((kv_write_mod.traffic(64, 12, 64, 2), 2 * 64 * 12 * 64 * 2))
    for rows in (1, 4096):
        out.append((elementwise.traffic_add(rows * 768, 2), 2 * rows * 768 * 2))
        out.append((elementwise.traffic_gelu(rows * 3072, 2), rows * 3072 * 2))
        out.append((elementwise.traffic_bias_add(rows, 3072, 2, device=device), (rows + 1) * 3072 * 2))
    return out


@pytest.mark.parametrize("l2_mib", [1, 50, 1024])
def test_hbm_lies_between_each_input_once_and_the_loads_issued(l2_mib):
    device = replace(H200, l2_bytes=l2_mib * 1024 * 1024)
    for t, inputs_once in models(device):
        assert inputs_once <= t.hbm_read <= t.bytes_read, t
        assert t.hbm_written <= t.bytes_written, t


def test_hbm_is_the_floor_when_the_working_set_is_small():
    ln = layer_norm_mod.traffic(4096, 768, 2, residual=True, device=H200)
    assert ln.hbm_bytes == ln.min_bytes  # streaming rows: nothing to re-read
    lin = linear_mod.traffic(1024, 3072, 768, 2, activation="gelu", dtype=BF16, device=H200)
    assert lin.hbm_read + lin.hbm_written == lin.min_bytes < lin.bytes
    att = attention_mod.traffic(4, 12, 4096, 4096, 64, 2, dtype=BF16, device=H200)
    assert att.hbm_read + att.hbm_written == att.min_bytes  # ncu: 75.5 MB read, Q + K + V


def test_hbm_reads_never_grow_with_a_larger_l2_and_fall_for_large_working_sets():
    for make in (
        lambda d: linear_mod.traffic(8192, 8192, 8192, 2, dtype=BF16, device=d),
        lambda d: attention_mod.traffic(1, 12, 131072, 131072, 64, 2, dtype=BF16, device=d),
        lambda d: attention_mod.traffic_naive(1, 12, 4096, 4096, 64, 2, device=d),
        lambda d: linear_mod.traffic_unfused(16384, 3072, 768, 2, activation="gelu", device=d),
    ):
        reads = [make(replace(H200, l2_bytes=mib << 20)).hbm_read for mib in (1, 8, 50, 256, 4096)]
        assert reads == sorted(reads, reverse=True) and reads[0] > reads[-1], reads


def test_layer_norm_requests_weight_and_bias_in_every_program_and_reads_them_from_hbm_once():
    t = layer_norm_mod.traffic(4096, 768, 2, residual=True, device=H200)
    rows, wb = 2 * 4096 * 768 * 2, 2 * 768 * 2
    programs = -(-4096 // layer_norm_mod.resolve_config(None, 4096, 768, H200).block_m)
    assert t.bytes_read == rows + programs * wb  # ncu on an H200: 15.73 MB through L1
    assert abs(t.bytes_read / 15.73e6 - 1) < 0.15
    assert t.hbm_read == rows + wb


def test_kv_write_moves_whole_sectors_per_row():
    t = kv_write_mod.traffic(2, 3, 17, 2)  # a 34-byte row spans two sectors
    assert t.bytes_read == 6 * (2 * 64 + SECTOR) and t.bytes_written == 6 * 2 * 64
    assert t.hbm_written == 6 * 2 * 34 and t.min_bytes == 6 * 4 * 34
