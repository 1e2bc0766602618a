"""A whole decode step in one launch, GPT-2's or a Llama's: the megakernel rung of the fusion ladder.

Every operation of the step is a list of tasks, each one tile of one operation's output, in the order the
step computes them (each task depends only on tasks before it):

    embedding                       column tiles of x = wte[ids] (+ wpe[positions], GPT-2)
    per layer:  norm + c_attn + KV  column tiles of c_attn (a Llama's q and k turned by rotary positions), the new
                                    K and V rows written to the cache
                attention           (sequence, key/value head, split) items, the last split of each pair merging
                c_proj + residual   column tiles of attn.c_proj
                norm + c_fc         column tiles of mlp.c_fc, with GELU (GPT-2) or SwiGLU (a Llama)
                c_proj + residual   column tiles of mlp.c_proj
    norm + lm_head                  column tiles of the logits

Task g runs on program g mod P, so each program takes its tasks in list order, and a program waiting for a
task only waits for tasks earlier in the list: the one unfinished task earliest in the list always has its
inputs, so with every program resident at once the step cannot deadlock. The launch starts at most as many
programs as the GPU holds at once, counted from the compiled kernel (kernels.occupancy), never assumed.

A task waits only for what it reads, at counters in device memory (kernels.barrier.wait_count), not for every
program: an attention item for the tiles of c_attn that hold its query heads' q and its key/value head's k and v
(a counter per layer and key/value head), every other task for all tasks of the operation before it (a norm
needs whole rows, a projection all of its input's columns). Before it waits, a projection task has loaded its
weight slice (weights depend on nothing), and an attention item the cache rows of earlier steps; only the
activations wait.

Each wait is bounded: past `limit` polls the program records which wait gave up first in a status word and
carries on, so a fault becomes an error the host reads after the step (check), never a hang. The last program
to finish sets every counter back to 0 for the next step.

The interpreter runs a grid's programs one after another, where a program spinning for another would wait
forever: there the launch is one program, which runs the same task list in its order, each wait already met.
The arithmetic is the decode rung's, tile by tile (the same device functions).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ... import arrival, barrier, launch, stamps
from ...config import device_limits, new_output
from ..decode_attention.kernel import attend_item, early_rows
from ..decode_linear.items import finish, load_slice, slice_times, store_gelu, store_linear, store_swiglu
from ..grouped_decode_attention.kernel import group_early, group_item
from ..linear.kernel import DECODE_ROWS
from .tiles import STAGES, Shape, head_needs, plan, tasks

NAME = "decode_step"
LIMIT = 1 << 20  # polls before a wait gives up: under a second on a GPU, a thousand steps' worth


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
    TILES: tl.constexpr,
    ATT: tl.constexpr,
    LLAMA: tl.constexpr,
    Trace,
    Stamps,
):
    """ends = (Ids, Positions, Wte, Wpe, LnW, LnB, LmHead): the embedding's inputs, the last norm and the LM head
    (a Llama's Wpe and LnB unread); layers = (Offsets, layer 0's tensors): GPT-2's ln_1 w and b, c_attn W and b,
    c_proj W and b, ln_2 w and b, c_fc W and b, mlp.c_proj W and b; a Llama's ln_1 w, c_attn W, c_proj W, ln_2 w,
    c_fc W (gate over up), mlp.c_proj W; Offsets (L, 12 or 6) the element offset of layer l's from layer 0's, in
    that order; cache = (KC, VC, Lengths, NextLengths, k_strides, v_strides), the caches (L, B, KV, T, D) and their
    five strides; partial = (Part, Counters, splits) or None with one split; attention = (keys per split, splits,
    scale, the cache's positions, log2 of rotary's theta); scratch = (X, QKV, Attn, X1, Hid, Logits, strides): X
    the embedding's output and each layer's (L + 1 regions), the others each layer's own (L regions of M rows of
    its width), strides = (X's, Attn's and X1's too, QKV's, Hid's, the partials') the elements from one layer's
    region to the next, each region on lines of its own (region_stride), Logits (M, V). No address is written
    twice in a launch and no line holds two layers' rows: a program's L1 may still hold what it read before;
    deps = (Deps, Heads, HeadNeeds, Status): the stage counters, the (layer, key/value head) counters, each key/value
    head's count of c_attn's tiles, the status word; sizes = (M rows, C width, H heads, KV key/value heads, FF the
    hidden width, L layers, V vocabulary, eps, limit, reset: 1 to set the counters back to 0 at the end). TILES and
    ATT: tiles.plan's constexprs. Trace: None, or (tasks, 3) int64 that each task stamps on the global timer (ns)
    as it starts, once its inputs are ready and once it has arrived (tiles.tasks lists them in order)."""
    ROWS: tl.constexpr = TILES[0]
    BN_A: tl.constexpr = TILES[1]
    BN_O: tl.constexpr = TILES[2]
    BN_F: tl.constexpr = TILES[3]
    BN_P: tl.constexpr = TILES[4]
    BN_H: tl.constexpr = TILES[5]
    HEAD_C: tl.constexpr = TILES[6]
    TAIL_C: tl.constexpr = TILES[7]
    HEAD_F: tl.constexpr = TILES[8]
    TAIL_F: tl.constexpr = TILES[9]
    STATS_COLS: tl.constexpr = TILES[10]
    L2_AHEAD: tl.constexpr = TILES[11]
    DOT: tl.constexpr = TILES[12]
    PARTS: tl.constexpr = 6 if LLAMA else 12
    stamps.begin(Stamps)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    Ids, Positions, Wte, Wpe, LnW, LnB, LmHead = ends
    KC, VC, Lengths, NextLengths, ks, vs = cache
    CHUNK, SPLITS, qk_scale, positions, log2_theta = attention
    X, QKV, Attn, X1, Hid, Logits, strides = scratch
    S_X, S_QKV, S_HID, S_PART = strides
    Deps, Heads, HeadNeeds, Status = deps
    M, C, H, KV, FF, L, V, eps, limit, reset = sizes
    D = C // H
    QN = (H + 2 * KV) * D  # c_attn's columns
    FN = 2 * FF if LLAMA else FF  # c_fc's weight rows
    g = _embed(pid, P, Ids, Positions, Wte, Wpe, X, M, C, Deps, Trace, ROWS=ROWS, BN=BN_O, ADD_POSITIONS=not LLAMA)
    ready = (Deps, tl.cdiv(C, BN_O))  # the counter and count the layer's first tasks wait for
    n_items = M * KV * SPLITS
    per_layer = tl.cdiv(QN, BN_A) + n_items + tl.cdiv(C, BN_O) + tl.cdiv(FN, BN_F) + tl.cdiv(C, BN_P)
    for layer in range(L):
        w = _layer_weights(layers, layer, eps, LLAMA=LLAMA, PARTS=PARTS)
        norm_1, c_attn, c_proj, norm_2, c_fc, mlp_proj = w
        if L2_AHEAD:  # the next layer's weight slices of this program's tasks, requested into L2 a layer early
            if layer + 1 < L:
                _, na, no, _, nf, np_ = _layer_weights(layers, layer + 1, eps, LLAMA=LLAMA, PARTS=PARTS)
                at_a = g + per_layer
                at_o = at_a + tl.cdiv(QN, BN_A) + n_items
                _prefetch(na[0], QN, C, at_a, pid, P, BN=BN_A)
                _prefetch(no[0], C, C, at_o, pid, P, BN=BN_O)
                _prefetch(nf[0], FN, C, at_o + tl.cdiv(C, BN_O), pid, P, BN=BN_F)
                _prefetch(np_[0], C, FF, at_o + tl.cdiv(C, BN_O) + tl.cdiv(FN, BN_F), pid, P, BN=BN_P)
        counters = Deps + 1 + layer * 4  # STAGES: attention, c_proj, c_fc and mlp.c_proj done
        layer_heads = Heads + layer * KV
        k_layer, v_layer = KC + layer * ks[0], VC + layer * vs[0]
        x_in, x_out = X + layer * S_X, X + (layer + 1) * S_X
        qkv, attn, x1 = QKV + layer * S_QKV, Attn + layer * S_X, X1 + layer * S_X
        hid = Hid + layer * S_HID
        kv = (k_layer, v_layer, Lengths, D, H * D, KV * D, (ks[1], ks[2], ks[3], ks[4]), (vs[1], vs[2], vs[3], vs[4]))
        # (a variable never holds a None here: Triton cannot carry one through the loop)
        if LLAMA:  # q's and k's columns turned by each row's position
            g = _projection(
                pid,
                P,
                g,
                c_attn,
                (x_in, C, 1),
                norm_1,
                ((qkv, QN), None, None, kv, (log2_theta, (H + KV) * D, D)),
                (M, QN, C),
                ready,
                (Status, layer * 8 + 1, limit),
                (layer_heads, H * D, KV * D, (H // KV) * D, D),
                Trace,
                EPILOGUE=store_linear,
                ARRIVE=_arrive_heads,
                BIAS=False,
                RMS=True,
                SWIGLU=False,
                ROWS=ROWS,
                DOT=DOT,
                BN=BN_A,
                HEAD_K=HEAD_C,
                TAIL_K=TAIL_C,
                STATS_COLS=STATS_COLS,
            )
        else:
            g = _projection(
                pid,
                P,
                g,
                c_attn,
                (x_in, C, 1),
                norm_1,
                ((qkv, QN), None, None, kv, None),
                (M, QN, C),
                ready,
                (Status, layer * 8 + 1, limit),
                (layer_heads, H * D, KV * D, (H // KV) * D, D),
                Trace,
                EPILOGUE=store_linear,
                ARRIVE=_arrive_heads,
                BIAS=True,
                RMS=False,
                SWIGLU=False,
                ROWS=ROWS,
                DOT=DOT,
                BN=BN_A,
                HEAD_K=HEAD_C,
                TAIL_K=TAIL_C,
                STATS_COLS=STATS_COLS,
            )
        keys = (k_layer, ks[1], ks[2], ks[3], ks[4])
        values = (v_layer, vs[1], vs[2], vs[3], vs[4])
        wait = (layer_heads, HeadNeeds, Status, layer * 8 + 2, limit)
        att_sizes = (M, H, KV, CHUNK, positions, qk_scale)
        if partial is not None:  # this layer's partials, apart from every other layer's
            Part, Counters, splits = partial
            layer_partial = (Part + layer * S_PART, Counters, splits)
            _attention(pid, P, g, n_items, SPLITS, (qkv, QN, D, 1), keys, values, (attn, C, D, 1), layer_partial,
                       NextLengths, wait, att_sizes, counters, Trace, ATT=ATT, LLAMA=LLAMA)  # fmt: skip
        else:
            _attention(pid, P, g, n_items, SPLITS, (qkv, QN, D, 1), keys, values, (attn, C, D, 1), None,
                       NextLengths, wait, att_sizes, counters, Trace, ATT=ATT, LLAMA=LLAMA)  # fmt: skip
        g += n_items
        g = _projection(
            pid,
            P,
            g,
            c_proj,
            (attn, C, 1),
            None,
            ((x1, C), None, (x_in, C), None, None),
            (M, C, C),
            (counters, n_items),
            (Status, layer * 8 + 3, limit),
            (counters + 1, 0, 0, 0, 0),
            Trace,
            EPILOGUE=store_linear,
            ARRIVE=_arrive_count,
            BIAS=not LLAMA,
            RMS=LLAMA,
            SWIGLU=False,
            ROWS=ROWS,
            DOT=DOT,
            BN=BN_O,
            HEAD_K=HEAD_C,
            TAIL_K=TAIL_C,
            STATS_COLS=STATS_COLS,
        )
        g = _projection(
            pid,
            P,
            g,
            c_fc,
            (x1, C, 1),
            norm_2,
            ((hid, FF), None, None, None, None),
            (M, FN, C),
            (counters + 1, tl.cdiv(C, BN_O)),
            (Status, layer * 8 + 4, limit),
            (counters + 2, 0, 0, 0, 0),
            Trace,
            EPILOGUE=store_swiglu if LLAMA else store_gelu,
            ARRIVE=_arrive_count,
            BIAS=not LLAMA,
            RMS=LLAMA,
            SWIGLU=LLAMA,
            ROWS=ROWS,
            DOT=DOT,
            BN=BN_F,
            HEAD_K=HEAD_C,
            TAIL_K=TAIL_C,
            STATS_COLS=STATS_COLS,
        )
        g = _projection(
            pid,
            P,
            g,
            mlp_proj,
            (hid, FF, 1),
            None,
            ((x_out, C), None, (x1, C), None, None),
            (M, C, FF),
            (counters + 2, tl.cdiv(FN, BN_F)),
            (Status, layer * 8 + 5, limit),
            (counters + 3, 0, 0, 0, 0),
            Trace,
            EPILOGUE=store_linear,
            ARRIVE=_arrive_count,
            BIAS=not LLAMA,
            RMS=LLAMA,
            SWIGLU=False,
            ROWS=ROWS,
            DOT=DOT,
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
        (LmHead, LmHead),  # no bias (BIAS False)
        (X + L * S_X, C, 1),
        (LnW, LnB, eps),
        ((Logits, V), None, None, None, None),
        (M, V, C),
        ready,
        (Status, L * 8 + 6, limit),
        (Deps, 0, 0, 0, 0),
        Trace,
        EPILOGUE=store_linear,
        ARRIVE=_arrive_none,
        BIAS=False,
        RMS=LLAMA,
        SWIGLU=False,
        ROWS=ROWS,
        DOT=DOT,
        BN=BN_H,
        HEAD_K=HEAD_C,
        TAIL_K=TAIL_C,
        STATS_COLS=STATS_COLS,
    )
    _finish(Deps, Heads, 1 + L * 4, L * KV, P, reset)
    stamps.end(Stamps)


@triton.jit
def _pick(at, i: tl.constexpr):
    """Entry i of a layer's row of offsets, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, 16) == i, at, 0), axis=0)


