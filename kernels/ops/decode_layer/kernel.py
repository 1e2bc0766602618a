"""A whole GPT-2 block for a decode step in one launch: the persistent rung of the fusion ladder.

The decode rung runs a block as five kernels (ln_1 + c_attn + the cache write, attention, c_proj + residual,
ln_2 + c_fc + GELU, c_proj + residual), each waiting at a kernel boundary for the one before. Here one
launch of at most one program per SM runs the same five stages, and the programs wait for each other at
counters in device memory instead (kernels.barrier):

    stage 0   ln_1 + c_attn + KV write   column tiles of c_attn (matmul.decode_items.load_slice, slice_times)
    stage 1   attention                  (sequence, head, split) items, the last split of each pair merging
                                         (attn.decode.attend_item)
    stage 2   c_proj + residual          column tiles of attn.c_proj
    stage 3   ln_2 + c_fc + GELU         column tiles of mlp.c_fc
    stage 4   c_proj + residual          column tiles of mlp.c_proj

Each program takes the items of a stage in turn (item = program, program + P, ...). Before an item reads
what the stage before wrote it waits for every program's arrival at that stage; a projection's item loads
its weight slice first, so while a program waits, its weights are already on their way (as under PDL, but
at no kernel boundary); an attention item whose split is one key tile loads the cache rows of earlier steps
before its wait too, and only q and the newest row after. The tiles are chosen so that on a GPU each stage
has about one item per program.

Where the GPU has it (Hopper on), each layer's launch uses PDL (kernels.pdl): the next layer's programs may
start and load their first weight slices while this one finishes; they wait before reading its output or
touching the stage counters, which the layers share.

The arithmetic is the decode rung's, item by item (the same device functions), so both give the same
result up to the order of fp32 sums where the tiles differ. In the interpreter the launch is one program
(kernels.barrier says why), which takes every item itself.
"""

import contextlib
import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ... import arrival, barrier, launch, pdl, stamps
from ...config import (
    SECTOR,
    TileConfig,
    Traffic,
    cdiv,
    device_limits,
    new_output,
    next_pow2,
    overlaps_launches,
    prev_pow2,
)
from ..decode_attention.kernel import attend_item, early_rows
from ..decode_attention.kernel import launch_plan as attention_plan
from ..decode_linear.items import finish, load_slice, slice_times, store_gelu, store_linear
from ..decode_linear.kernel import _check as check_decode_linear
from ..decode_linear.tiles import PREFETCH_BLOCK_K, PREFETCH_ELEMENTS, slice_tiles
from ..decode_linear.tiles import traffic as linear_traffic
from ..linear.kernel import DECODE_ROWS

NAME = "decode_layer"
ELEMENTS = 24576  # the most weight elements one item holds: the decode rung's prefetch form at 8 x 3072
# In the interpreter, where the one program takes every item in turn at a cost per item, not per element: as many
# as decode_linear's prefetch form allows (256 columns of a 256-wide K).
CPU_ELEMENTS = PREFETCH_ELEMENTS
STAGES = 5
WARPS = 8
PDL = True  # launch with programmatic dependent launch where the GPU has it
ATTENTION_TILE = 128  # keys: a split of at most this many is loaded whole, before the wait for stage 0


class Variant(NamedTuple):
    """What the launches may vary, for comparing them (experiments/one_launch_sweep.py): PDL where the GPU has
    it, attention's key tile, and how many column tiles of each projection one program takes."""

    pdl: bool = PDL
    attention_tile: int = ATTENTION_TILE
    items_per_program: int = 1


_variant = Variant()


@contextlib.contextmanager
def varied(variant: Variant):
    """Within the block, decode_layer launches as `variant` says."""
    global _variant
    saved, _variant = _variant, variant
    plan.cache_clear()
    try:
        yield
    finally:
        _variant = saved
        plan.cache_clear()


