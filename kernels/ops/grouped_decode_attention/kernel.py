"""Decode attention with grouped-query heads (the Llama family's): a few key/value heads each serve a group of
query heads, and the KV cache holds only those few.

    o[b, h] = softmax(q[b, h] . K[b, h // G, :n]^T / sqrt(D)) V[b, h // G, :n]      G = query heads per KV head

One program per (sequence, key/value head, split of the keys) walks its share of that head's keys once, for all
G queries of its group together: the G query rows form one tile (padded to 16 rows for the tensor cores' dot),
so every key and value row is read from memory once per sequence, not once per query head. Each tile of keys
goes through the online softmax, as in flash attention, in its lazy form (softmax.lazy_step: the output is
rescaled only when a max grows by more than 2^8); the tiles wholly below the length load and score without
masks on the keys, the one the length cuts with them.

At B=1 SmolLM2's 3 key/value heads would be 3 programs on a GPU of 132 SMs, so the keys are split as decode
attention splits them (flash-decoding): each split stores a partial (unnormalised output, max, sum) per query
head, and the splits are merged, in one of two ways (plan() picks). In the same launch, for few programs: the
last split of a (sequence, key/value head) to arrive (kernels.arrival) merges its G heads' partials in one
tile (_merge_group: decode attention's merge for G heads at once) and resets its counter. From MERGE_APART
programs on, by a second kernel (_grouped_merge), one program per (sequence, query head) and slice of its
dimensions, launched under PDL behind the splits where the GPU has it: resident while they run, it starts the
moment they end. Either way no host synchronisation, capturable in a CUDA graph. With one split there is
nothing to merge: the program writes its heads' outputs directly (the interpreter's default, whose cost is
per program).
"""

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ... import arrival, launch, pdl, stamps
from ...config import (
    SECTOR,
    TileConfig,
    Traffic,
    cdiv,
    device_limits,
    explain_resources,
    l2_miss,
    new_output,
    next_pow2,
    overlaps_launches,
    pipeline_stages,
    sectors,
)
from ...parts.softmax import lazy_step, merge
from ..attention.kernel import LOG2E, check_qkv
from ..decode_attention.kernel import partial_buffers


@triton.jit
def _grouped_decode_kernel(
    query,  # (Q, stride_b, stride_h, stride_d)
    keys,  # (cache, stride_b, stride_h, stride_n, stride_d)
    values,
    out,  # (Out, stride_b, stride_h, stride_d)
    Lengths,
    partial,  # (Part, splits), or None with one split
    Counters,  # the arrival counters where the last split merges, None where _grouped_merge does
    kv_heads,
    group,
    CHUNK,
    positions,  # the cache's positions (rows past a sequence's length are allocated, so they may be loaded)
    scale_log2,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_GM: tl.constexpr,  # the group's heads as the merge holds them, a power of two (BLOCK_G pads to 16)
    ONE_TILE: tl.constexpr,
    PDL: tl.constexpr,
    TRIGGER: tl.constexpr,
    Stamps,
):
    # The kernel behind (the merge, or under PDL the decode step's next projection) may start now: the merge
    # waits there for every split, the projection loads its weights. Under PDL this one waits for the kernel
    # ahead (which writes q and each sequence's newest cache row) before it reads them.
    stamps.begin(Stamps)
    pdl.launch_dependents(TRIGGER)
    pid = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    early = group_early(
        keys,
        values,
        Lengths,
        pid,
        split,
        kv_heads,
        CHUNK,
        positions,
        HEAD_DIM=HEAD_DIM,
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
        ONE_TILE=ONE_TILE,
    )
    pdl.wait(PDL)
    group_item(
        pid,
        split,
        tl.num_programs(0),
        query,
        keys,
        values,
        out,
        early,
        partial,
        Counters,
        kv_heads,
        group,
        CHUNK,
        scale_log2,
        HEAD_DIM=HEAD_DIM,
        PRECISION=PRECISION,
        BLOCK_G=BLOCK_G,
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
        BLOCK_S=BLOCK_S,
        BLOCK_GM=BLOCK_GM,
        ONE_TILE=ONE_TILE,
        RELOAD=PDL,
    )
    stamps.end(Stamps)


