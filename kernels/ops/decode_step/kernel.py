"""A whole GPT-2 decode step in one launch: the megakernel rung of the fusion ladder.

Every operation of the step is a list of tasks, each one tile of one operation's output, in the order the
step computes them (each task depends only on tasks before it):

    embedding                       column tiles of x = wte[ids] + wpe[positions]
    per layer:  ln_1 + c_attn + KV  column tiles of c_attn, the new K and V rows written to the cache
                attention           (sequence, head, split) items, the last split of each pair merging
                c_proj + residual   column tiles of attn.c_proj
                ln_2 + c_fc + GELU  column tiles of mlp.c_fc
                c_proj + residual   column tiles of mlp.c_proj
    ln_f + lm_head                  column tiles of the logits

Task g runs on program g mod P, so each program takes its tasks in list order, and a program waiting for a
task only waits for tasks earlier in the list: the one unfinished task earliest in the list always has its
inputs, so with every program resident at once the step cannot deadlock. The launch starts at most as many
programs as the GPU holds at once, counted from the compiled kernel (kernels.occupancy), never assumed.

A task waits only for what it reads, at counters in device memory (kernels.barrier.wait_count), not for every
program: an attention item for the tiles of c_attn that hold its head's q, k and v columns (a counter per layer
and head), every other task for all tasks of the operation before it (a norm needs whole rows, a projection
all of its input's columns). Before it waits, a projection task has loaded its weight slice (weights depend on
nothing), and an attention item the cache rows of earlier steps; only the activations wait.

Each wait is bounded: past `limit` polls the program records which wait failed in a status word and carries
on, so a fault becomes an error the host reads after the step (check), never a hang. The last program to
finish sets every counter back to 0 for the next step.

The interpreter runs a grid's programs one after another, where a program spinning for another would wait
forever: there the launch is one program, which runs the same task list in its order, each wait already met.
The arithmetic is the decode rung's, tile by tile (the same device functions).
"""

from __future__ import annotations

import contextlib
import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ... import arrival, barrier, launch, stamps
from ...config import SECTOR, TileConfig, Traffic, cdiv, device_limits, new_output, next_pow2, prev_pow2
from ..decode_attention.kernel import attend_item, early_rows
from ..decode_attention.kernel import launch_plan as attention_plan
from ..decode_layer.kernel import column_tile
from ..decode_linear.items import finish, load_slice, slice_times, store_gelu, store_linear
from ..decode_linear.tiles import PREFETCH_ELEMENTS, slice_tiles
from ..linear.kernel import DECODE_ROWS

NAME = "decode_step"
WARPS = 8
ELEMENTS = 24576  # the most weight elements one task holds in registers (decode_layer's, 8 x 3072)
CPU_ELEMENTS = PREFETCH_ELEMENTS  # in the interpreter's one program, tasks as wide as decode_linear's on CPU
LIMIT = 1 << 20  # polls before a wait gives up: under a second on a GPU, a thousand steps' worth
LAYER_PARTS = 12  # tensors of one layer: ln_1 (w, b), c_attn (W, b), c_proj (W, b), ln_2 (w, b), c_fc, mlp.c_proj
STAGES = 4  # counters per layer besides the heads': attention, c_proj, c_fc and mlp.c_proj done