@triton.jit
def _decode_layer_kernel(
    block,
    cache,
    attention,
    scratch,
    Sync,
    Times,
    sizes,
    ROWS: tl.constexpr,
    BN_A: tl.constexpr,
    BN_O: tl.constexpr,
    BN_F: tl.constexpr,
    BN_P: tl.constexpr,
    HEAD_C: tl.constexpr,
    TAIL_C: tl.constexpr,
    HEAD_F: tl.constexpr,
    TAIL_F: tl.constexpr,
    STATS_COLS: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ATT_PREFETCH: tl.constexpr,
    PDL: tl.constexpr,
    Stamps,
):
    """block = (ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj): ln_1, ln_2 = (weight, bias, eps), the projections
    (weight (out, in), bias); cache = (k_cache, v_cache, lengths, next_lengths, head_dim, k_strides, v_strides);
    attention = (partials, counters, splits, keys per split, scale); scratch = (x, qkv, attn, x1, hid, out), the
    block's input, activations and output, each (M, width) and contiguous; Times: the timer stamps'
    buffer, or None; sizes = (M rows, C width, H heads). BN_*: the four projections' columns per item; HEAD_*
    and TAIL_*: a K slice C (and 4C) wide in two powers of two."""
    stamps.begin(Stamps)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj = block
    M, C, H = sizes
    F = 4 * C
    X, QKV, Attn, X1, Hid, Out = scratch
    KC, VC, Lengths, NextLengths, HEAD_DIM, k_strides, v_strides = cache
    Part, Heads, SPLITS, CHUNK, qk_scale = attention
    pdl.launch_dependents(PDL)  # the next layer may start loading its weights; it waits before reading ours
    _stamp(Times, pid, 0)
    kv = (KC, VC, Lengths, HEAD_DIM, C, C, k_strides, v_strides)  # K at columns [C, 2C), V after it
    _stage(
        pid,
        P,
        c_attn,
        (X, C, 1),
        ln_1,
        out=((QKV, 3 * C), None, None, kv, None),
        M=M,
        N=3 * C,
        K=C,
        wait=None,
        EPILOGUE=store_linear,
        PDL=PDL,
        ROWS=ROWS,
        BN=BN_A,
        HEAD_K=HEAD_C,
        TAIL_K=TAIL_C,
        STATS_COLS=STATS_COLS,
    )
    _stamp(Times, pid, 1)
    # A program with no stage-0 item has not waited yet; under PDL it must, before it touches the counters
    # (the layer before may still be using them). Waiting again is free.
    pdl.wait(PDL)
    _stamp(Times, pid, 2)
    barrier.arrive(Sync, 0)
    # With ATT_PREFETCH the old cache rows are loaded before the wait. Longer splits loop in the vector form (DOT
    # False): one stage deep, a pipelined dot would want registers and shared memory the projections use.
    partial = None
    if SPLIT:
        partial = (Part, Heads, SPLITS)
    keys = (KC, k_strides[0], k_strides[1], k_strides[2], k_strides[3])
    values = (VC, v_strides[0], v_strides[1], v_strides[2], v_strides[3])
    for item in range(pid, M * H * SPLITS, P):
        bh, split = tl.cast(item // SPLITS, tl.int64), item % SPLITS
        early = early_rows(
            keys, values, NextLengths, bh, split, H, CHUNK, HEAD_DIM, BLOCK_N, BLOCK_D, PREFETCH=ATT_PREFETCH
        )
        barrier.wait(Sync, 0, P)  # stage 0's q and newest cache rows
        attend_item(
            bh,
            split,
            M * H,
            (QKV, 3 * C, HEAD_DIM, 1),
            keys,
            values,
            (Attn, C, HEAD_DIM, 1),
            early,
            partial,
            H,
            CHUNK,
            qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_N=BLOCK_N,
            BLOCK_S=BLOCK_S,
            BLOCK_D=BLOCK_D,
            PREFETCH=ATT_PREFETCH,
            DOT=False,
        )
    _stamp(Times, pid, 3)
    barrier.arrive(Sync, 1)
    _stage(
        pid,
        P,
        c_proj,
        (Attn, C, 1),
        norm=None,
        out=((X1, C), None, (X, C), None, None),
        M=M,
        N=C,
        K=C,
        wait=(Sync, 1, P),
        EPILOGUE=store_linear,
        PDL=False,
        ROWS=ROWS,
        BN=BN_O,
        HEAD_K=HEAD_C,
        TAIL_K=TAIL_C,
        STATS_COLS=STATS_COLS,
    )
    _stamp(Times, pid, 4)
    barrier.arrive(Sync, 2)
    _stage(
        pid,
        P,
        c_fc,
        (X1, C, 1),
        ln_2,
        out=((Hid, F), None, None, None, None),
        M=M,
        N=F,
        K=C,
        wait=(Sync, 2, P),
        EPILOGUE=store_gelu,
        PDL=False,
        ROWS=ROWS,
        BN=BN_F,
        HEAD_K=HEAD_C,
        TAIL_K=TAIL_C,
        STATS_COLS=STATS_COLS,
    )
    _stamp(Times, pid, 5)
    barrier.arrive(Sync, 3)
    _stage(
        pid,
        P,
        mlp_proj,
        (Hid, F, 1),
        norm=None,
        out=((Out, C), None, (X1, C), None, None),
        M=M,
        N=C,
        K=F,
        wait=(Sync, 3, P),
        EPILOGUE=store_linear,
        PDL=False,
        ROWS=ROWS,
        BN=BN_P,
        HEAD_K=HEAD_F,
        TAIL_K=TAIL_F,
        STATS_COLS=STATS_COLS,
    )
    _stamp(Times, pid, 6)
    barrier.finish(Sync, 4, P)  # counters 0-3 after stages 0-3, 4 for the end
    stamps.end(Stamps)


@triton.jit
def _stage(
    pid,
    P,
    linear,
    x,
    norm,
    out,
    M,
    N,
    K,
    wait,
    EPILOGUE: tl.constexpr,
    PDL: tl.constexpr,
    ROWS: tl.constexpr,
    BN: tl.constexpr,
    HEAD_K: tl.constexpr,
    TAIL_K: tl.constexpr,
    STATS_COLS: tl.constexpr,
):
    """A projection stage: this program's column tiles of linear = (W (N, K), bias), items pid, pid + P, ...,
    each one's weight slice loaded before it waits for the stage's input: wait = (Sync, stage, arrivals),
    `arrivals` arrivals at Sync[stage] (kernels.barrier), or None for the layer ahead under PDL. x, norm and
    out (whose bias is linear's) as kernels.ops.decode_linear.items takes them."""
    W, Bias = linear
    y, _, res, kv, _ = out
    for t in range(pid, tl.cdiv(N, BN), P):
        w_slice = load_slice(
            t, 0, (W, K, 1), N, K, K, rope=None, BLOCK_N=BN, HEAD_K=HEAD_K, TAIL_K=TAIL_K, SWIGLU=False
        )
        if wait is None:
            pdl.wait(PDL)
        else:
            Sync, stage, arrivals = wait
            barrier.wait(Sync, stage, arrivals)
        acc = slice_times(
            w_slice,
            0,
            x,
            norm,
            M,
            K,
            K,
            RMS=False,
            ROWS=ROWS,
            BLOCK_N=BN,
            HEAD_K=HEAD_K,
            TAIL_K=TAIL_K,
            STATS_COLS=STATS_COLS,
        )
        rows = tl.arange(0, ROWS).to(tl.int64)
        cols = tl.cast(t, tl.int64) * BN + tl.arange(0, BN)
        finish(
            acc,
            rows,
            cols,
            t,
            0,
            partial=None,
            out=(y, Bias, res, kv, None),
            M=M,
            N=N,
            EPILOGUE=EPILOGUE,
            BLOCK_M=ROWS,
            BLOCK_N=BN,
        )


@triton.jit
def _stamp(Times, pid, k):
    """With Times (experiments/persistent_profile.py), the GPU's global timer in ns at point k of program pid."""
    if Times is not None:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid], dtype=tl.int64, is_pure=False, pack=1)
        tl.store(Times + pid * 8 + k, t)