@triton.jit
def _layer_weights(layers, layer, eps, LLAMA: tl.constexpr, PARTS: tl.constexpr):
    """Layer `layer`'s (norm_1, c_attn, c_proj, norm_2, c_fc, mlp_proj): each norm (w, b, eps), each projection (W,
    bias), from layer 0's tensors and the layer's offsets. A Llama's have no bias: its slot holds the weight again,
    unread (RMSNorm's and, with BIAS False, the projections'), since a device function returns no None."""
    Offsets = layers[0]
    at = tl.load(Offsets + layer * PARTS + tl.arange(0, 16), mask=tl.arange(0, 16) < PARTS, other=0)
    if LLAMA:
        _, lw1, wa, wo, lw2, wf, wp = layers
        n1 = lw1 + _pick(at, 0)
        n2 = lw2 + _pick(at, 3)
        wa, wo, wf, wp = wa + _pick(at, 1), wo + _pick(at, 2), wf + _pick(at, 4), wp + _pick(at, 5)
        return (n1, n1, eps), (wa, wa), (wo, wo), (n2, n2, eps), (wf, wf), (wp, wp)
    else:
        _, lw1, lb1, wa, ba, wo, bo, lw2, lb2, wf, bf, wp, bp = layers
        return (
            (lw1 + _pick(at, 0), lb1 + _pick(at, 1), eps),
            (wa + _pick(at, 2), ba + _pick(at, 3)),
            (wo + _pick(at, 4), bo + _pick(at, 5)),
            (lw2 + _pick(at, 6), lb2 + _pick(at, 7), eps),
            (wf + _pick(at, 8), bf + _pick(at, 9)),
            (wp + _pick(at, 10), bp + _pick(at, 11)),
        )


