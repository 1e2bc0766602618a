"""The one-launch decode step's plan: the model's shape, programs, column tiles and attention split of a launch,
what each counter holds at the end of a step, and the modeled traffic."""

from __future__ import annotations

import contextlib
import functools
import math
from typing import NamedTuple

import torch

from ...config import BOUNDS, SECTOR, TileConfig, Traffic, cdiv, device_limits, next_pow2, prev_pow2
from ..attention.kernel import LOG2E
from ..decode_attention.kernel import launch_plan as attention_plan
from ..decode_layer.kernel import column_tile
from ..decode_linear.tiles import CPU_PREFETCH_ELEMENTS, PREFETCH_BLOCK_K, slice_tiles
from ..grouped_decode_attention.kernel import plan as grouped_plan

WARPS = 8
ELEMENTS = 24576  # the most weight elements one task holds in registers (decode_layer's, 8 x 3072)
# In the interpreter's one program, tasks as wide as decode_linear's on CPU: its cost is per task, not per element.
CPU_ELEMENTS = CPU_PREFETCH_ELEMENTS
STAGES = 4  # counters per layer besides the heads': attention, c_proj, c_fc and mlp.c_proj done


class Shape(NamedTuple):
    """What the launch needs to know of the model: GPT-2's block or a Llama's (RMSNorm, rotary positions, grouped
    key/value heads, SwiGLU, no biases)."""

    width: int
    heads: int
    kv_heads: int  # key/value heads: GPT-2's are its heads
    ffn: int  # the hidden width after the activation: 4 x width for GPT-2, intermediate_size for a Llama
    vocab: int
    layers: int
    llama: bool = False

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def qkv(self) -> int:
        """c_attn's output columns: q's heads, then k's and v's."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def fc(self) -> int:
        """c_fc's weight rows: a Llama's gate over its up projection."""
        return 2 * self.ffn if self.llama else self.ffn


class Variant(NamedTuple):
    """What a launch may vary, for comparing them (experiments/one_launch_sweep.py): whether each program asks L2
    for its next layer's weight slices a layer ahead (a GPU's; the interpreter has no prefetch); programs per SM
    and warps per program. Tasks go to programs in turn, so with more programs than an operation has tasks the
    next operation's tasks land on other programs, which load their weight slices while this one's still wait or
    compute: more than one slice in flight on an SM. A task holds at most ELEMENTS x warps / WARPS weight
    elements; the column tiles are sized for one task per SM either way. Attention's keys are split so that its
    items number about `items` a program (rounded down to a power of two of splits): at batch 8, GPT-2's 96
    (sequence, head) pairs take one split each on 132 SMs, each item all of a sequence's keys. A Llama's split
    stops where grouped attention's plan would merge its splits apart (_grouped). In the interpreter's one program
    `items` above 1 splits the keys too, so that the merges a GPU's launch makes run there as well. With `dot`,
    from 5 rows on the projections multiply all rows in one tl.dot of 16 rows (decode_linear.items._rows_dot), not
    a row at a time. With `narrow` above 1, a task holds at most 1/narrow of those weight elements: narrower column
    tiles (8 at the least), more tasks an operation, each with fewer registers for its slice."""

    l2_ahead: bool = False
    per_sm: int = 1
    warps: int = WARPS
    items: int = 1
    dot: bool = False
    narrow: int = 1


_variant = Variant()


@contextlib.contextmanager
def varied(variant: Variant):
    """Within the block, decode_step launches as `variant` says."""
    global _variant
    saved, _variant = _variant, variant
    plan.cache_clear()
    try:
        yield
    finally:
        _variant = saved
        plan.cache_clear()


class Plan(NamedTuple):
    programs: int
    tiles: dict  # operation -> columns per task
    chunk: int  # keys per attention split
    splits: int
    block_d: int
    scale: float
    constexprs: dict  # TILES and ATT, the kernel's two tuples of constexprs
    attention: object  # the GPT-2 attention's TileConfig (the traffic model's), None for a Llama's
    warps: int = WARPS


def head_needs(shape: Shape, block_n: int) -> list[int]:
    """Each key/value head's count at its counter once c_attn is done: the runs of one tile's columns within the
    q columns of its group of query heads, or its k or v columns (as the kernel's _arrive_heads counts them)."""
    return list(_head_needs(shape, block_n))


@functools.lru_cache(maxsize=64)  # every launch asks: count each shape's tiles once
def _head_needs(shape: Shape, block_n: int) -> tuple[int, ...]:
    d, group = shape.head_dim, shape.heads // shape.kv_heads
    sections = ((0, group * d), (shape.heads * d, d), ((shape.heads + shape.kv_heads) * d, d))  # (start, a head's)
    needs = [0] * shape.kv_heads
    for t in range(cdiv(shape.qkv, block_n)):
        lo, hi = t * block_n, min((t + 1) * block_n, shape.qkv)
        for start, unit in sections:
            a, b = max(lo, start), min(hi, start + shape.kv_heads * unit)
            for g in range((a - start) // unit, (b - 1 - start) // unit + 1) if a < b else ():
                needs[g] += 1
    return tuple(needs)


@functools.lru_cache(maxsize=64)
def plan(rows: int, shape: Shape, max_len: int, dtype, device) -> Plan:
    """Programs, tiles and the attention split of a launch: at most one program per SM (the launch holds that
    to the compiled kernel), about one task per program in each operation, each task's weights within what a
    program holds in registers."""
    limits = device_limits(device)
    count = 1 if limits.is_cpu else limits.num_sms
    warps = WARPS if limits.is_cpu else _variant.warps
    elements = CPU_ELEMENTS if limits.is_cpu else ELEMENTS * warps // WARPS // _variant.narrow
    c = shape.width
    shapes = {"BN_A": (shape.qkv, c), "BN_O": (c, c), "BN_F": (shape.fc, c), "BN_P": (c, shape.ffn)}
    tiles = {name: column_tile(out_f, in_f, count, elements) for name, (out_f, in_f) in shapes.items()}
    if shape.llama:  # SwiGLU gates pairs of columns: at least two features a tile
        tiles["BN_F"] = max(tiles["BN_F"], 16)
    tiles["BN_H"] = column_tile(shape.vocab, c, count, elements)
    pairs = rows * shape.kv_heads
    whole = limits.is_cpu and _variant.items == 1  # the interpreter's one program takes a pair's keys at once
    if shape.llama:
        att, chunk, splits, block_d = _grouped(pairs, count * _variant.items, max_len, shape, dtype, device, whole)
        config = None
    else:
        split = None
        if not whole:
            most = BOUNDS["decode_attention"]["split_k"][1]  # attention_plan takes no more, whatever the keys
            split_k = min(most, prev_pow2(max(1, count * _variant.items // pairs)))
            block_n = min(128, max(16, next_pow2(cdiv(max_len, split_k))))
            split = TileConfig(block_n=block_n, split_k=split_k, num_warps=warps, num_stages=1)
        config, chunk, splits, block_d, block_s, early, _, _, _ = attention_plan(
            split, pairs, max_len, shape.head_dim, dtype, device
        )
        att = (config.block_n, block_s, block_d, early, 16, 1, "ieee", shape.head_dim)
    (head_c, tail_c), (head_f, tail_f) = slice_tiles(c), slice_tiles(shape.ffn)
    l2_ahead = _variant.l2_ahead and not limits.is_cpu
    t = tiles
    order = (next_pow2(rows), t["BN_A"], t["BN_O"], t["BN_F"], t["BN_P"], t["BN_H"], head_c, tail_c, head_f, tail_f)
    dot = _variant.dot and next_pow2(rows) >= 8
    constexprs = dict(TILES=(*order, next_pow2(c), l2_ahead, dot), ATT=att)
    outputs = {**{n: out_f for n, (out_f, _) in shapes.items()}, "BN_H": shape.vocab}
    items = max(pairs * splits, *(cdiv(out_f, tiles[n]) for n, out_f in outputs.items()))
    programs = 1 if limits.is_cpu else max(1, min(count * _variant.per_sm, items))
    scale = LOG2E / math.sqrt(shape.head_dim)
    return Plan(programs, tiles, chunk, splits, block_d, scale, constexprs, config, warps)


def _grouped(pairs: int, items: int, max_len: int, shape: Shape, dtype, device, whole: bool):
    """Grouped decode attention's split for the launch: about `items` items in all, merged by the last split of
    each pair (never by a second kernel: a launch is the whole step); one split with `whole`. Returns (ATT, chunk,
    splits, BLOCK_D)."""
    group, d = shape.heads // shape.kv_heads, shape.head_dim
    split_k = 1 if whole else prev_pow2(max(1, items // pairs))
    while True:
        p = grouped_plan(pairs, max_len, device, group=group, head_dim=d, split_k=split_k)
        if not p.apart or split_k == 1:
            break
        split_k //= 2
    block_d = max(16, next_pow2(d))
    att = (p.block_n, next_pow2(p.splits), block_d, p.chunk == p.block_n, max(16, next_pow2(group)))
    att += (next_pow2(group), "ieee" if dtype == torch.float32 else "tf32", d)  # as grouped_decode_attention's
    return att, p.chunk, p.splits, block_d


def counts(rows: int, shape: Shape, max_len: int, dtype, device) -> tuple[list[int], list[int]]:
    """What each counter holds at the end of a step, before the reset: (stage counters, head counters), as lists:
    the embedding's tasks; per layer attention's items, then c_proj's, c_fc's and mlp.c_proj's tasks; the
    programs at the end; and each (layer, key/value head)'s runs of c_attn tiles."""
    p = plan(rows, shape, max_len, dtype, device)
    runs = tasks(rows, shape, max_len, dtype, device)
    stages = [n for name, _, n in runs[:-1] if name != "c_attn"] + [p.programs]  # c_attn's arrive at the heads'
    return stages, head_needs(shape, p.tiles["BN_A"]) * shape.layers


def tasks(rows: int, shape: Shape, max_len: int, dtype, device) -> list[tuple[str, int, int]]:
    """The step's task list as runs of one operation: (operation, layer (-1 outside the layers), tasks), in the
    order the launch numbers them (task g runs on program g mod programs)."""
    p = plan(rows, shape, max_len, dtype, device)
    t, c = p.tiles, shape.width
    out = [("embedding", -1, cdiv(c, t["BN_O"]))]
    for layer in range(shape.layers):
        out += [
            ("c_attn", layer, cdiv(shape.qkv, t["BN_A"])),
            ("attention", layer, rows * shape.kv_heads * p.splits),
            ("c_proj", layer, cdiv(c, t["BN_O"])),
            ("c_fc", layer, cdiv(shape.fc, t["BN_F"])),
            ("mlp.c_proj", layer, cdiv(c, t["BN_P"])),
        ]
    return out + [("lm_head", -1, cdiv(shape.vocab, t["BN_H"]))]


def traffic(lengths, shape: Shape, max_len: int, itemsize: int, *, dtype=torch.float16, device="cpu") -> Traffic:
    """Modeled traffic of one launch: the sum of its operations' (parts)."""
    return sum(parts(lengths, shape, max_len, itemsize, dtype=dtype, device=device).values(), Traffic(0, 0, 0, 0))


def parts(lengths, shape: Shape, max_len: int, itemsize: int, *, dtype=torch.float16, device="cpu") -> dict:
    """Modeled traffic of one launch by operation, named as the task list names them (tasks) over all layers:
    the embedding's gathers, each layer's five operations as the decode rung's kernels move them at this launch's
    tiles (decode_linear's and decode attention's models), the LM head, and under "counters" one sector each way
    for every arrival at a counter (each task's, the heads' from each c_attn tile, the end's). The polls of a
    waiting program are not modeled: they depend on how long it waits."""
    from ...operations import OPERATIONS
    from ...sizes import RowsSizes
    from ..decode_attention.kernel import decode_traffic
    from ..decode_linear.tiles import traffic as linear_traffic
    from ..grouped_decode_attention.kernel import traffic as grouped_traffic

    rows = len(lengths)
    p = plan(rows, shape, max_len, dtype, device)
    on = dict(dtype=dtype, device=device)
    c, llama, t = shape.width, shape.llama, p.tiles

    def tiles(block_n, in_features):
        block_k = max(PREFETCH_BLOCK_K, next_pow2(in_features))
        return TileConfig(block_m=16, block_n=block_n, block_k=block_k, split_k=1, num_warps=WARPS, num_stages=1)

    norm = dict(norm=True, rms=llama, bias=not llama)
    qkv = dict(kv=shape.kv_heads, head_dim=shape.head_dim, rope=llama)
    if llama:
        attention = grouped_traffic(
            list(lengths), shape.heads, shape.kv_heads, shape.head_dim, itemsize, max_len=max_len, device=device,
            block_n=p.constexprs["ATT"][0], split_k=p.splits,
        )  # fmt: skip
    else:
        attention = decode_traffic(
            list(lengths), shape.heads, max_len, shape.head_dim, itemsize, config=p.attention, one_launch=True, **on
        )
    fc = dict(activation="swiglu") if llama else dict(activation="gelu")
    layer = {  # every layer moves the same bytes
        "c_attn": linear_traffic(rows, shape.qkv, c, itemsize, **norm, **qkv, config=tiles(t["BN_A"], c), **on),
        "attention": attention,
        "c_proj": linear_traffic(rows, c, c, itemsize, bias=not llama, residual=True, config=tiles(t["BN_O"], c), **on),
        "c_fc": linear_traffic(rows, shape.fc, c, itemsize, **norm, **fc, config=tiles(t["BN_F"], c), **on),
        "mlp.c_proj": linear_traffic(
            rows, c, shape.ffn, itemsize, bias=not llama, residual=True, config=tiles(t["BN_P"], shape.ffn), **on
        ),
    }
    stages, heads = counts(rows, shape, max_len, dtype, device)
    arrivals = sum(stages) + sum(heads)
    return {
        "embedding": OPERATIONS["token_embedding" if llama else "embedding"].book(RowsSizes(rows, c), itemsize),
        **{name: sum([part] * shape.layers, Traffic(0, 0, 0, 0)) for name, part in layer.items()},
        "lm_head": linear_traffic(
            rows, shape.vocab, c, itemsize, bias=False, norm=True, rms=llama, config=tiles(t["BN_H"], c), **on
        ),
        "counters": Traffic(arrivals * SECTOR, arrivals * SECTOR, 0, 0, 0, 0),
    }