@triton.jit
def _decode_step_kernel(
    ends,
    layers,
    cache,
    partial,
    attention,
    scratch,
    deps,
    sizes,
    ROWS: tl.constexpr,
    BN_A: tl.constexpr,
    BN_O: tl.constexpr,
    BN_F: tl.constexpr,
    BN_P: tl.constexpr,
    BN_H: tl.constexpr,
    HEAD_C: tl.constexpr,
    TAIL_C: tl.constexpr,
    HEAD_F: tl.constexpr,
    TAIL_F: tl.constexpr,
    STATS_COLS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ATT_PREFETCH: tl.constexpr,
    L2_AHEAD: tl.constexpr,
    Stamps,
):
    """ends = (Ids, Positions, Wte, Wpe, ln_f = (w, b, eps), LmHead): the embedding's inputs and the head's
    weights; layers = (Offsets, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj) with each tensor layer 0's (a norm
    (w, b), a projection (W (out, in), bias)) and Offsets (L, 12) the element offset of layer l's from layer
    0's, in that order; cache = (KC, VC, Lengths, NextLengths, HEAD_DIM, k_strides, v_strides), the caches
    (L, B, H, T, D) and their five strides; partial = (Part, Counters, splits) or None with one split;
    attention = (keys per split, splits, scale); scratch = (X, QKV, Attn, X1, Hid, Logits): X (L + 1, M, C)
    the embedding's output and each layer's, the others (L, M, width) each layer's own (no address is written
    twice in a launch: a program's L1 may still hold what it read there before), Logits (M, V); deps = (Deps,
    Heads, HeadNeeds, Status): the stage counters, the (layer, head) counters, each head's tiles of c_attn, the
    status word; sizes = (M rows, C width, H heads, L layers, V vocabulary,
    eps, limit, reset: 1 to set the counters back to 0 at the end)."""
    stamps.begin(Stamps)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    Ids, Positions, Wte, Wpe, ln_f, LmHead = ends
    Offsets, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj = layers
    KC, VC, Lengths, NextLengths, HEAD_DIM, ks, vs = cache
    CHUNK, SPLITS, qk_scale = attention
    X, QKV, Attn, X1, Hid, Logits = scratch
    Deps, Heads, HeadNeeds, Status = deps
    M, C, H, L, V, eps, limit, reset = sizes
    F = 4 * C
    n_embed = tl.cdiv(C, BN_O)  # the embedding's tasks: tiles of C columns, as c_proj's
    g = _embed(pid, P, Ids, Positions, Wte, Wpe, X, M, C, Deps, ROWS=ROWS, BN=BN_O)
    rows_c = M * C
    ready = (Deps, n_embed)  # the counter and count the layer's first tasks wait for
    per_layer = tl.cdiv(3 * C, BN_A) + M * H * SPLITS + tl.cdiv(C, BN_O) + tl.cdiv(F, BN_F) + tl.cdiv(C, BN_P)
    for layer in range(L):
        row = Offsets + layer * 12  # LAYER_PARTS
        at = tl.load(row + tl.arange(0, 16), mask=tl.arange(0, 16) < 12, other=0)
        lw1, lb1, wa, ba, wo, bo, lw2, lb2, wf, bf, wp, bp = _twelve(at)
        if L2_AHEAD:  # the next layer's weight slices of this program's tasks, requested into L2 a layer early
            if layer + 1 < L:
                nxt = tl.load(row + 12 + tl.arange(0, 16), mask=tl.arange(0, 16) < 12, other=0)
                _, _, na, _, no, _, _, _, nf, _, np_, _ = _twelve(nxt)
                at_a = g + per_layer
                at_o = at_a + tl.cdiv(3 * C, BN_A) + M * H * SPLITS
                _prefetch(c_attn[0] + na, 3 * C, C, at_a, pid, P, BN=BN_A)
                _prefetch(c_proj[0] + no, C, C, at_o, pid, P, BN=BN_O)
                _prefetch(c_fc[0] + nf, F, C, at_o + tl.cdiv(C, BN_O), pid, P, BN=BN_F)
                _prefetch(mlp_proj[0] + np_, C, F, at_o + tl.cdiv(C, BN_O) + tl.cdiv(F, BN_F), pid, P, BN=BN_P)
        counters = Deps + 1 + layer * 4  # STAGES: attention, c_proj, c_fc and mlp.c_proj done
        layer_heads = Heads + layer * H
        k_layer, v_layer = KC + layer * ks[0], VC + layer * vs[0]
        x_in, x_out = X + layer * rows_c, X + (layer + 1) * rows_c
        qkv, attn, x1, hid = (
            QKV + layer * 3 * rows_c,
            Attn + layer * rows_c,
            X1 + layer * rows_c,
            Hid + layer * 4 * rows_c,
        )
        layer_partial = partial
        if partial is not None:  # the partials of this layer's attention, apart from every other layer's
            Part, Counters, splits = partial
            layer_partial = (Part + layer * (M * H * SPLITS * (BLOCK_D + 2)), Counters, splits)
        kv = (k_layer, v_layer, Lengths, HEAD_DIM, C, C, (ks[1], ks[2], ks[3], ks[4]), (vs[1], vs[2], vs[3], vs[4]))
        g = _projection(
            pid,
            P,
            g,
            (c_attn[0] + wa, c_attn[1] + ba),
            (x_in, C, 1),
            (ln_1[0] + lw1, ln_1[1] + lb1, eps),
            ((qkv, 3 * C), None, None, kv, None),
            (M, 3 * C, C),
            ready,
            (Status, layer * 8 + 1, limit),
            (layer_heads, C, HEAD_DIM),
            EPILOGUE=store_linear,
            ARRIVE=_arrive_heads,
            ROWS=ROWS,
            BN=BN_A,
            HEAD_K=HEAD_C,
            TAIL_K=TAIL_C,
            STATS_COLS=STATS_COLS,
        )
        keys = (k_layer, ks[1], ks[2], ks[3], ks[4])
        values = (v_layer, vs[1], vs[2], vs[3], vs[4])
        n_items = M * H * SPLITS
        for item in range(_first(pid, P, g), n_items, P):
            bh, split = tl.cast(item // SPLITS, tl.int64), item % SPLITS
            early = early_rows(
                keys, values, NextLengths, bh, split, H, CHUNK, HEAD_DIM, BLOCK_N, BLOCK_D, PREFETCH=ATT_PREFETCH
            )
            h = bh % H
            need = tl.load(HeadNeeds + h)
            barrier.wait_count(layer_heads + h, need, Status, layer * 8 + 2, limit)
            attend_item(
                bh,
                split,
                M * H,
                (qkv, 3 * C, HEAD_DIM, 1),
                keys,
                values,
                (attn, C, HEAD_DIM, 1),
                early,
                layer_partial,
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
            barrier.arrive(counters, 0)
        g += n_items
        g = _projection(
            pid,
            P,
            g,
            (c_proj[0] + wo, c_proj[1] + bo),
            (attn, C, 1),
            None,
            ((x1, C), None, (x_in, C), None, None),
            (M, C, C),
            (counters, n_items),
            (Status, layer * 8 + 3, limit),
            (counters + 1, 0, 0),
            EPILOGUE=store_linear,
            ARRIVE=_arrive_count,
            ROWS=ROWS,
            BN=BN_O,
            HEAD_K=HEAD_C,
            TAIL_K=TAIL_C,
            STATS_COLS=STATS_COLS,
        )
        g = _projection(
            pid,
            P,
            g,
            (c_fc[0] + wf, c_fc[1] + bf),
            (x1, C, 1),
            (ln_2[0] + lw2, ln_2[1] + lb2, eps),
            ((hid, F), None, None, None, None),
            (M, F, C),
            (counters + 1, tl.cdiv(C, BN_O)),
            (Status, layer * 8 + 4, limit),
            (counters + 2, 0, 0),
            EPILOGUE=store_gelu,
            ARRIVE=_arrive_count,
            ROWS=ROWS,
            BN=BN_F,
            HEAD_K=HEAD_C,
            TAIL_K=TAIL_C,
            STATS_COLS=STATS_COLS,
        )
        g = _projection(
            pid,
            P,
            g,
            (mlp_proj[0] + wp, mlp_proj[1] + bp),
            (hid, F, 1),
            None,
            ((x_out, C), None, (x1, C), None, None),
            (M, C, F),
            (counters + 2, tl.cdiv(F, BN_F)),
            (Status, layer * 8 + 5, limit),
            (counters + 3, 0, 0),
            EPILOGUE=store_linear,
            ARRIVE=_arrive_count,
            ROWS=ROWS,
            BN=BN_P,
            HEAD_K=HEAD_F,
            TAIL_K=TAIL_F,
            STATS_COLS=STATS_COLS,
        )
        ready = (counters + 3, tl.cdiv(C, BN_P))
    g = _projection(
        pid,
        P,
        g,
        (LmHead, LmHead),  # no bias: the epilogue below is handed none
        (X + L * rows_c, C, 1),
        ln_f,
        ((Logits, V), None, None, None, None),
        (M, V, C),
        ready,
        (Status, L * 8 + 6, limit),
        (Deps, 0, 0),
        EPILOGUE=_store_logits,
        ARRIVE=_arrive_none,
        ROWS=ROWS,
        BN=BN_H,
        HEAD_K=HEAD_C,
        TAIL_K=TAIL_C,
        STATS_COLS=STATS_COLS,
    )
    _finish(Deps, Heads, 1 + L * 4, L * H, P, reset)
    stamps.end(Stamps)


@triton.jit
def _twelve(at):
    """The twelve offsets of a layer's row, each a scalar."""
    idx = tl.arange(0, 16)
    a = tl.sum(tl.where(idx == 0, at, 0), axis=0)
    b = tl.sum(tl.where(idx == 1, at, 0), axis=0)
    c = tl.sum(tl.where(idx == 2, at, 0), axis=0)
    d = tl.sum(tl.where(idx == 3, at, 0), axis=0)
    e = tl.sum(tl.where(idx == 4, at, 0), axis=0)
    f = tl.sum(tl.where(idx == 5, at, 0), axis=0)
    g = tl.sum(tl.where(idx == 6, at, 0), axis=0)
    h = tl.sum(tl.where(idx == 7, at, 0), axis=0)
    i = tl.sum(tl.where(idx == 8, at, 0), axis=0)
    j = tl.sum(tl.where(idx == 9, at, 0), axis=0)
    k = tl.sum(tl.where(idx == 10, at, 0), axis=0)
    m = tl.sum(tl.where(idx == 11, at, 0), axis=0)
    return a, b, c, d, e, f, g, h, i, j, k, m


@triton.jit
def _prefetch(W, N, K, g, pid, P, BN: tl.constexpr):
    """Ask L2 for the weight slices (W (N, K), rows of BN) of a projection's tasks that program pid will run, those
    from task g on: one prefetch per 128-byte line, nothing waited for."""
    LINE: tl.constexpr = 1024 // W.dtype.element_ty.primitive_bitwidth  # elements in 128 bytes
    lanes = tl.arange(0, 256)
    for t in range(_first(pid, P, g), tl.cdiv(N, BN), P):
        base = W + tl.cast(t, tl.int64) * BN * K
        elements = tl.minimum(BN, N - t * BN) * K
        for start in range(0, elements, 256 * LINE):
            at = start + lanes * LINE
            lines = tl.where(at < elements, base + at, base)
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [lines], dtype=tl.int32, is_pure=False, pack=1
            )


@triton.jit
def _first(pid, P, g):
    """The first item of an operation whose tasks start at task g of the list that program pid runs (task g + i
    runs on program (g + i) mod P)."""
    return (pid - g % P + P) % P


@triton.jit
def _embed(pid, P, Ids, Positions, Wte, Wpe, X, M, C, Deps, ROWS: tl.constexpr, BN: tl.constexpr):
    """The embedding's tasks (column tiles of x = wte[ids] + wpe[positions], as kernels.elementwise.embedding
    adds them); each arrives at Deps[0]. Returns the next task's index."""
    rows = tl.arange(0, ROWS)
    row_mask = rows < M
    ids = tl.load(Ids + rows, mask=row_mask, other=0).to(tl.int64)
    pos = tl.load(Positions + rows, mask=row_mask, other=0).to(tl.int64)
    n = tl.cdiv(C, BN)
    for t in range(_first(pid, P, 0), n, P):
        cols = t * BN + tl.arange(0, BN)
        mask = row_mask[:, None] & (cols < C)[None, :]
        tok = tl.load(Wte + ids[:, None] * C + cols[None, :], mask=mask, other=0.0)
        where = tl.load(Wpe + pos[:, None] * C + cols[None, :], mask=mask, other=0.0)
        tl.store(X + rows[:, None] * C + cols[None, :], tok + where, mask=mask)
        barrier.arrive(Deps, 0)
    return n


@triton.jit
def _projection(
    pid,
    P,
    g,
    linear,
    x,
    norm,
    out,
    shape,
    ready,
    fault,
    done,
    EPILOGUE: tl.constexpr,
    ARRIVE: tl.constexpr,
    ROWS: tl.constexpr,
    BN: tl.constexpr,
    HEAD_K: tl.constexpr,
    TAIL_K: tl.constexpr,
    STATS_COLS: tl.constexpr,
):
    """A projection's tasks from task g on, those of program pid: the column tiles of linear = (W (N, K), bias),
    each one's weight slice loaded before it waits for ready = (counter, count), what its input's tasks count
    there; fault = (Status, code, limit) for a wait that fails. x, norm and out as kernels.ops.decode_linear.items
    takes them (the bias is linear's), shape = (M, N, K); ARRIVE(done, tile, BN) marks each task done. Returns
    the next operation's first task."""
    W, Bias = linear
    M, N, K = shape
    Counter, count = ready
    Status, code, limit = fault
    y, _, res, kv, rope = out
    n = tl.cdiv(N, BN)
    first = _first(pid, P, g)
    for t in range(first, n, P):
        w_slice = load_slice(
            t, 0, (W, K, 1), N, K, K, rope=None, BLOCK_N=BN, HEAD_K=HEAD_K, TAIL_K=TAIL_K, SWIGLU=False
        )
        if t == first:  # the input is whole once: later tiles of this program find the count met
            barrier.wait_count(Counter, count, Status, code, limit)
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
            out=(y, Bias, res, kv, rope),
            M=M,
            N=N,
            EPILOGUE=EPILOGUE,
            BLOCK_M=ROWS,
            BLOCK_N=BN,
        )
        ARRIVE(done, t, BN)
    return g + n