@triton.jit
def _attention(pid, P, g, n_items, SPLITS, query, keys, values, out, partial, NextLengths, wait, sizes, done, Trace,
               ATT: tl.constexpr, LLAMA: tl.constexpr):  # fmt: skip
    """This program's attention items of a layer, those from task g on, each arriving at done when it is done."""
    for item in range(_first(pid, P, g), n_items, P):
        _mark(Trace, g + item, 0)
        pair, split = tl.cast(item // SPLITS, tl.int64), item % SPLITS
        _attend(pair, split, query, keys, values, out, partial, NextLengths, wait, sizes, (Trace, g + item), ATT=ATT,
                LLAMA=LLAMA)  # fmt: skip
        barrier.arrive(done, 0)
        _mark(Trace, g + item, 2)


@triton.jit
def _attend(pair, split, query, keys, values, out, partial, NextLengths, wait, sizes, trace, ATT: tl.constexpr,
            LLAMA: tl.constexpr):  # fmt: skip
    """One attention item, split `split` of (sequence, key/value head) pair `pair`: what it reads before its wait
    (the lengths, the cache rows of earlier steps), the wait for the c_attn tiles of its head (wait = (the layer's
    head counters, each head's count, Status, code, limit)), then decode attention's item (GPT-2) or grouped
    decode attention's (a Llama: the group's query heads over one key/value head). sizes = (M, H, KV, keys per
    split, the cache's positions, the scores' scale); trace = (Trace, the task's index)."""
    BLOCK_N: tl.constexpr = ATT[0]
    BLOCK_S: tl.constexpr = ATT[1]
    BLOCK_D: tl.constexpr = ATT[2]
    EARLY: tl.constexpr = ATT[3]
    HEAD_DIM: tl.constexpr = ATT[7]
    M, H, KV, CHUNK, positions, qk_scale = sizes
    Heads, HeadNeeds, Status, code, limit = wait
    g = pair % KV
    if LLAMA:
        early = group_early(
            keys,
            values,
            NextLengths,
            pair,
            split,
            KV,
            CHUNK,
            positions,
            HEAD_DIM=HEAD_DIM,
            BLOCK_N=BLOCK_N,
            BLOCK_D=BLOCK_D,
            ONE_TILE=EARLY,
        )
        barrier.wait_count(Heads + g, tl.load(HeadNeeds + g), Status, code, limit)
        _mark(trace[0], trace[1], 1)
        if partial is not None:
            Part, Counters, splits = partial
            _group(pair, split, M * KV, query, keys, values, out, early, (Part, splits), Counters, KV, H // KV, CHUNK,
                   qk_scale, ATT=ATT)  # fmt: skip
        else:
            _group(pair, split, M * KV, query, keys, values, out, early, None, None, KV, H // KV, CHUNK, qk_scale,
                   ATT=ATT)  # fmt: skip
    else:
        early = early_rows(keys, values, NextLengths, pair, split, H, CHUNK, HEAD_DIM, BLOCK_N, BLOCK_D, PREFETCH=EARLY)
        barrier.wait_count(Heads + g, tl.load(HeadNeeds + g), Status, code, limit)
        _mark(trace[0], trace[1], 1)
        attend_item(
            pair,
            split,
            M * H,
            query,
            keys,
            values,
            out,
            early,
            partial,
            H,
            CHUNK,
            qk_scale,
            HEAD_DIM=HEAD_DIM,
            BLOCK_N=BLOCK_N,
            BLOCK_S=BLOCK_S,
            BLOCK_D=BLOCK_D,
            PREFETCH=EARLY,
            DOT=False,
        )


@triton.jit
def _group(pair, split, pairs, query, keys, values, out, early, partial, Counters, KV, group, CHUNK, qk_scale,
           ATT: tl.constexpr):  # fmt: skip
    """Grouped decode attention's item (kernels.ops.grouped_decode_attention.group_item) at the launch's tiles; its
    one tile's rows were requested before the wait, so the newest is loaded again after it (RELOAD)."""
    BLOCK_N: tl.constexpr = ATT[0]
    BLOCK_S: tl.constexpr = ATT[1]
    BLOCK_D: tl.constexpr = ATT[2]
    ONE_TILE: tl.constexpr = ATT[3]
    BLOCK_G: tl.constexpr = ATT[4]
    BLOCK_GM: tl.constexpr = ATT[5]
    PRECISION: tl.constexpr = ATT[6]
    HEAD_DIM: tl.constexpr = ATT[7]
    group_item(
        pair,
        split,
        pairs,
        query,
        keys,
        values,
        out,
        early,
        partial,
        Counters,
        KV,
        group,
        CHUNK,
        qk_scale,
        HEAD_DIM=HEAD_DIM,
        PRECISION=PRECISION,
        BLOCK_G=BLOCK_G,
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
        BLOCK_S=BLOCK_S,
        BLOCK_GM=BLOCK_GM,
        ONE_TILE=ONE_TILE,
        RELOAD=True,
    )


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
def _embed(
    pid,
    P,
    Ids,
    Positions,
    Wte,
    Wpe,
    X,
    M,
    C,
    Deps,
    Trace,
    ROWS: tl.constexpr,
    BN: tl.constexpr,
    ADD_POSITIONS: tl.constexpr,
):
    """The embedding's tasks: column tiles of x = wte[ids] (+ wpe[positions] with ADD_POSITIONS, as
    kernels.elementwise.embedding adds them); each arrives at Deps[0]. Returns the next task's index."""
    rows = tl.arange(0, ROWS)
    row_mask = rows < M
    ids = tl.load(Ids + rows, mask=row_mask, other=0).to(tl.int64)
    pos = tl.load(Positions + rows, mask=row_mask, other=0).to(tl.int64)
    n = tl.cdiv(C, BN)
    for t in range(_first(pid, P, 0), n, P):
        _mark(Trace, t, 0)
        _mark(Trace, t, 1)  # nothing to wait for
        cols = t * BN + tl.arange(0, BN)
        mask = row_mask[:, None] & (cols < C)[None, :]
        x = tl.load(Wte + ids[:, None] * C + cols[None, :], mask=mask, other=0.0)
        if ADD_POSITIONS:
            x += tl.load(Wpe + pos[:, None] * C + cols[None, :], mask=mask, other=0.0)
        tl.store(X + rows[:, None] * C + cols[None, :], x, mask=mask)
        barrier.arrive(Deps, 0)
        _mark(Trace, t, 2)
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
    Trace,
    EPILOGUE: tl.constexpr,
    ARRIVE: tl.constexpr,
    BIAS: tl.constexpr,
    RMS: tl.constexpr,
    SWIGLU: tl.constexpr,
    ROWS: tl.constexpr,
    BN: tl.constexpr,
    HEAD_K: tl.constexpr,
    TAIL_K: tl.constexpr,
    STATS_COLS: tl.constexpr,
    DOT: tl.constexpr,
):
    """A projection's tasks from task g on, those of program pid: the column tiles of linear = (W (N, K), bias; read
    only with BIAS), each one's weight slice loaded before it waits for ready = (counter, count), what its input's tasks
    count there; fault = (Status, code, limit) for a wait that gives up. x, norm (RMSNorm with RMS) and out (with
    rope, the q and k columns turned; its bias linear's) as kernels.ops.decode_linear.items takes them, SWIGLU the
    gate's and up's rows side by side; shape = (M, N, K); ARRIVE(done, tile, BN) marks each task done. Returns the
    next operation's first task."""
    W, Bias = linear
    M, N, K = shape
    Counter, count = ready
    Status, code, limit = fault
    y, _, res, kv, rope = out
    n = tl.cdiv(N, BN)
    first = _first(pid, P, g)
    for t in range(first, n, P):
        _mark(Trace, g + t, 0)
        w_slice = load_slice(
            t, 0, (W, K, 1), N, K, K, rope=rope, BLOCK_N=BN, HEAD_K=HEAD_K, TAIL_K=TAIL_K, SWIGLU=SWIGLU
        )
        if t == first:  # the input is whole once: later tiles of this program find the count met
            barrier.wait_count(Counter, count, Status, code, limit)
        _mark(Trace, g + t, 1)
        acc = slice_times(
            w_slice,
            0,
            x,
            norm,
            M,
            K,
            K,
            RMS=RMS,
            ROWS=ROWS,
            BLOCK_N=BN,
            HEAD_K=HEAD_K,
            TAIL_K=TAIL_K,
            STATS_COLS=STATS_COLS,
            DOT=DOT,
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
            out=(y, Bias if BIAS else None, res, kv, rope),
            M=M,
            N=N,
            EPILOGUE=EPILOGUE,
            BLOCK_M=ROWS,
            BLOCK_N=BN,
        )
        ARRIVE(done, t, BN)
        _mark(Trace, g + t, 2)
    return g + n