def programs(device, items: int) -> int:
    """Programs of one launch: one per SM at most (all must be resident at once), one in the interpreter."""
    limits = device_limits(device)
    return 1 if limits.is_cpu else max(1, min(limits.num_sms, items))


def column_tile(out_features: int, in_features: int, count: int, elements: int = ELEMENTS) -> int:
    """Columns per item: about one item per program, within what one item holds in registers (`elements`)."""
    block_n = max(8, next_pow2(cdiv(out_features, count)))
    while block_n > 8 and block_n * in_features > elements:
        block_n //= 2
    return block_n


@functools.lru_cache(maxsize=256)  # called on every launch: plan each shape once (callers only read the dict)
def plan(rows: int, width: int, heads: int, max_len: int, dtype, device) -> dict:
    """Everything the launch needs that depends on shapes alone: programs, tiles, the attention split, and the
    kernel's constexprs."""
    limits = device_limits(device)
    count = 1 if limits.is_cpu else limits.num_sms
    shapes = {
        "BN_A": (3 * width, width),
        "BN_O": (width, width),
        "BN_F": (4 * width, width),
        "BN_P": (width, 4 * width),
    }
    elements = CPU_ELEMENTS if limits.is_cpu else ELEMENTS
    wanted = count * _variant.items_per_program  # items per projection
    tiles = {name: column_tile(out_f, in_f, wanted, elements) for name, (out_f, in_f) in shapes.items()}
    # Attention's items too: about one per program (the default's would be many short splits of 32 keys, made
    # for programs of 2 warps, not for one 8-warp program per SM), each one key tile where it fits registers.
    split = None
    if not limits.is_cpu:
        split_k = prev_pow2(max(1, count // (rows * heads)))
        block_n = min(_variant.attention_tile, max(16, next_pow2(cdiv(max_len, split_k))))
        split = TileConfig(block_n=block_n, split_k=split_k, num_warps=WARPS, num_stages=1)
    attention, chunk, splits, block_d, block_s, att_prefetch, _, scale, _ = attention_plan(
        split, rows * heads, max_len, width // heads, dtype, device
    )
    items = max(rows * heads * splits, *(cdiv(out_f, tiles[name]) for name, (out_f, _) in shapes.items()))
    (head_c, tail_c), (head_f, tail_f) = slice_tiles(width), slice_tiles(4 * width)
    constexprs = dict(
        ROWS=next_pow2(rows),
        **tiles,
        HEAD_C=head_c,
        TAIL_C=tail_c,
        HEAD_F=head_f,
        TAIL_F=tail_f,
        STATS_COLS=next_pow2(width),
        SPLIT=splits > 1,
        BLOCK_N=attention.block_n,
        BLOCK_S=block_s,
        BLOCK_D=block_d,
        ATT_PREFETCH=att_prefetch,
        PDL=_variant.pdl and overlaps_launches(device),
    )
    return dict(
        programs=programs(device, items),
        tiles=tiles,
        attention=attention,
        chunk=chunk,
        splits=splits,
        scale=scale,
        constexprs=constexprs,
    )


def decode_layer(x, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj, kv, eps=1e-5, *, stamps=None):
    """One GPT-2 block on decode-shaped x (B, 1, C) or (B, C), B <= 16, in one launch; returns the block's
    output (x plus both residual branches) shaped like x.

    ln_1, ln_2: (weight, bias); c_attn, c_proj, c_fc, mlp_proj: (weight (out, in), bias), GPT-2's shapes.
    kv = (k_cache, v_cache, lengths, next_lengths): the layer's caches (B, H, T_max, D), each sequence's
    write position (the new token's K and V go there) and the keys it then attends over (lengths + 1), as
    int32/int64 tensors on the device, which the caller keeps valid (the kernel cannot check them).
    stamps: None, or an int64 (programs, 8) tensor for experiments/persistent_profile.py's timer stamps."""
    c_attn, c_proj, c_fc, mlp_proj = ((w.contiguous(), b.contiguous()) for w, b in (c_attn, c_proj, c_fc, mlp_proj))
    rows, heads = _check(x, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj, kv, eps)
    k_cache, v_cache, lengths, next_lengths = kv
    width = x.shape[-1]
    out = new_output(x)
    if rows == 0:
        return out
    p = plan(rows, width, heads, k_cache.shape[2], x.dtype, x.device)
    if stamps is not None and (
        x.device.type != "cuda" or stamps.shape != (p["programs"], 8) or stamps.dtype != torch.int64
    ):  # the stamps read the GPU's global timer: the interpreter has none
        raise ValueError(f"{NAME}: stamps must be an int64 ({p['programs']}, 8) tensor on the GPU, a row per program")
    x2 = x.reshape(rows, width).contiguous()
    qkv, attn, x1, hid = (new_output(x, (rows, n)) for n in (3 * width, width, width, 4 * width))
    part = new_output(x, (rows * heads * p["splits"] * (p["constexprs"]["BLOCK_D"] + 2),), torch.float32)
    launch.plain(_decode_layer_kernel)[(p["programs"],)](
        ((*ln_1, float(eps)), c_attn, c_proj, (*ln_2, float(eps)), c_fc, mlp_proj),
        (k_cache, v_cache, lengths, next_lengths, width // heads, k_cache.stride(), v_cache.stride()),
        (part, arrival.counters(x.device, rows * heads), p["splits"], p["chunk"], p["scale"]),
        (x2, qkv, attn, x1, hid, out),
        arrival.stage_counters(x.device, STAGES),
        stamps,
        (rows, width, heads),
        **p["constexprs"],
        num_warps=WARPS,
        num_stages=1,
        launch_pdl=p["constexprs"]["PDL"],
    )
    return out


def _check(x, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj, kv, eps) -> tuple[int, int]:
    """Validate everything before the launch; returns (rows, heads)."""
    rows = math.prod(x.shape[:-1])
    if rows > DECODE_ROWS:
        raise ValueError(f"{NAME}: at most {DECODE_ROWS} sequences per launch, got {rows}")
    if not isinstance(kv, tuple | list) or len(kv) != 4:
        raise ValueError(f"{NAME}: kv must be (k_cache, v_cache, lengths, next_lengths)")
    k_cache, v_cache, lengths, next_lengths = kv
    # x, ln_1, c_attn, the caches and the lengths, as the decode rung's first launch checks them.
    rows, heads = check_decode_linear(x, *c_attn, None, None, (*ln_1, eps), (k_cache, v_cache, lengths))
    width = x.shape[-1]
    if c_attn[0].shape != (3 * width, width) or heads * k_cache.shape[-1] != width:
        raise ValueError(
            f"{NAME}: GPT-2's block: c_attn (3C, C) = ({3 * width}, {width}) and caches of H heads of C / H, got "
            f"{tuple(c_attn[0].shape)} and {tuple(k_cache.shape)}"
        )
    parts = {
        "attn.c_proj": (c_proj, (width, width)),
        "mlp.c_fc": (c_fc, (4 * width, width)),
        "mlp.c_proj": (mlp_proj, (width, 4 * width)),
        "ln_2": (ln_2, (width,)),
    }
    for name, ((weight, bias), shape) in parts.items():
        if weight.shape != shape or bias.shape != shape[:1]:
            raise ValueError(
                f"{NAME}: {name} must have weight {shape} and bias ({shape[0]},) for width {width}, got "
                f"{tuple(weight.shape)} and {tuple(bias.shape)}"
            )
        for t in (weight, bias):
            if t.dtype != x.dtype or t.device != x.device:
                raise ValueError(f"{NAME}: {name} is {t.dtype} on {t.device}, but x is {x.dtype} on {x.device}")
    if next_lengths.shape != lengths.shape or next_lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{NAME}: next_lengths must be like lengths, a ({rows},) int32 or int64 tensor")
    if next_lengths.device != x.device:
        raise ValueError(f"{NAME}: next_lengths must be on {x.device}, got {next_lengths.device}")
    return rows, heads


def traffic(lengths, width, heads, max_len, itemsize, *, dtype=torch.float16, device="cpu") -> Traffic:
    """Modeled traffic of one launch: its five stages' items, as the decode rung's kernels at the same tiles
    move them (fused_linear.traffic, attention_decode.decode_traffic), and each program's arrival at every
    stage counter (one sector each way). The polls of a waiting program are not modeled: they depend on
    how long it waits."""
    from ..decode_attention.kernel import decode_traffic

    rows = len(lengths)
    p = plan(rows, width, heads, max_len, dtype, device)
    on = dict(dtype=dtype, device=device)

    def tiles(block_n, in_features):
        return TileConfig(
            block_m=16,
            block_n=block_n,
            block_k=max(PREFETCH_BLOCK_K, next_pow2(in_features)),
            split_k=1,
            num_warps=WARPS,
            num_stages=1,
        )

    t = p["tiles"]
    parts = [
        linear_traffic(rows, 3 * width, width, itemsize, norm=True, kv=heads, config=tiles(t["BN_A"], width), **on),
        decode_traffic(
            list(lengths), heads, max_len, width // heads, itemsize, config=p["attention"], one_launch=True, **on
        ),
        linear_traffic(rows, width, width, itemsize, residual=True, config=tiles(t["BN_O"], width), **on),
        linear_traffic(
            rows, 4 * width, width, itemsize, norm=True, activation="gelu", config=tiles(t["BN_F"], width), **on
        ),
        linear_traffic(rows, width, 4 * width, itemsize, residual=True, config=tiles(t["BN_P"], 4 * width), **on),
    ]
    return sum(parts, Traffic(0, STAGES * p["programs"] * SECTOR, 0, 0, 0, 0))  # the arrivals: a sector each