@triton.jit
def group_early(
    keys,
    values,
    Lengths,
    pid,
    split,
    kv_heads,
    CHUNK,
    positions,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    """What split `split` of (sequence, key/value head) pair pid loads before it waits for the work that writes q
    and each sequence's newest cache row: the sequence's length and, with ONE_TILE (a split of one key tile), its
    keys and values, masked by the cache's size (the scores are masked by the length later), so that they wait
    neither for the length nor for that work: one memory round trip, which is most of a split's time at B=1.
    Returns (length, (k, v)); without ONE_TILE (length, 0), since a device function returns no None."""
    b, kv = pid // kv_heads, pid % kv_heads
    dims, keys_n = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    n = tl.load(Lengths + b).to(tl.int32)  # set before the step: read before the wait
    rows = 0
    if ONE_TILE:
        K, skb, skh, skt, skd = keys
        V, svb, svh, svt, svd = values
        pos = split * CHUNK + keys_n
        inside = (pos < positions)[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(
            K + b * skb + kv * skh + dims[None, :] * skd + pos[:, None].to(tl.int64) * skt, mask=inside, other=0.0
        )
        v = tl.load(
            V + b * svb + kv * svh + dims[None, :] * svd + pos[:, None].to(tl.int64) * svt, mask=inside, other=0.0
        )
        rows = (k, v)
    return n, rows


@triton.jit
def group_item(
    pid,
    split,
    pairs,
    query,
    keys,
    values,
    out,
    early,
    partial,
    Counters,
    kv_heads,
    group,
    CHUNK,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_GM: tl.constexpr,
    ONE_TILE: tl.constexpr,
    RELOAD: tl.constexpr,
):
    """Split `split` of (sequence, key/value head) pair pid, of `pairs`, after its wait: its G query heads over its
    keys, early = group_early(...) as ONE_TILE called it; with RELOAD the newest cache row, which the work waited
    for wrote, loaded again by the split that holds it. Its partial stored (partial = (Part, splits)) and, with
    Counters, merged by the last split to arrive; with one split (partial None) the heads' outputs written."""
    b, kv = pid // kv_heads, pid % kv_heads
    queries, dims, keys_n = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    heads = kv * group + queries
    q_mask = (queries < group)[:, None] & (dims < HEAD_DIM)[None, :]
    Q, sqb, sqh, sqd = query
    n, rows = early
    K, skb, skh, skt, skd = keys
    V, svb, svh, svt, svd = values
    k_base = K + b * skb + kv * skh + dims[None, :] * skd
    v_base = V + b * svb + kv * svh + dims[None, :] * svd
    lo = split * CHUNK
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + dims[None, :] * sqd, mask=q_mask, other=0.0, cache_modifier=".cg")
    if ONE_TILE:
        k, v = rows
        pos = lo + keys_n
        d_mask = (dims < HEAD_DIM)[None, :]
        if RELOAD:  # the newest row is the waited-for work's: loaded again after the wait, by the split holding it
            # .cg: from L2. The early load brought the row's old line into this SM's L1, which a wait's acquire
            # does not clear for the other threads (decode_linear.items.finish reads its partials so too).
            last = n - 1
            if (last >= lo) & (last < lo + BLOCK_N):
                newest = (pos == last)[:, None]
                k_new = tl.load(k_base + last.to(tl.int64) * skt, mask=d_mask, other=0.0, cache_modifier=".cg")
                v_new = tl.load(v_base + last.to(tl.int64) * svt, mask=d_mask, other=0.0, cache_modifier=".cg")
                k, v = tl.where(newest, k_new, k), tl.where(newest, v_new, v)
        seen = (pos < n)[None, :]
        scores = tl.where(seen, tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2, float("-inf"))
        m_i = tl.max(scores, axis=1)
        p = tl.where(seen, tl.exp2(scores - m_i[:, None]), 0.0)  # a split past the length: max -inf, sum 0
        l_i = tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    else:
        hi = tl.minimum(lo + CHUNK, n)
        whole = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N  # tiles below this hold no key past the length
        m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)  # an empty split: max -inf, sum 0, output 0
        l_i = tl.zeros((BLOCK_G,), tl.float32)
        acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
        opening = lo.to(tl.int64) + keys_n[:, None]  # the keys of the split's first tile
        k_split = k_base + opening * skt
        v_split = v_base + opening * svt
        for start in range(lo, whole, BLOCK_N):
            m_i, l_i, acc = _keys_tile(q, k_split + (start - lo) * skt, v_split + (start - lo) * svt, m_i, l_i,
                                       acc, scale_log2, keys_n, dims, BLOCK_N, HEAD_DIM, PRECISION,
                                       MASKED=False)  # fmt: skip
        if whole < hi:  # the last tile, past the length in part: masked
            m_i, l_i, acc = _keys_tile(q, k_split + (whole - lo) * skt, v_split + (whole - lo) * svt, m_i, l_i,
                                       acc, scale_log2, keys_n, dims, hi - whole, HEAD_DIM, PRECISION,
                                       MASKED=True)  # fmt: skip

    Out, sob, soh, sod = out
    live = queries < group
    if partial is None:  # one split: its partial is the whole answer (a sequence of length 0 gets zeros)
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(Out + b * sob + heads[:, None] * soh + dims[None, :] * sod, o.to(Out.dtype.element_ty), mask=q_mask)
    else:
        Part, SPLITS = partial
        first = b * kv_heads * group + kv * group  # the group's first (sequence, query head) pair
        PartO, PartM, PartL = partial_buffers(Part, SPLITS, pairs * group, BLOCK_D)
        part = (first + queries) * SPLITS + split
        tl.store(PartO + part[:, None] * BLOCK_D + dims[None, :], acc, mask=live[:, None])
        tl.store(PartM + part, m_i, mask=live)
        tl.store(PartL + part, l_i, mask=live)
        if Counters is not None:  # merged here, by the last split to arrive (else by _grouped_merge)
            # As in decode attention's one launch: every thread's stores before the barrier, the barrier before
            # the release half of the atomic, so the last to arrive reads every other split's partials.
            tl.debug_barrier()
            arrived = tl.atomic_add(Counters + pid, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLITS - 1:
                o = _merge_group(PartO, PartM, PartL, first, group, SPLITS, BLOCK_GM, BLOCK_S, BLOCK_D)
                g = tl.arange(0, BLOCK_GM)
                rows_o = Out + b * sob + (kv * group + g)[:, None] * soh + dims[None, :] * sod
                tl.store(rows_o, o.to(Out.dtype.element_ty), mask=(g < group)[:, None] & (dims < HEAD_DIM)[None, :])
                tl.store(Counters + pid, 0)  # every split has arrived: nothing else touches the slot this launch


@triton.jit
def _keys_tile(q, k_rows, v_rows, m_i, l_i, acc, scale_log2, keys_n, dims, count, HEAD_DIM: tl.constexpr,
               PRECISION: tl.constexpr, MASKED: tl.constexpr):  # fmt: skip
    """One tile of keys (k_rows, v_rows: its elements' addresses) into the group's running max, sum and output
    (softmax.lazy_step). Whole tiles load and score without a mask on the keys (only on the dimensions past
    HEAD_DIM, where BLOCK_D pads it); MASKED, only the first `count` keys are loaded and scored."""
    k = _rows(k_rows, keys_n, dims, count, HEAD_DIM, MASKED)
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)
    if MASKED:
        scores = tl.where((keys_n < count)[None, :], scores, float("-inf"))
    m_i, p, l_i, acc = lazy_step(m_i, l_i, acc, scores, scale_log2)
    v = _rows(v_rows, keys_n, dims, count, HEAD_DIM, MASKED)
    return m_i, l_i, acc + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)