@triton.jit
def _mark(Trace, task, at: tl.constexpr):
    """With a Trace, stamp entry `at` of task `task` (0 started, 1 its inputs ready, 2 arrived) on the global timer."""
    if Trace is not None:
        tl.store(Trace + tl.cast(task, tl.int64) * 3 + at, stamps.now())


@triton.jit
def _arrive_count(done, t, BN: tl.constexpr):
    """One more task of the operation done, at done = (counter, ...)."""
    barrier.arrive(done[0], 0)


@triton.jit
def _arrive_heads(done, t, BN: tl.constexpr):
    """A c_attn tile done: one arrival at the counter of each key/value head whose columns it holds, a run of its
    columns within the q columns of the head's group of query heads, or within its k or v columns; done = (the
    layer's head counters, q's columns H x D, k's (and v's) KV x D, a group's q columns, D). Scalar atomics, one
    per run: each is one thread's, whatever the layout of a tile's columns."""
    Heads, Q_COLS, KV_COLS, GROUP_COLS, D = done
    lo = t * BN
    hi = tl.minimum(lo + BN, Q_COLS + 2 * KV_COLS)
    tl.debug_barrier()  # every thread's stores of the tile come before the releases
    for section in tl.static_range(3):  # q, k, v: (their first column, the columns of one key/value head)
        start = 0 if section == 0 else Q_COLS + (section - 1) * KV_COLS
        unit = GROUP_COLS if section == 0 else D
        a = tl.maximum(lo, start)
        b = tl.minimum(hi, start + (Q_COLS if section == 0 else KV_COLS))
        if a < b:
            for head in range((a - start) // unit, (b - 1 - start) // unit + 1):
                tl.atomic_add(Heads + head, 1, sem="release", scope="gpu")


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


class Step(NamedTuple):
    """A model's parameters as the launch takes them (layer_offsets makes the offsets). GPT-2: each layer ((ln_1 w,
    b), (c_attn W, b), (c_proj W, b), (ln_2 w, b), (c_fc W, b), (mlp.c_proj W, b)), ln_f (w, b), wpe the positions'
    table. A Llama: each layer ((ln_1 w,), (c_attn W,), (c_proj W,), (ln_2 w,), (c_fc W,), (mlp.c_proj W,)),
    ln_f (w,), wpe None, rope its rotary theta."""

    wte: torch.Tensor
    wpe: torch.Tensor | None
    layers: tuple
    ln_f: tuple
    lm_head: torch.Tensor
    eps: float
    rope: float | None = None

    @property
    def llama(self) -> bool:
        return self.wpe is None


_offsets: dict = {}


def layer_offsets(layers) -> torch.Tensor:
    """(L, tensors a layer) int64 on the layers' device: the element offset of each layer's tensor from layer 0's,
    made once per set of tensors (before any CUDA graph captures a step: the decoder runs a step eagerly first)."""
    flat = [[t for part in layer for t in part] for layer in layers]
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


def check(device) -> None:
    """Raise if a wait of the last steps on `device` gave up (and clear the record): their outputs are wrong."""
    word = arrival.status_word(device)
    code = int(word.item())
    if code:
        word.zero_()
        layer, wait = divmod(code, 8)
        names = {1: "c_attn's input", 2: "its head's q, k and v", 3: "attention", 4: "c_proj", 5: "c_fc"}
        where = "the LM head" if wait == 6 else f"layer {layer}"
        raise RuntimeError(
            f"{NAME}: a task of {where} waited for {names.get(wait, 'the layers')} past its bound of polls (the first "
            "wait to give up; the waits downstream of a fault give up too) and the step's output is wrong: a "
            "program that never started, or a counter left set by a failed step"
        )


def shape_of(step: Step, kv) -> Shape:
    """The model's shape from its parameters and caches."""
    k_cache = kv[0]
    head_dim, kv_heads = k_cache.shape[-1], k_cache.shape[2]
    width = step.wte.shape[1]
    return Shape(
        width=width,
        heads=width // head_dim,
        kv_heads=kv_heads,
        ffn=step.layers[0][5][0].shape[1],
        vocab=step.lm_head.shape[0],
        layers=len(step.layers),
        llama=step.llama,
    )


def decode_step(ids, step: Step, kv, *, limit: int = LIMIT, head_needs_extra: int = 0, keep: bool = False, trace=None):
    """One decode step in one launch: ids (B,) the new tokens, step the model's parameters, kv = (k_cache, v_cache,
    lengths, next_lengths) with caches (L, B, KV, T_max, D): each token goes in at position lengths[b] and attends
    over next_lengths[b] = lengths[b] + 1 keys. Returns the logits (B, vocab).

    limit: polls before a wait gives up; head_needs_extra: added to head 0's count; keep: leave the counters as
    the step ends (tiles.counts), for a test to read (the last three for tests alone: a kept count hangs the next
    step until its bound). trace: a (tasks, 3) int64 tensor on the GPU (tiles.tasks counts them) in which every
    task stamps when it started, when its inputs were ready and when it arrived, on the global timer. Inside
    kernels.launch.stamping() every program stamps its start, end and SM, and (with no trace given) every task its
    three in the stamping buffer, its task list kept beside (explorer.measure.timeline)."""
    rows = _check(ids, step, kv)
    k_cache, v_cache, lengths, next_lengths = kv
    ids = ids.contiguous()  # a column of a batch of prompts is a strided view
    shape = shape_of(step, kv)
    like = step.wte
    device = like.device
    p = plan(rows, shape, k_cache.shape[3], like.dtype, device)
    if trace is not None or launch.stamping_on():  # inside kernels.launch.stamping() the tasks stamp themselves too
        runs = tasks(rows, shape, k_cache.shape[3], like.dtype, device)
        count = sum(n for _, _, n in runs)
        if trace is None:
            trace = launch.task_stamps(count, (runs, p.programs))
        _check_trace(trace, count, device)
    n_layer, width, heads = shape.layers, shape.width, shape.heads
    logits = new_output(like, (rows, shape.vocab))
    s_x, s_qkv, s_hid = (region_stride(rows * w, like.element_size()) for w in (width, shape.qkv, shape.ffn))
    scratch = (new_output(like, (n_layer + 1, s_x)), new_output(like, (n_layer, s_qkv)))
    scratch += (new_output(like, (n_layer, s_x)), new_output(like, (n_layer, s_x)), new_output(like, (n_layer, s_hid)))
    s_part = region_stride(rows * heads * p.splits * (p.block_d + 2), 4)
    scratch += (logits, (s_x, s_qkv, s_hid, s_part))
    needs = head_needs(shape, p.tiles["BN_A"])
    needs[0] += head_needs_extra
    head_count = _needs(device, needs)
    partial = None
    if p.splits > 1:
        part = new_output(like, (n_layer, s_part), torch.float32)
        partial = (part, arrival.counters(device, rows * shape.kv_heads), p.splits)
    layer_tensors = [t for part_ in step.layers[0] for t in part_]
    ln_w = step.ln_f[0]
    args = (
        (ids, lengths, step.wte, step.wpe if step.wpe is not None else step.wte, ln_w, step.ln_f[-1], step.lm_head),
        (layer_offsets(step.layers), *layer_tensors),
        (k_cache, v_cache, lengths, next_lengths, k_cache.stride(), v_cache.stride()),
        partial,
        (p.chunk, p.splits, p.scale, k_cache.shape[3], math.log2(step.rope) if step.rope else 0.0),
        scratch,
        (
            arrival.task_counters(device, 2 + n_layer * STAGES),
            arrival.head_counters(device, n_layer * shape.kv_heads),
            head_count,
            arrival.status_word(device),
        ),
        (rows, width, heads, shape.kv_heads, shape.ffn, n_layer, shape.vocab, float(step.eps), limit, 0 if keep else 1),
    )
    kwargs = dict(**p.constexprs, LLAMA=shape.llama, num_warps=p.warps, num_stages=1)
    _check_resident(args, kwargs, p.programs, device, traced=trace is not None)
    launch.plain(_decode_step_kernel)[(p.programs,)](*args, Trace=trace, **kwargs)  # Stamps: handed by the launcher
    return logits


LINE = 128  # bytes of an L1 line


def region_stride(elements: int, itemsize: int) -> int:
    """Elements from one layer's region of a scratch buffer to the next: `elements`, rounded up so that every region
    starts a line. A program that read a line holding the end of layer l's rows (in one layer's task) would
    otherwise find the start of layer l + 1's there as it was then, before they were written (a Llama's hidden
    width of 72 in fp16: 432 bytes a layer)."""
    per_line = LINE // itemsize
    return -(-elements // per_line) * per_line


_need_tables: dict = {}


def _needs(device, needs: list[int]) -> torch.Tensor:
    """The heads' counts as a device tensor, made once per list (a launch in a CUDA graph reads it every replay)."""
    key = (device, tuple(needs))
    got = _need_tables.get(key)
    if got is None:
        got = _need_tables[key] = torch.tensor(needs, dtype=torch.int32, device=device)
    return got


def fits(programs: int, resident: int, sms: int) -> None:
    """Refuse a launch whose programs could not all be resident at once (a waiting program would hold an SM a
    program it waits for needs): resident programs per SM, from the compiled kernel."""
    if programs > resident * sms:
        raise RuntimeError(
            f"{NAME}: {programs} programs, but the compiled kernel fits {resident} per SM on {sms} SMs; its tasks "
            "wait for each other, so every program must be resident at once"
        )


_resident_checked: set = set()


def _check_resident(args: tuple, kwargs: dict, programs: int, device, traced: bool = False) -> None:
    """On a GPU, once per specialisation: compile the launch (without running it) and hold its programs to the
    count the driver says one SM holds of it (kernels.occupancy.driver_resident)."""
    if device.type != "cuda":
        return
    key = (device, programs, traced, tuple(sorted(kwargs.items())))
    if key in _resident_checked:
        return
    from ...occupancy import driver_resident

    trace = torch.empty(1, dtype=torch.int64, device=device) if traced else None  # compiled alike whatever its size
    compiled = _decode_step_kernel.warmup(*args, grid=(programs,), Trace=trace, Stamps=None, **kwargs)
    fits(programs, driver_resident(compiled), device_limits(device).num_sms)
    _resident_checked.add(key)


def _check_trace(trace, count: int, device) -> None:
    if device.type != "cuda":
        raise ValueError(f"{NAME}: a trace reads the GPU's global timer: there is none in the interpreter")
    if not isinstance(trace, torch.Tensor) or trace.dtype != torch.int64 or trace.device != device:
        raise ValueError(f"{NAME}: trace must be an int64 tensor on {device}")
    if not trace.is_contiguous() or trace.numel() < 3 * count:
        raise ValueError(f"{NAME}: trace must be contiguous and hold 3 stamps for each of the step's {count} tasks")


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
            f"{NAME}: caches must be (layers, B, KV, T, D) with one layer per block, got {tuple(k_cache.shape)}"
        )
    width = step.wte.shape[1]
    if k_cache.shape[1] != rows or width % k_cache.shape[4] or (width // k_cache.shape[4]) % k_cache.shape[2]:
        raise ValueError(
            f"{NAME}: caches {tuple(k_cache.shape)} do not hold {rows} sequences of key/value heads that divide the "
            f"{width // max(1, k_cache.shape[4])} query heads of {width}"
        )
    parts = 1 if step.llama else 2
    first = [t for part in step.layers[0] for t in part]
    for i, layer in enumerate(step.layers):
        tensors = [t for part in layer for t in part]
        if any(len(part) != parts for part in layer) or len(tensors) != 6 * parts:
            raise ValueError(f"{NAME}: layer {i} must hold six parts of {parts} tensor(s) each")
        for t, like in zip(tensors, first, strict=True):
            if t.shape != like.shape or not t.is_contiguous() or t.dtype != step.wte.dtype or t.device != ids.device:
                raise ValueError(
                    f"{NAME}: layer {i}'s tensors must be contiguous, shaped as layer 0's and of the embedding's "
                    f"dtype and device ({step.wte.dtype} on {ids.device})"
                )
    ends = [step.wte, step.lm_head, *step.ln_f] + ([] if step.wpe is None else [step.wpe])
    for t in ends:
        if not t.is_contiguous() or t.dtype != step.wte.dtype or t.device != ids.device:
            raise ValueError(
                f"{NAME}: the embeddings, ln_f and the LM head must be contiguous {step.wte.dtype} on {ids.device}"
            )
    if step.llama and not step.rope:
        raise ValueError(f"{NAME}: a Llama's step needs its rotary theta (Step.rope)")
    for t in (lengths, next_lengths):
        if t.shape != (rows,) or t.dtype not in (torch.int32, torch.int64) or t.device != ids.device:
            raise ValueError(f"{NAME}: lengths must be ({rows},) int32 or int64 tensors on {ids.device}")
    return rows