@triton.jit
def _store_logits(acc, rows, cols, pid_n, out, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The LM head's epilogue: the logits as they are (no bias)."""
    y, _, _, _, _ = out
    Y, stride_ym = y
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _arrive_count(done, t, BN: tl.constexpr):
    """One more task of the operation done, at done = (counter, _, _)."""
    Counter, _, _ = done
    barrier.arrive(Counter, 0)


@triton.jit
def _arrive_heads(done, t, BN: tl.constexpr):
    """A c_attn tile done: one arrival at the counter of each head whose q, k or v columns it holds (each run of
    its columns within one head of one section), done = (the layer's head counters, C, head_dim). Scalar
    atomics, one per run: each is one thread's, whatever the layout of a tile's columns."""
    Heads, C, D = done
    lo = t * BN
    hi = tl.minimum(lo + BN, 3 * C)
    tl.debug_barrier()  # every thread's stores of the tile come before the releases
    for section in range(lo // C, (hi - 1) // C + 1):
        start = tl.maximum(lo, section * C) - section * C
        end = tl.minimum(hi, section * C + C) - section * C
        for h in range(start // D, (end - 1) // D + 1):
            tl.atomic_add(Heads + h, 1, sem="release", scope="gpu")


@triton.jit
def _arrive_none(done, t, BN: tl.constexpr):
    """The last operation: nothing waits for it but the end of the launch."""
    pass


@triton.jit
def _finish(Deps, Heads, STAGE_COUNT, HEAD_COUNT, P, reset):
    """Arrive at the last stage counter (Deps[STAGE_COUNT]); the last program to arrive sets the stage and head
    counters back to 0 (unless `reset` is 0): by then no program waits on any, and the next step finds zeros."""
    tl.debug_barrier()
    if (tl.atomic_add(Deps + STAGE_COUNT, 1, sem="acq_rel", scope="gpu") == P - 1) & (reset != 0):
        for start in range(0, STAGE_COUNT + 1, 256):
            idx = start + tl.arange(0, 256)
            tl.store(Deps + idx, 0, mask=idx <= STAGE_COUNT)
        for start in range(0, HEAD_COUNT, 256):
            idx = start + tl.arange(0, 256)
            tl.store(Heads + idx, 0, mask=idx < HEAD_COUNT)


class Variant(NamedTuple):
    """What a launch may vary, for comparing them (experiments/one_launch_sweep.py): whether each program asks L2
    for its next layer's weight slices a layer ahead (a GPU's; the interpreter has no prefetch)."""

    l2_ahead: bool = False


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
    attention: object  # decode attention's TileConfig
    chunk: int
    splits: int
    scale: float
    constexprs: dict


def head_needs(width: int, head_dim: int, block_n: int) -> list[int]:
    """Each head's count at its counter once c_attn is done: the runs of one tile's columns within one head of q,
    k or v (as _arrive_heads counts them)."""
    needs = [0] * (width // head_dim)
    for t in range(cdiv(3 * width, block_n)):
        for c in range(t * block_n, min((t + 1) * block_n, 3 * width)):
            if c == t * block_n or (c % width) % head_dim == 0:
                needs[(c % width) // head_dim] += 1
    return needs


@functools.lru_cache(maxsize=64)
def plan(rows: int, width: int, heads: int, vocab: int, max_len: int, dtype, device) -> Plan:
    """Programs, tiles and the attention split of a launch: at most one program per SM (the launch holds that
    to the compiled kernel), about one task per program in each operation, each task's weights within what a
    program holds in registers."""
    limits = device_limits(device)
    count = 1 if limits.is_cpu else limits.num_sms
    elements = CPU_ELEMENTS if limits.is_cpu else ELEMENTS
    shapes = {
        "BN_A": (3 * width, width),
        "BN_O": (width, width),
        "BN_F": (4 * width, width),
        "BN_P": (width, 4 * width),
    }
    tiles = {name: column_tile(out_f, in_f, count, elements) for name, (out_f, in_f) in shapes.items()}
    tiles["BN_H"] = column_tile(vocab, width, count, elements)
    split = None
    if not limits.is_cpu:
        split_k = prev_pow2(max(1, count // (rows * heads)))
        block_n = min(128, max(16, next_pow2(cdiv(max_len, split_k))))
        split = TileConfig(block_n=block_n, split_k=split_k, num_warps=WARPS, num_stages=1)
    cfg, chunk, splits, block_d, block_s, prefetch, _, scale, _ = attention_plan(
        split, rows * heads, max_len, width // heads, dtype, device
    )
    (head_c, tail_c), (head_f, tail_f) = slice_tiles(width), slice_tiles(4 * width)
    constexprs = dict(
        ROWS=next_pow2(rows),
        **tiles,
        HEAD_C=head_c,
        TAIL_C=tail_c,
        HEAD_F=head_f,
        TAIL_F=tail_f,
        STATS_COLS=next_pow2(width),
        BLOCK_N=cfg.block_n,
        BLOCK_S=block_s,
        BLOCK_D=block_d,
        ATT_PREFETCH=prefetch,
        L2_AHEAD=_variant.l2_ahead and not limits.is_cpu,
    )
    outputs = {**{n: out_f for n, (out_f, _) in shapes.items()}, "BN_H": vocab}
    items = max(rows * heads * splits, *(cdiv(out_f, tiles[n]) for n, out_f in outputs.items()))
    programs = 1 if limits.is_cpu else max(1, min(count, items))
    return Plan(programs, tiles, cfg, chunk, splits, scale, constexprs)


class Step(NamedTuple):
    """A model's parameters as the launch takes them (layer_offsets makes the offsets)."""

    wte: torch.Tensor
    wpe: torch.Tensor
    layers: tuple  # per layer: ((ln_1 w, b), (c_attn W, b), (c_proj W, b), (ln_2 w, b), (c_fc W, b), (mlp.c_proj W, b))
    ln_f: tuple  # (w, b)
    lm_head: torch.Tensor


_offsets: dict = {}


def layer_offsets(layers) -> torch.Tensor:
    """(L, 12) int64 on the layers' device: the element offset of each layer's tensor from layer 0's, made once
    per set of tensors (before any CUDA graph captures a step: the decoder runs a step eagerly first)."""
    flat = [[t for pair in layer for t in pair] for layer in layers]
    key = tuple(t.data_ptr() for row in flat for t in row)
    got = _offsets.get(key)
    if got is None:
        first = flat[0]
        rows = []
        for row in flat:
            offsets = []
            for t, base in zip(row, first, strict=True):
                gap = t.data_ptr() - base.data_ptr()
                if gap % t.element_size():
                    raise ValueError(f"{NAME}: layer tensors must be aligned to their element size")
                offsets.append(gap // t.element_size())
            rows.append(offsets)
        got = _offsets[key] = torch.tensor(rows, dtype=torch.int64, device=first[0].device)
        while len(_offsets) > 8:
            del _offsets[next(iter(_offsets))]
    return got


_status: dict = {}


def _device_key(device) -> torch.device:
    """torch.device("cuda") and torch.device("cuda", 0) are one GPU: key the status words by the index."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _status_word(device) -> torch.Tensor:
    device = _device_key(device)
    word = _status.get(device)
    if word is None:
        word = _status[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return word


def check(device) -> None:
    """Raise if a wait of the last steps on `device` gave up (and clear the record): their outputs are wrong."""
    word = _status.get(_device_key(device))
    if word is None:
        return
    code = int(word.item())
    if code:
        word.zero_()
        layer, wait = divmod(code, 8)
        names = {
            1: "c_attn's input",
            2: "its head's q, k and v",
            3: "attention",
            4: "c_proj",
            5: "c_fc",
            6: "the layers",
        }
        where = "ln_f + lm_head" if wait == 6 else f"layer {layer}"
        raise RuntimeError(
            f"{NAME}: a task of {where} waited for {names.get(wait, '?')} past its bound of polls (the first wait to "
            "give up; the waits downstream of a fault give up too) and the "
            "step's output is wrong: a program that never started, or a counter left set by a failed step"
        )


def decode_step(ids, step: Step, kv, eps=1e-5, *, limit: int = LIMIT, head_needs_extra: int = 0, keep: bool = False):
    """One GPT-2 decode step in one launch: ids (B,) the new tokens, step the model's parameters, kv = (k_cache,
    v_cache, lengths, next_lengths) with caches (L, B, H, T_max, D): each token goes in at position lengths[b]
    and attends over next_lengths[b] = lengths[b] + 1 keys. Returns the logits (B, vocab).

    limit: polls before a wait gives up; head_needs_extra: added to head 0's count; keep: leave the counters as
    the step ends (counts), for counts() to read (the last three for tests alone: a kept count hangs the next
    step until its bound).
    Inside kernels.launch.stamping() every program stamps its start, end and SM."""
    rows = _check(ids, step, kv)
    k_cache, v_cache, lengths, next_lengths = kv
    ids = ids.contiguous()  # a column of a batch of prompts is a strided view
    n_layer, _, heads, max_len, head_dim = k_cache.shape
    width = step.wte.shape[1]
    vocab = step.lm_head.shape[0]
    like = step.wte
    logits = new_output(like, (rows, vocab))
    device = like.device
    p = plan(rows, width, heads, vocab, max_len, like.dtype, device)
    scratch = tuple(new_output(like, (n, rows, w)) for n, w in ((n_layer + 1, width), (n_layer, 3 * width)))
    scratch += tuple(new_output(like, (n_layer, rows, w)) for w in (width, width, 4 * width)) + (logits,)
    needs = head_needs(width, head_dim, p.tiles["BN_A"])
    needs[0] += head_needs_extra
    head_count = torch.tensor(needs, dtype=torch.int32).to(device) if device.type == "cpu" else _needs(device, needs)
    partial = None
    if p.splits > 1:
        part = new_output(like, (n_layer, rows * heads * p.splits * (p.constexprs["BLOCK_D"] + 2)), torch.float32)
        partial = (part, arrival.counters(device, rows * heads), p.splits)
    stage_count = 2 + n_layer * STAGES
    offsets = layer_offsets(step.layers)
    first = step.layers[0]
    args = (
        (ids, lengths, step.wte, step.wpe, (*step.ln_f, float(eps)), step.lm_head),
        (offsets, *first),
        (k_cache, v_cache, lengths, next_lengths, head_dim, k_cache.stride(), v_cache.stride()),
        partial,
        (p.chunk, p.splits, p.scale),
        scratch,
        (
            arrival.task_counters(device, stage_count),
            arrival.head_counters(device, n_layer * heads),
            head_count,
            _status_word(device),
        ),
        (rows, width, heads, n_layer, vocab, float(eps), limit, 0 if keep else 1),
    )
    kwargs = dict(**p.constexprs, num_warps=WARPS, num_stages=1)
    _check_resident(args, kwargs, p.programs, device)
    launch.plain(_decode_step_kernel)[(p.programs,)](*args, **kwargs)  # Stamps: handed by the launcher
    return logits


_need_tables: dict = {}


def _needs(device, needs: list[int]) -> torch.Tensor:
    """The heads' counts as a device tensor, made once per list (a launch in a CUDA graph reads it every replay)."""
    key = (device, tuple(needs))
    got = _need_tables.get(key)
    if got is None:
        got = _need_tables[key] = torch.tensor(needs, dtype=torch.int32, device=device)
    return got


def counts(rows: int, width: int, heads: int, layers: int, vocab: int, max_len: int, dtype, device) -> tuple:
    """What each counter holds at the end of a step, before the reset: (stage counters, head counters), as lists:
    the embedding's tasks; per layer attention's items, then c_proj's, c_fc's and mlp.c_proj's tasks; the
    programs at the end; and each (layer, head)'s runs of c_attn tiles."""
    p = plan(rows, width, heads, vocab, max_len, dtype, device)
    t = p.tiles
    per_layer = [rows * heads * p.splits, cdiv(width, t["BN_O"]), cdiv(4 * width, t["BN_F"]), cdiv(width, t["BN_P"])]
    stages = [cdiv(width, t["BN_O"]), *per_layer * layers, p.programs]
    return stages, head_needs(width, width // heads, t["BN_A"]) * layers


def fits(programs: int, resident: int, sms: int) -> None:
    """Refuse a launch whose programs could not all be resident at once (a waiting program would hold an SM a
    program it waits for needs): resident programs per SM, from the compiled kernel."""
    if programs > resident * sms:
        raise RuntimeError(
            f"{NAME}: {programs} programs, but the compiled kernel fits {resident} per SM on {sms} SMs; its tasks "
            "wait for each other, so every program must be resident at once"
        )


_resident_checked: set = set()


def _check_resident(args: tuple, kwargs: dict, programs: int, device) -> None:
    """On a GPU, once per specialisation: compile the launch (without running it) and hold its programs to the
    count the driver says one SM holds of it (kernels.occupancy.driver_resident)."""
    if device.type != "cuda":
        return
    key = (device, programs, tuple(sorted(kwargs.items())))
    if key in _resident_checked:
        return
    from ...occupancy import driver_resident

    compiled = _decode_step_kernel.warmup(*args, grid=(programs,), Stamps=None, **kwargs)
    fits(programs, driver_resident(compiled), device_limits(device).num_sms)
    _resident_checked.add(key)


def _check(ids, step: Step, kv) -> int:
    """Validate before the launch; returns the rows (sequences)."""
    if not isinstance(kv, tuple | list) or len(kv) != 4:
        raise ValueError(f"{NAME}: kv must be (k_cache, v_cache, lengths, next_lengths)")
    k_cache, v_cache, lengths, next_lengths = kv
    if ids.dim() != 1 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{NAME}: ids must be a (B,) int32 or int64 tensor, got {tuple(ids.shape)} {ids.dtype}")
    rows = ids.shape[0]
    if not 1 <= rows <= DECODE_ROWS:
        raise ValueError(f"{NAME}: 1 to {DECODE_ROWS} sequences per launch, got {rows}")
    if k_cache.dim() != 5 or k_cache.shape != v_cache.shape or k_cache.shape[0] != len(step.layers):
        raise ValueError(
            f"{NAME}: caches must be (layers, B, H, T, D) with one layer per block, got {tuple(k_cache.shape)}"
        )
    width = step.wte.shape[1]
    if k_cache.shape[1] != rows or k_cache.shape[2] * k_cache.shape[4] != width:
        raise ValueError(
            f"{NAME}: caches {tuple(k_cache.shape)} do not hold {rows} sequences of H heads of {width} / H"
        )
    first = [t for pair in step.layers[0] for t in pair]
    for i, layer in enumerate(step.layers):
        for t, like in zip((t for pair in layer for t in pair), first, strict=True):
            if t.shape != like.shape or not t.is_contiguous() or t.dtype != step.wte.dtype or t.device != ids.device:
                raise ValueError(
                    f"{NAME}: layer {i}'s tensors must be contiguous, shaped as layer 0's and of the embedding's "
                    f"dtype and device ({step.wte.dtype} on {ids.device})"
                )
    for t in (step.wte, step.wpe, step.lm_head, *step.ln_f):
        if not t.is_contiguous() or t.dtype != step.wte.dtype or t.device != ids.device:
            raise ValueError(
                f"{NAME}: the embeddings, ln_f and the LM head must be contiguous {step.wte.dtype} on {ids.device}"
            )
    for t in (lengths, next_lengths):
        if t.shape != (rows,) or t.dtype not in (torch.int32, torch.int64) or t.device != ids.device:
            raise ValueError(f"{NAME}: lengths must be ({rows},) int32 or int64 tensors on {ids.device}")
    return rows


def traffic(lengths, width, heads, max_len, layers, vocab, itemsize, *, dtype=torch.float16, device="cpu") -> Traffic:
    """Modeled traffic of one launch: the embedding's gathers, each layer's five operations as the decode rung's
    kernels move them at this launch's tiles (decode_linear's and decode attention's models), the LM head, and one
    sector each way for every arrival at a counter (each task's, the heads' from each c_attn tile, the end's).
    The polls of a waiting program are not modeled: they depend on how long it waits."""
    from ..decode_attention.kernel import decode_traffic
    from ..decode_linear.tiles import PREFETCH_BLOCK_K
    from ..decode_linear.tiles import traffic as linear_traffic

    rows = len(lengths)
    p = plan(rows, width, heads, vocab, max_len, dtype, device)
    on = dict(dtype=dtype, device=device)

    def tiles(block_n, in_features):
        block_k = max(PREFETCH_BLOCK_K, next_pow2(in_features))
        return TileConfig(block_m=16, block_n=block_n, block_k=block_k, split_k=1, num_warps=WARPS, num_stages=1)

    t = p.tiles
    n = rows * width
    embed = Traffic(2 * n * itemsize, n * itemsize, n, 3 * n * itemsize)
    layer = [
        linear_traffic(rows, 3 * width, width, itemsize, norm=True, kv=heads, config=tiles(t["BN_A"], width), **on),
        decode_traffic(
            list(lengths), heads, max_len, width // heads, itemsize, config=p.attention, one_launch=True, **on
        ),
        linear_traffic(rows, width, width, itemsize, residual=True, config=tiles(t["BN_O"], width), **on),
        linear_traffic(
            rows, 4 * width, width, itemsize, norm=True, activation="gelu", config=tiles(t["BN_F"], width), **on
        ),
        linear_traffic(rows, width, 4 * width, itemsize, residual=True, config=tiles(t["BN_P"], 4 * width), **on),
    ]
    lm_head = linear_traffic(rows, vocab, width, itemsize, bias=False, norm=True, config=tiles(t["BN_H"], width), **on)
    heads_arrivals = sum(head_needs(width, width // heads, t["BN_A"]))
    tasks = [cdiv(3 * width, t["BN_A"]), rows * heads * p.splits, cdiv(width, t["BN_O"])]
    tasks += [cdiv(4 * width, t["BN_F"]), cdiv(width, t["BN_P"])]
    arrivals = cdiv(width, t["BN_O"]) + layers * (heads_arrivals + sum(tasks[1:])) + p.programs
    total = sum(layer * layers, embed + lm_head)  # every layer moves the same bytes
    return total + Traffic(arrivals * SECTOR, arrivals * SECTOR, 0, 0, 0, 0)
