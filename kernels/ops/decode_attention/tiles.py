"""Decode attention's tiles, plan and traffic model (kernel.py beside it runs the kernels): which key tiles
and how many splits a cache gets, what each launch passes, and the bytes one call moves.
"""

import contextlib
import functools
import math

import torch

from ...config import (
    BOUNDS,
    SECTOR,
    TileConfig,
    Traffic,
    as_config,
    cdiv,
    check_fields,
    check_shared_memory,
    device_limits,
    fit_defaults,
    l2_miss,
    next_pow2,
    overlaps_launches,
    pipeline_stages,
    prev_pow2,
    sectors,
)
from ..attention.kernel import LOG2E


def decode_shared_memory(cfg: TileConfig, head_dim: int, itemsize: int) -> int:
    """The K and V tiles the pipeliner keeps in flight (num_stages - 1 of each), and the dot form's 16-row tile
    of probabilities, which passes through shared memory on its way to the product with V (counted for either
    form: a few KB)."""
    stages = 2 * max(1, cfg.num_stages - 1) * cfg.block_n * max(16, next_pow2(head_dim)) * itemsize
    return stages + 16 * cfg.block_n * itemsize


def default_decode_config(batch_heads: int, max_len: int, device) -> TileConfig:
    limits = device_limits(device)
    if limits.is_cpu:
        # One program per (sequence, head) and the longest key tiles the shared memory allows (resolve_decode_config
        # shrinks block_n to fit: 128 keys of 64 dims in fp32, 256 in fp16): the interpreter's cost is per program
        # and per loop step, not per element. 16 warps only so that a split of one such tile is held whole
        # (launch_plan's PREFETCH), which the interpreter runs in fewer operations than the loop.
        return TileConfig(block_n=BOUNDS["decode_attention"]["block_n"][1], split_k=1, num_warps=16, num_stages=1)
    # About four programs per SM in all, but no chunk shorter than one key tile; 128-key tiles in 2
    # warps were the fastest of 48 configs at B=1, H=12, 8192 keys on an H200 (benchmarks/RESULTS.md).
    # Shorter caches take 64-key tiles in 4 warps, and caches too short for those 32-key tiles in 2 warps
    # (at B=1 and 1001 keys, 32 splits of one 32-key tile: the fastest in a sweep of the whole decode step).
    wanted = cdiv(4 * limits.num_sms, batch_heads)
    if cdiv(max_len, 128) >= wanted:
        block_n, warps = 128, 2
    elif cdiv(max_len, 64) >= wanted:
        block_n, warps = 64, 4
    else:
        block_n, warps = 32, 2
    split_k = next_pow2(max(1, min(wanted, cdiv(max_len, block_n), 256)))
    if loops_in_dot_form(max_len, TileConfig(block_n=block_n, split_k=split_k)):
        # Splits of several key tiles loop in the dot form, which the compiler pipelines: 64-key
        # tiles in 4 warps, about three programs per SM. On an H200 that ran 1.17-1.23x the vector loop at B=1 and
        # 32768 keys, B=8 and 8192, B=32 and 2048 (benchmarks/RESULTS.md).
        split_k = prev_pow2(max(1, min(3 * limits.num_sms // batch_heads, 256)))
        block_n, warps = 64, 4
    return TileConfig(block_n=block_n, split_k=split_k, num_warps=warps, num_stages=pipeline_stages(device))


_rule = default_decode_config  # the rule resolve_decode_config applies (ruled_by swaps it within a block)


@contextlib.contextmanager
def ruled_by(rule):
    """Within the block, decode attention's default tiles come from rule(batch_heads, max_len, device) in place
    of default_decode_config: for comparing tile rules (overlap_sweep, experiments/README.md)."""
    global _rule
    saved, _rule = _rule, rule
    resolve_decode_config.cache_clear()
    launch_plan.cache_clear()
    try:
        yield
    finally:
        _rule = saved
        resolve_decode_config.cache_clear()
        launch_plan.cache_clear()


@functools.lru_cache(maxsize=1024)  # called on every launch: resolve each shape once
def resolve_decode_config(config, batch_heads, max_len, head_dim, dtype, device) -> TileConfig:
    user = as_config("decode_attention", config)
    check_fields("decode_attention", user)
    itemsize = torch.empty((), dtype=dtype).element_size()
    cfg = user.merged(_rule(batch_heads, max_len, device))
    cfg = fit_defaults("decode_attention", cfg, user, lambda c: decode_shared_memory(c, head_dim, itemsize), device)
    need = decode_shared_memory(cfg, head_dim, itemsize)
    what = f"{max(1, cfg.num_stages - 1)} in-flight stages of {cfg.block_n}-key K and V tiles"
    check_shared_memory("decode_attention", cfg, need, device, what)
    return cfg


def decode_split(max_len: int, cfg: TileConfig) -> tuple[int, int]:
    """(keys per split, number of splits) for a cache of max_len positions: chunks are whole key tiles."""
    chunk = cdiv(cdiv(max_len, cfg.split_k), cfg.block_n) * cfg.block_n
    return chunk, cdiv(max_len, chunk)


def loops_in_dot_form(max_len: int, cfg: TileConfig) -> bool:
    """Whether a split spans several key tiles, which loop in the dot form (kernel.py's _chunk_dot
    with DOT); a split of one tile is scored on the vector units, or held whole."""
    return decode_split(max_len, cfg)[0] > cfg.block_n


PREFETCH_ELEMENTS_PER_WARP = 1024  # of K's tile (and as many of V's): 32 per thread


@functools.lru_cache(maxsize=1024)  # called on every launch: plan each shape once
def launch_plan(config, batch_heads, max_len, head_dim, dtype, device) -> tuple:
    """(tiles, keys per split, splits, BLOCK_D, BLOCK_S, PREFETCH, DOT, the scores' scale in log2 units, whether
    launches may overlap on this device)."""
    cfg = resolve_decode_config(config, batch_heads, max_len, head_dim, dtype, device)
    chunk, splits = decode_split(max_len, cfg)
    block_d = max(16, next_pow2(head_dim))
    # A chunk of one key tile small enough to hold K and V in registers is requested at once (around the PDL
    # wait); larger tiles keep the loop, which loads V after the scores (at B=1, 8192 keys in 128-key tiles
    # in 2 warps, holding both ran 0.69x of PyTorch's time where the loop ran 0.93x, on an H200).
    prefetch = chunk <= cfg.block_n and cfg.block_n * block_d <= PREFETCH_ELEMENTS_PER_WARP * cfg.num_warps
    dot = loops_in_dot_form(max_len, cfg)
    scale = LOG2E / math.sqrt(head_dim)
    return cfg, chunk, splits, block_d, max(2, next_pow2(splits)), prefetch, dot, scale, overlaps_launches(device)


def decode_traffic(
    lengths, heads, max_len, head_dim, itemsize, *, config=None, dtype=torch.float16, device="cpu", one_launch=False
):
    """Modeled traffic of one decode_attention call: each sequence's cache read up to its length
    (never the whole allocation), plus the fp32 partials the merge reads back.

    SM requests: every split program loads q and its sequence's length (one sector) and stores its
    partial output and its max and sum, one sector each: L2 moves whole 32-byte sectors, which is why
    the H200 counted 0.25 MB written at B=1 H=12 N=8192 where 4-byte stores would make 0.20.
    HBM: q, the lengths and the cache once; the partials are written (and reach HBM eventually, the
    scalars packed into whole lines) and read back by the merge from L2 while they fit.

    one_launch: no merge kernel; the last split of each (sequence, head) to arrive reads the same
    partials. Each program's atomic on its counter and each last arriver's reset of it move one sector
    each, counted with the writes (ncu files atomics under op_atom, neither its reads nor its writes);
    at HBM the counters are read once and written back, in whole sectors. With one split there are no
    partials and no counters: each program writes its output directly."""
    batch = len(lengths)
    cfg = resolve_decode_config(config, batch * heads, max_len, head_dim, dtype, device)
    _, splits = decode_split(max_len, cfg)
    pairs = batch * heads
    programs = pairs * splits
    block_d = max(16, next_pow2(head_dim))
    q_row = head_dim * itemsize
    kv = 2 * sum(lengths) * heads * q_row
    o_bytes = pairs * q_row
    flops = 4 * heads * head_dim * sum(lengths)
    reads = programs * (q_row + SECTOR) + kv
    hbm = o_bytes + batch * 8 + kv  # q, lengths (int64 at most), the cache
    if one_launch and splits == 1:
        return Traffic(reads, o_bytes, flops, kv + 2 * o_bytes, hbm, o_bytes)
    partials = programs * (block_d + 2) * 4  # the output vectors, then the maxes and sums
    reads += programs * block_d * 4 + 2 * pairs * sectors(splits * 4)  # the merge reads every partial back
    writes = programs * (block_d * 4 + 2 * SECTOR) + o_bytes
    hbm += round(partials * l2_miss(partials, device))
    if not one_launch:
        return Traffic(reads, writes, flops, kv + 2 * o_bytes, hbm, partials + o_bytes)
    counters = sectors(pairs * 4)
    writes += (programs + pairs) * SECTOR  # an atomic per program, a reset per (sequence, head)
    return Traffic(reads, writes, flops, kv + 2 * o_bytes, hbm + counters, partials + o_bytes + counters)
