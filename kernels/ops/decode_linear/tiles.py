"""decode_linear's tiles: the rules that choose them, their validation, and the traffic a launch at them moves.

Two forms of the kernel take the same TileConfig (kernels.ops.decode_linear.kernel): block_k from PREFETCH_BLOCK_K up
chooses the prefetch form, which holds each split's whole K slice in registers; below it, the K loop, whose
tiles go through shared memory as linear's do.
"""

import contextlib
import functools

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
    prev_pow2,
    sectors,
)
from ..linear.kernel import operand_bytes, shared_memory

NAME = "decode_linear"


def default_config(rows: int, out_features: int, in_features: int, dtype: torch.dtype, device) -> TileConfig:
    """GPU: the prefetch form, so that under PDL each program's whole weight slice is in flight before it
    waits for the kernel ahead. 8-column tiles in 8 warps, K unsplit up to PREFETCH_SLICE columns: no
    arrival, and programs enough (96 for a 768-wide output). An output as wide as the LM head's takes the
    K loop in 128-wide tiles, no split. Both from H200 sweeps of the whole decode step (benchmarks/RESULTS.md).
    CPU: cpu_config."""
    limits = device_limits(device)
    if limits.is_cpu:
        return cpu_config(rows, out_features, in_features)
    if cdiv(out_features, 128) >= 2 * limits.num_sms:
        return TileConfig(block_m=16, block_n=128, block_k=64, split_k=1, num_warps=4, num_stages=3)
    split_k = next_pow2(cdiv(in_features, PREFETCH_SLICE))
    block_k = max(PREFETCH_BLOCK_K, next_pow2(cdiv(in_features, split_k)))
    return TileConfig(block_m=16, block_n=8, block_k=block_k, split_k=split_k, num_warps=8, num_stages=1)


PREFETCH_SLICE = 3072  # the longest K slice the default prefetch form holds in registers (8 x 3072 elements)

CPU_BLOCK_N = 256  # the K loop's widest column tile on CPU (its tiles go through the modeled shared memory)