@triton.jit
def _rows(at, keys_n, dims, count, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr):
    """A tile of cache rows: masked past `count` keys where MASKED, past HEAD_DIM where BLOCK_D pads it."""
    if MASKED:
        return tl.load(at, mask=(keys_n < count)[:, None] & (dims < HEAD_DIM)[None, :], other=0.0)
    elif HEAD_DIM < dims.shape[0]:
        return tl.load(at, mask=(dims < HEAD_DIM)[None, :], other=0.0)
    else:
        return tl.load(at)


@triton.jit
def _merge_group(PartO, PartM, PartL, first, group, SPLITS, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
                 BLOCK_D: tl.constexpr):  # fmt: skip
    """The normalised outputs of a group's query heads (pairs first .. first + group - 1) from the partials of
    all their splits, every head's in one (head, split, dim) tile, so its loads go out together: each partial
    weighed by exp2(its max - the head's largest max), over the weighed sums (kernels.parts.softmax.merge, for G
    heads at once)."""
    g, splits, dims = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_S), tl.arange(0, BLOCK_D)
    at = (first + g)[:, None] * SPLITS + splits[None, :]
    ok = (g < group)[:, None] & (splits < SPLITS)[None, :]
    # .cg: from L2, as decode attention's merge reads them (a sector of maxima holds several pairs')
    m = tl.load(PartM + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(PartL + at, mask=ok, other=0.0, cache_modifier=".cg")
    part = tl.load(
        PartO + at[:, :, None] * BLOCK_D + dims[None, None, :], mask=ok[:, :, None], other=0.0, cache_modifier=".cg"
    )
    return merge(m, sums, part, 1)


@triton.jit
def _grouped_merge(
    out,  # (Out, stride_b, stride_h, stride_d)
    Part,
    SPLITS,
    heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_DM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
    TRIGGER: tl.constexpr,
    Stamps,
):
    """One program per (sequence, query head) and slice of BLOCK_DM of its dimensions: each split's partial
    weighed by exp2(its max - the head's largest max), over the weighed sums (kernels.parts.softmax.merge). Spread
    this wide, the partials of a hundred splits arrive in one memory round trip, where the last split to arrive
    reading them alone took 18.5 µs at 64 splits and B=8 (experiments/README.md, grouped_warps). The maths is
    the shared merge's, its three loads first, so they go out together."""
    stamps.begin(Stamps)
    pdl.launch_dependents(TRIGGER)  # the decode step's next projection may start loading its weights
    pdl.wait(PDL)  # launched under PDL behind the splits: their partials are visible once this returns
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // heads, bh % heads
    dims = tl.program_id(1) * BLOCK_DM + tl.arange(0, BLOCK_DM)
    splits = tl.arange(0, BLOCK_S)
    ok = splits < SPLITS
    PartO, PartM, PartL = partial_buffers(Part, SPLITS, tl.num_programs(0), BLOCK_D)
    at = bh * SPLITS + splits
    m = tl.load(PartM + at, mask=ok, other=float("-inf"))
    sums = tl.load(PartL + at, mask=ok, other=0.0)
    part = tl.load(PartO + at[:, None] * BLOCK_D + dims[None, :], mask=ok[:, None], other=0.0)
    o = merge(m, sums, part, 0)
    Out, sob, soh, sod = out
    tl.store(Out + b * sob + h * soh + dims * sod, o.to(Out.dtype.element_ty), mask=dims < HEAD_DIM)
    stamps.end(Stamps)


def check_groups(name: str, q, k, v) -> int:
    """The checks of attention with grouped heads (q (B, H, Tq, D), k and v (B, H_kv, Tk, D), H a multiple of
    H_kv, and check_qkv's on one query head per key/value head); returns the group size H / H_kv."""
    if q.dim() != 4 or k.dim() != 4 or not k.shape[1] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{name}: q must be (B, H, Tq, D) and k, v (B, H_kv, Tk, D) with H a multiple of H_kv, "
            f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
    group = q.shape[1] // k.shape[1]
    check_qkv(name, q[:, ::group], k, v)
    return group


MERGE_TILE = 16384  # elements of the last arrival's (head, split, dim) tile: 64 fp32 registers a thread in 4 warps
MAX_SPLITS = 128  # the merge kernel holds a head's maxes and sums for every split in one tile
MERGE_SLICE = 16  # dimensions a merge kernel's program holds: 4 of SmolLM2's 64 a head, so B * H * 4 programs
MERGE_APART = 64  # programs from which on a second launch merges: below, the last split to arrive does


class Plan(NamedTuple):
    block_n: int  # keys per tile
    splits: int
    chunk: int  # keys per split (a multiple of block_n)
    num_warps: int
    apart: bool  # the partials merged by a second launch (_grouped_merge), not by the last split to arrive


@functools.lru_cache(maxsize=256)  # the host asks once per shape, not once per launch
def plan(groups: int, max_len: int, device, *, group=1, head_dim=64, block_n=None, split_k=None, num_warps=None):
    """Plan(block_n, splits, chunk, num_warps, apart) for `groups` (sequence, key/value head) pairs over a cache
    of max_len positions.

    On a GPU: about two programs per SM in all, but no split shorter than one key tile. For fewer than 8 pairs,
    128-key tiles in 4 warps (at B=1 a split's one tile is most of its time: one round trip to memory). From 8
    on, the splits are counted over 32-key tiles; a split of at most 64 keys is one tile in 4 warps, a longer one
    a loop of about 8 tiles of 32 to 64 keys in one warp (whose softmax needs no barrier): at B=8 the fastest of
    18 tilings at 1024, 4096 and 8192 keys (experiments/grouped_plan.py; benchmarks/RESULTS.md). From
    MERGE_APART programs on, a second launch merges the splits (up to MAX_SPLITS of them): the last split to
    arrive would read too many partials alone. Below, the last split merges, in one launch (faster at B=1 than
    more splits merged apart). On CPU one split of 128-key tiles: the
    interpreter's cost is per program and per loop step. block_n, split_k and num_warps, where given, replace
    the defaults (split_k is rounded to a power of two, at most one split per key tile, and merged in one launch
    at most as many as the last arrival's tile holds for `group` heads of head_dim)."""
    limits = device_limits(device)
    few = limits.is_cpu or groups < 8
    tile = block_n or (128 if few else 32)  # the tile the splits are counted in
    tiles = max(1, cdiv(max_len, tile))
    if split_k is None:
        split_k = 1 if limits.is_cpu else cdiv(2 * limits.num_sms, groups)
    splits = min(next_pow2(max(1, split_k)), next_pow2(tiles), MAX_SPLITS)
    apart = splits * groups >= MERGE_APART
    if not apart:
        splits = min(splits, max(1, MERGE_TILE // (next_pow2(group) * max(16, next_pow2(head_dim)))))
    warps = 4
    if not block_n:
        block_n = tile
        if not few:  # the keys a split holds decide its tile
            keys = cdiv(tiles, splits) * tile
            block_n = 64 if keys <= 64 else min(64, max(32, next_pow2(keys // 8)))
            warps = 4 if keys <= 64 else 1
    chunk = cdiv(max(1, cdiv(max_len, splits)), block_n) * block_n
    splits = cdiv(max_len, chunk) if max_len else 1
    return Plan(block_n, splits, chunk, num_warps or warps, apart and splits > 1)


def grouped_decode_attention(q, k_cache, v_cache, lengths, *, block_n=None, split_k=None, num_warps=None, pdl=False):
    """One query per sequence and head over a cache of fewer heads: q (B, H, 1, D), caches (B, H_kv, T_max, D)
    with H a multiple of H_kv (query head h reads key/value head h // (H / H_kv)), keys [0, lengths[b]).
    block_n (keys per tile), split_k (splits of the keys) and num_warps default to plan()'s. pdl=True launches
    with programmatic dependent launch where the GPU has it (kernels.pdl): the kernel starts while the one before
    it ends and loads the cache rows of earlier steps before it waits; the caller guarantees that kernel writes
    nothing this one reads but q and each sequence's newest row (the decode step's q/k/v projection). Where
    plan() merges the splits apart, a second launch does, under PDL behind the first wherever the GPU has it."""
    group = check_groups("grouped_decode_attention", q, k_cache, v_cache)
    batch, heads, tq, head_dim = q.shape
    if tq != 1:
        raise ValueError(f"grouped_decode_attention: q must hold one new token per sequence, got {tuple(q.shape)}")
    device = q.device
    if lengths.shape != (batch,) or lengths.dtype not in (torch.int32, torch.int64) or lengths.device != device:
        raise ValueError(f"grouped_decode_attention: lengths must be an int32/int64 tensor of shape ({batch},)")
    kv_heads, max_len = k_cache.shape[1], k_cache.shape[2]
    tiles = dict(block_n=block_n, split_k=split_k, num_warps=num_warps)
    block_n, splits, chunk, warps, apart = plan(
        batch * kv_heads, max_len, device, group=group, head_dim=head_dim, **tiles
    )
    block_d = max(16, next_pow2(head_dim))
    o = new_output(q)
    if not o.numel():
        return o
    partial = None
    if splits > 1:  # one fp32 buffer for the three kinds of partial (decode.partial_buffers), a counter per pair
        partial = (new_output(q, (batch * heads * splits * (block_d + 2),), torch.float32), splits)
    counters = None if apart or partial is None else arrival.counters(device, batch * kv_heads)
    sq, so = q.stride(), o.stride()
    cfg = TileConfig(block_n=block_n, split_k=splits, num_warps=warps)
    overlap = overlaps_launches(device)
    pdl = bool(pdl) and overlap
    with explain_resources("grouped_decode_attention", cfg):
        launch.fast(_grouped_decode_kernel)[(batch * kv_heads, splits)](
            (q, sq[0], sq[1], sq[3]),
            (k_cache, *k_cache.stride()),
            (v_cache, *v_cache.stride()),
            (o, so[0], so[1], so[3]),
            lengths,
            partial,
            counters,
            kv_heads,
            group,
            chunk,
            max_len,
            LOG2E / math.sqrt(head_dim),
            HEAD_DIM=head_dim,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            BLOCK_G=max(16, next_pow2(group)),
            BLOCK_N=block_n,
            BLOCK_D=block_d,
            BLOCK_S=next_pow2(splits),
            BLOCK_GM=next_pow2(group),
            ONE_TILE=chunk == block_n,
            PDL=pdl,
            TRIGGER=pdl or (overlap and apart),
            num_warps=warps,
            num_stages=pipeline_stages(device),
            launch_pdl=pdl,
        )
        if apart:
            slice_d = min(MERGE_SLICE, block_d)
            launch.fast(_grouped_merge)[(batch * heads, block_d // slice_d)](
                (o, so[0], so[1], so[3]),
                partial[0],
                splits,
                heads,
                HEAD_DIM=head_dim,
                BLOCK_S=next_pow2(splits),
                BLOCK_DM=slice_d,
                BLOCK_D=block_d,
                PDL=overlap,
                TRIGGER=pdl,
                num_warps=1,
                launch_pdl=overlap,
            )
    return o


def traffic(
    lengths, heads, kv_heads, head_dim, itemsize, *, max_len=None, device="cpu", block_n=None, split_k=None,
    num_warps=None,
):  # fmt: skip
    """One call over caches of max_len positions (default: the longest length), split as plan() splits it.

    SM requests: each program loads its group's G query rows and its sequence's length (a sector), and its share of
    the keys and values below the length (a split of one tile: the tile whole, to the cache's end, since it is
    requested before the length arrives), so each key/value head's rows once per sequence (a group's query heads
    share them). With one split each program writes its G outputs. With several, each stores G partial outputs
    (fp32, BLOCK_D each) and G maxes and sums (a sector each, SPLITS apart). Merged in the launch, each adds 1 to
    its counter (a sector); the last to arrive reads its G heads' partials back, writes their outputs and resets the
    counter (a sector). Merged apart, the merge's programs, one per (sequence, query head) and slice of its
    dimensions, each read that head's maxes and sums and its slice of every split's partial output, and write the
    slice. HBM: q, a sector of lengths per sequence, the rows loaded once, the outputs; the partials reach HBM as
    decode attention's do (read back from L2 while they fit), the counters once. The score and output dots count 4
    flops per key, dimension and query head."""
    batch, group = len(lengths), heads // kv_heads
    max_len = max_len or max(lengths, default=1)
    tiles = dict(block_n=block_n, split_k=split_k, num_warps=num_warps)
    block_n, splits, chunk, _, apart = plan(batch * kv_heads, max_len, device, group=group, head_dim=head_dim, **tiles)
    row = head_dim * itemsize
    useful = 2 * kv_heads * row * sum(lengths)  # the rows below the lengths
    # A split of one tile requests it whole before the length arrives, so one-tile splits read the cache to its end
    kv = 2 * kv_heads * row * batch * max_len if chunk == block_n else useful
    qo = batch * heads * row
    flops = sum(4 * heads * n * head_dim for n in lengths)
    programs, pairs = batch * kv_heads * splits, batch * kv_heads
    reads = kv + qo * splits + programs * SECTOR
    hbm = kv + qo + batch * SECTOR
    if splits == 1:
        return Traffic(reads, qo, flops, useful + 2 * qo, hbm, qo)
    block_d = max(16, next_pow2(head_dim))
    partials = programs * group * (block_d + 2) * 4
    reads += batch * heads * splits * block_d * 4
    writes = programs * group * (block_d * 4 + 2 * SECTOR) + qo
    hbm += round(partials * l2_miss(partials, device))
    if apart:  # each merge program reads its head's maxes and sums
        reads += batch * heads * (block_d // min(MERGE_SLICE, block_d)) * 2 * sectors(splits * 4)
        return Traffic(reads, writes, flops, useful + 2 * qo, hbm, partials + qo)
    reads += 2 * batch * heads * sectors(splits * 4)  # the last arrival's, per head
    writes += (programs + pairs) * SECTOR  # each program's arrival, the last's reset
    counters = sectors(pairs * 4)
    return Traffic(reads, writes, flops, useful + 2 * qo, hbm + counters, partials + qo + counters)