def cpu_config(rows: int, out_features: int, in_features: int) -> TileConfig:
    """The interpreter runs a grid's programs one after another, and its cost is per program and per operation
    (each a few hundred Python calls, whatever the tile's size), so the fewest programs, one split. A single row
    takes the prefetch form, whose values the interpreter keeps in numpy arrays, not registers: the whole output
    in one program where CPU_PREFETCH_ELEMENTS hold it (an LM head of 4096 columns from 16 programs to one,
    about 5x faster), one weight load and a vector product. More rows take the K loop in 256-wide tiles,
    block_k as large as the shared memory allows (resolve_config shrinks it: 64 in fp32, 128 in fp16)."""
    if rows == 1 and next_pow2(in_features) <= BOUNDS[NAME]["block_k"][1]:
        held = sum(slice_tiles(in_features))
        block_n = min(next_pow2(out_features), BOUNDS[NAME]["block_n"][1], prev_pow2(CPU_PREFETCH_ELEMENTS // held))
        block_k = max(PREFETCH_BLOCK_K, next_pow2(in_features))
        return TileConfig(block_m=16, block_n=block_n, block_k=block_k, split_k=1, num_warps=4, num_stages=1)
    return TileConfig(block_m=16, block_n=CPU_BLOCK_N, block_k=256, split_k=1, num_warps=4, num_stages=1)


def _check_fields(user: TileConfig) -> None:
    if user.block_m is not None and user.block_m != 16:
        raise ValueError(f"{NAME}: all rows share one 16-row tile, so block_m must be 16 or unset (got {user.block_m})")
    check_fields(NAME, user)


_rule = default_config  # the rule resolve_config applies (ruled_by swaps it within a block)


@contextlib.contextmanager
def ruled_by(rule):
    """Within the block, decode_linear's default tiles come from rule(rows, out_features, in_features, dtype,
    device) in place of default_config: for comparing tile rules (overlap_sweep, experiments/README.md)."""
    global _rule
    saved, _rule = _rule, rule
    resolve_config.cache_clear()
    try:
        yield
    finally:
        _rule = saved
        resolve_config.cache_clear()


@functools.lru_cache(maxsize=1024)  # called on every launch: resolve each shape once
def resolve_config(config, rows, out_features, in_features, dtype, device) -> TileConfig:
    user = as_config(NAME, config)
    _check_fields(user)
    itemsize = torch.empty((), dtype=dtype).element_size()
    cfg = user.merged(_rule(rows, out_features, in_features, dtype, device))
    if prefetches(cfg):  # registers, not shared memory: the slice must fit them
        k_per_split, _ = splits_of(cfg, in_features)
        held = sum(slice_tiles(k_per_split)) * cfg.block_n
        if k_per_split > cfg.block_k:
            raise ValueError(
                f"{NAME}: block_k={cfg.block_k} (from {PREFETCH_BLOCK_K} on) loads each split's K slice at once, but "
                f"{in_features} columns in {cfg.split_k} splits are slices of {k_per_split}; use block_k >= "
                f"{next_pow2(k_per_split)}, a larger split_k, or block_k <= {PREFETCH_BLOCK_K // 2} for the K loop"
            )
        most = CPU_PREFETCH_ELEMENTS if device_limits(device).is_cpu else PREFETCH_ELEMENTS
        if held > most:
            raise ValueError(
                f"{NAME}: {cfg} loads a {k_per_split}-column K slice of {cfg.block_n} columns at once ({held} "
                f"elements; at most {most} fit registers); use a smaller block_n or a larger split_k, "
                "or a block_k below the slice for the K loop"
            )
        return cfg
    if cfg.block_n < 16:
        raise ValueError(
            f"{NAME}: block_n={cfg.block_n} needs the prefetch form (block_k >= {PREFETCH_BLOCK_K}); the K loop's "
            "tl.dot takes tiles of at least 16 columns"
        )
    cfg = fit_defaults(NAME, cfg, user, lambda c: shared_memory(c, itemsize, device), device)
    need = shared_memory(cfg, itemsize, device)
    what = f"{cfg.num_stages} stages of a 16x{cfg.block_k} and a {cfg.block_k}x{cfg.block_n} tile"
    check_shared_memory(NAME, cfg, need, device, what)
    return cfg


PREFETCH_ELEMENTS = 1 << 16  # the most weight elements one program of the prefetch form holds (128 KB in bf16)
# The same in the interpreter, where a program's values are numpy arrays: a whole LM head's slice, 4 MB in fp32.
CPU_PREFETCH_ELEMENTS = 1 << 20


PREFETCH_BLOCK_K = 512  # block_k from here up chooses the prefetch form; below it, the K loop


def prefetches(cfg: TileConfig) -> bool:
    """Whether a launch at these tiles is the prefetch form, which loads each split's whole K slice (at most
    block_k columns) at once, rather than the K loop in block_k steps."""
    return cfg.block_k >= PREFETCH_BLOCK_K


def splits_of(cfg: TileConfig, in_features: int) -> tuple[int, int]:
    """(columns of K per split, splits). The K loop takes whole BLOCK_K steps per split, as linear's split-K
    path, so the last split may be shorter and fewer than split_k splits may be needed. The prefetch form
    cuts K into split_k slices rounded up to 16 columns."""
    if prefetches(cfg):
        k_per_split = cdiv(cdiv(in_features, cfg.split_k), 16) * 16
    else:
        k_per_split = cdiv(cdiv(in_features, cfg.split_k), cfg.block_k) * cfg.block_k
    return k_per_split, cdiv(in_features, k_per_split)


def slice_tiles(k_per_split: int) -> tuple[int, int]:
    """The prefetch form's two K tiles covering a slice: the largest power of two that fits, and the rest
    rounded up to a power of two (0 when the slice is one already): 768 -> (512, 256)."""
    head = prev_pow2(k_per_split)
    rest = k_per_split - head
    return head, (next_pow2(rest) if rest else 0)


def traffic(
    rows,
    out_features,
    in_features,
    itemsize,
    *,
    bias=True,
    activation=None,
    residual=False,
    norm=False,
    rms=False,
    kv=None,
    head_dim=None,
    rope=False,
    config=None,
    dtype=torch.float16,
    device="cpu",
    lengths_itemsize=4,
) -> Traffic:
    """Modeled traffic of one decode_linear launch at these tiles. out_features: the weight's rows (2F for
    activation "swiglu", whose output is F wide); rms: the norm is RMSNorm (a weight, no bias); `kv` the number
    of heads of the cache write (None: no cache write), of head_dim each (default in_features // kv, GPT-2's);
    rope: q and k turned by rotary positions.

    SM requests: each program loads its x rows over its K slice (so x is read once per column tile) and its
    weight slice (columns wrap, never masked, as linear's). With the norm, each program also reads the full
    rows once for the statistics (the variance pass re-reads what the mean pass just brought into L1) and
    its slice of the norm's weight and bias. With several splits each program stores an fp32 partial and the
    last arriver reads all of its tile's back; each program's atomic on its tile's counter moves one sector
    each way, and the last arriver's reset stores one. The epilogue loads bias and residual once and stores
    y; with kv, each tile holding K or V columns loads the positions (one access; with rope every tile does)
    and each cache row is stored in whole sectors (config.sectors; a row split across two tiles can cost a
    sector more). The rotation's angles come from the positions in registers: no bytes.
    HBM: x, weight, the norm's parameters, bias and residual come from HBM once (the re-reads of x are L2 hits
    while x fits, config.l2_miss); the partials are written (reaching HBM eventually) and read back from L2
    while they fit; y and the cache rows are written; the counters are read and written once per tile."""
    cfg = resolve_config(config, rows, out_features, in_features, dtype, device)
    _, splits = splits_of(cfg, in_features)
    tiles_n = cdiv(out_features, cfg.block_n)
    programs = tiles_n * splits
    x_bytes, w_bytes, y_bytes, b_bytes, r_bytes = operand_bytes(
        rows, out_features, in_features, itemsize, bias, residual
    )
    swiglu = activation == "swiglu"
    if swiglu:  # gate and up in, one feature out
        y_bytes //= 2
    ln_bytes = (1 if rms else 2) * in_features * itemsize if norm else 0
    x_loaded = x_bytes * tiles_n + (x_bytes * programs if norm else 0)
    w_loaded = tiles_n * min(cfg.block_n, out_features) * in_features * itemsize
    partial = splits * rows * out_features * 4 if splits > 1 else 0
    counter = tiles_n * SECTOR if splits > 1 else 0  # one slot per tile, one sector each
    atomics = programs * SECTOR if splits > 1 else 0
    kv_rows = kv_read = kv_bytes = lengths = 0
    if kv:
        head_dim = head_dim or in_features // kv
        kv_rows = 2 * rows * kv * sectors(head_dim * itemsize)
        kv_bytes = 2 * rows * kv * head_dim * itemsize
        lengths = rows * lengths_itemsize
        k_start = out_features - 2 * kv * head_dim
        reading = tiles_n if rope else tiles_n - k_start // cfg.block_n  # the tiles that end past q's columns
        kv_read = reading * sectors(lengths)
    reads = x_loaded + w_loaded + ln_bytes * tiles_n + partial + b_bytes + r_bytes + kv_read + atomics
    writes = partial + y_bytes + kv_rows + atomics + counter
    epilogue = (1 if bias else 0) + (1 if residual else 0) + (10 if activation == "gelu" else 0)
    epilogue += (5 / 2 if swiglu else 0) + (splits - 1 if splits > 1 else 0)
    flops = 2 * rows * out_features * in_features + round(rows * out_features * epilogue)
    if norm:  # every program's statistics over the full rows (3 per element), each tile's normalisation (4)
        flops += programs * 3 * rows * in_features + tiles_n * 4 * rows * in_features
    if rope:  # an angle, its cosine and sine, two products and a sum per turned element
        flops += 8 * rows * (out_features - kv * head_dim)
    inputs = x_bytes + w_bytes + ln_bytes + b_bytes + r_bytes
    floor = inputs + lengths + y_bytes + kv_bytes
    hbm_read = (
        inputs + round((x_loaded - x_bytes) * l2_miss(x_bytes, device)) + round(partial * l2_miss(partial, device))
    )
    hbm_read += (sectors(lengths) if kv else 0) + counter
    return Traffic(reads, writes, flops, floor, hbm_read, partial + y_bytes + kv_bytes + counter)
