"""Split-K decode attention (flash-decoding): one new query per sequence over its KV cache.

decode_attention: one new query per sequence over its cache, keys [0, lengths[b]). A single
sequence has only H query rows, too few programs to fill a GPU, so the cache is split along the
keys into SPLIT_K chunks that run in parallel, each writing a partial (max, sum, unnormalised
output), and a second kernel merges the partials. The grid depends on the cache size only, never
on the lengths' values: no host synchronisation, and the launch can be captured in a CUDA graph.
A split of one key tile scores its keys on the vector units (one query row: a dot product per key). A split
of several tiles loops with tl.dot on q repeated over the 16 rows a dot needs: the compiler software-pipelines
a loop of dots (num_stages - 1 tiles of K and V in flight), not a loop of plain loads, and long splits need
those bytes in flight.
With one_launch=True the merge moves into the split kernel (kernels.arrival): each program stores
its partial, waits at a barrier for all its threads' stores, then adds 1 to its (sequence, head)'s
counter with an acquire-release atomic at GPU scope; the program that reads SPLITS - 1 arrived last,
so the partials of every other split are visible to it. It merges them with the merge kernel's code,
stores the output and sets the counter back to 0. Memory traffic is the same partials written and
read back (the reads now by the last arrivals, while the other splits may still run), plus one
atomic per program and one reset per (sequence, head), and one launch fewer. With a single split
there is nothing to merge: each program normalises its own partial and writes the output.
"""

import torch
import triton
import triton.language as tl

from ... import arrival, autotune, launch, pdl, stamps
from ...config import explain_resources, new_output
from ...parts.softmax import merge, online_step
from ..attention.kernel import check_qkv
from .tiles import (  # noqa: F401 (the tiles, plan and traffic model, named beside the kernels)
    PREFETCH_ELEMENTS_PER_WARP,
    decode_shared_memory,
    decode_split,
    decode_traffic,
    default_decode_config,
    launch_plan,
    resolve_decode_config,
)


@triton.jit
def _chunk_dot(
    query, keys, values, b, h, lo, hi, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr
):
    """One split's share of a (sequence, head) over keys [lo, hi), a split of several key tiles: the
    unnormalised output, the max score and the sum of exponentials, all fp32 (max -inf, sum 0 and output 0
    when the range is empty), scores and output as tl.dot products. query = (Q, stride_b, stride_h,
    stride_d), keys and values = (cache, stride_b, stride_h, stride_n, stride_d)."""
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < HEAD_DIM
    q = _query(query, b, h, dims, d_mask)
    K, stride_kn, stride_kd = _rows_of(keys, b, h)
    V, stride_vn, stride_vd = _rows_of(values, b, h)
    # q repeated on the 16 rows tl.dot needs (every row the same; row 0 is the answer). The compiler
    # software-pipelines a loop of dots, keeping num_stages - 1 tiles of K and V in flight, which it does
    # not for plain loads. As in the prefill kernel, the probabilities are rounded to the input dtype
    # before the product with V.
    q_rows = tl.broadcast_to(q[None, :], (16, BLOCK_D))
    m_i = tl.full((16,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((16,), dtype=tl.float32)
    acc = tl.zeros((16, BLOCK_D), dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (cols < hi)[:, None] & d_mask[None, :]
        k = tl.load(K + cols[:, None] * stride_kn + dims[None, :] * stride_kd, mask=kv_mask, other=0.0)
        v = tl.load(V + cols[:, None] * stride_vn + dims[None, :] * stride_vd, mask=kv_mask, other=0.0)
        if k.dtype == tl.float32:  # fp32 stays fp32 (tl.dot would round it to tf32)
            qk = tl.dot(q_rows, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q_rows, tl.trans(k))
        qk = tl.where((cols < hi)[None, :], qk * qk_scale, float("-inf"))
        m_new, alpha, p, l_i = online_step(m_i, l_i, qk, 1)
        if v.dtype == tl.float32:
            acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    first = tl.arange(0, 16) == 0
    return (
        tl.sum(tl.where(first[:, None], acc, 0.0), axis=0),
        tl.max(tl.where(first, m_i, float("-inf")), axis=0),
        tl.sum(tl.where(first, l_i, 0.0), axis=0),
    )


@triton.jit
def _chunk_vector(
    query, keys, values, b, h, lo, hi, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr
):
    """_chunk_dot's partial with one query row on the vector units: a dot product per key."""
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < HEAD_DIM
    q = _query(query, b, h, dims, d_mask)
    K, stride_kn, stride_kd = _rows_of(keys, b, h)
    V, stride_vn, stride_vd = _rows_of(values, b, h)
    q = q.to(tl.float32) * qk_scale
    m_i = tl.full((), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((), dtype=tl.float32)
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (cols < hi)[:, None] & d_mask[None, :]
        k = tl.load(K + cols[:, None] * stride_kn + dims[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.sum(q[None, :] * k.to(tl.float32), axis=1)
        qk = tl.where(cols < hi, qk, float("-inf"))
        m_new, alpha, p, l_i = online_step(m_i, l_i, qk, 0)
        v = tl.load(V + cols[:, None] * stride_vn + dims[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def early_rows(
    keys,
    values,
    Lengths,
    bh,
    split,
    H,
    CHUNK,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """What split `split` of (sequence, head) pair bh loads before it waits for the work that writes q and the
    newest cache rows: its sequence's length, and with PREFETCH (a split of one key tile) the keys and values
    that earlier steps wrote (positions below length - 1). Returns (length, (k, v)), for split_partial after the
    wait; without PREFETCH (length, 0), since a device function returns no None."""
    b, h = bh // H, bh % H
    length = tl.load(Lengths + b).to(tl.int32)
    old = 0
    if PREFETCH:
        dims = tl.arange(0, BLOCK_D)
        cols = split * CHUNK + tl.arange(0, BLOCK_N)
        K, stride_kn, stride_kd = _rows_of(keys, b, h)
        V, stride_vn, stride_vd = _rows_of(values, b, h)
        earlier = (cols < length - 1)[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(K + cols[:, None] * stride_kn + dims[None, :] * stride_kd, mask=earlier, other=0.0)
        v = tl.load(V + cols[:, None] * stride_vn + dims[None, :] * stride_vd, mask=earlier, other=0.0)
        old = (k, v)
    return length, old


@triton.jit
def _tile_after_wait(
    old,
    query,
    keys,
    values,
    b,
    h,
    lo,
    length,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """_chunk_vector for a chunk of one key tile, [lo, min(lo + BLOCK_N, length)), whose older rows old =
    (k, v) were loaded before the wait (early_rows): q and the newest row (length - 1) now."""
    k, v = old
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < HEAD_DIM
    cols = lo + tl.arange(0, BLOCK_N)
    K, stride_kn, stride_kd = _rows_of(keys, b, h)
    V, stride_vn, stride_vd = _rows_of(values, b, h)
    newest = (cols == length - 1)[:, None] & d_mask[None, :]
    k_ptrs = K + cols[:, None] * stride_kn + dims[None, :] * stride_kd
    v_ptrs = V + cols[:, None] * stride_vn + dims[None, :] * stride_vd
    k = tl.where(newest, tl.load(k_ptrs, mask=newest, other=0.0, cache_modifier=".cg"), k)  # another program's
    v = tl.where(newest, tl.load(v_ptrs, mask=newest, other=0.0, cache_modifier=".cg"), v)
    q = _query(query, b, h, dims, d_mask).to(tl.float32)
    qk = tl.sum((q * qk_scale)[None, :] * k.to(tl.float32), axis=1)
    qk = tl.where(cols < length, qk, float("-inf"))
    m_i = tl.max(qk, axis=0)
    p = tl.where(cols < length, tl.exp2(qk - m_i), 0.0)  # an empty chunk: max -inf, sum 0, output 0
    return tl.sum(p[:, None] * v.to(tl.float32), axis=0), m_i, tl.sum(p, axis=0)


@triton.jit
def _query(query, b, h, dims, d_mask):
    """q's row of (sequence b, head h): query = (Q, stride_b, stride_h, stride_d)."""
    Q, stride_qb, stride_qh, stride_qd = query
    # .cg: in the one-launch step q is another program's, written after this SM may have read a sector it shares
    # with another head's q (a head of 24 fp16 dims is 48 bytes) for an earlier item.
    return tl.load(Q + b * stride_qb + h * stride_qh + dims * stride_qd, mask=d_mask, other=0.0, cache_modifier=".cg")


@triton.jit
def _rows_of(cache, b, h):
    """(pointer to row 0 of (sequence b, head h), stride between rows, stride between dims) of a cache given
    as (C, stride_b, stride_h, stride_n, stride_d)."""
    C, stride_b, stride_h, stride_n, stride_d = cache
    return C + b * stride_b + h * stride_h, stride_n, stride_d


@triton.jit
def partial_buffers(Part, SPLITS, BH, BLOCK_D: tl.constexpr):
    """The one fp32 buffer of partials, split three ways: every split's output (BLOCK_D each), then every
    split's max score, then every sum of exponentials, for BH (sequence, head) pairs."""
    parts = tl.cast(BH, tl.int64) * SPLITS
    return Part, Part + parts * BLOCK_D, Part + parts * (BLOCK_D + 1)


@triton.jit
def store_partial(Part, SPLITS, BH, bh, split, acc, m_i, l_i, BLOCK_D: tl.constexpr):
    """Split `split` of pair bh's partial (output, max score, sum of exponentials) into the buffer of BH pairs'
    partials; returns partial_buffers(), for the merge that reads them."""
    part = bh * SPLITS + split
    PartO, PartM, PartL = partial_buffers(Part, SPLITS, BH, BLOCK_D)
    tl.store(PartO + part * BLOCK_D + tl.arange(0, BLOCK_D), acc)
    tl.store(PartM + part, m_i)
    tl.store(PartL + part, l_i)
    return PartO, PartM, PartL


@triton.jit
def _decode_merge(PartO, PartM, PartL, bh, SPLITS, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """A (sequence, head)'s normalised output from the partials of all its splits, read in one tile
    (kernels.parts.softmax.merge). Both launch modes call it on the same tile shapes, so neither the order the
    splits ran in nor the mode changes the sums (on a GPU, only a different num_warps, which lays the tile out
    differently, could)."""
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    s_mask = splits < SPLITS
    # .cg: from L2. In one launch the last split to arrive reads what other programs stored; a 32-byte sector of
    # maxima can hold two pairs', and an SM that merged one pair may hold the sector from before the other's stores.
    at = bh * SPLITS + splits
    m = tl.load(PartM + at, mask=s_mask, other=float("-inf"), cache_modifier=".cg")
    sums = tl.load(PartL + at, mask=s_mask, other=0.0, cache_modifier=".cg")
    part = tl.load(PartO + at[:, None] * BLOCK_D + dims[None, :], mask=s_mask[:, None], other=0.0, cache_modifier=".cg")
    return merge(m, sums, part, 0)


@triton.jit
def split_partial(
    bh,
    split,
    query,
    keys,
    values,
    early,
    H,
    CHUNK,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PREFETCH: tl.constexpr,
    DOT: tl.constexpr,
):
    """Split `split` of (sequence, head) pair bh's keys, CHUNK of them from split * CHUNK up to its length,
    after the wait: the partial (unnormalised output, max score, sum of exponentials). early = early_rows(...):
    the length, and with PREFETCH the tile loaded before the wait; DOT: a split of several key tiles, on the
    tensor cores (_chunk_dot), else one on the vector units (_chunk_vector)."""
    b, h = bh // H, bh % H
    length, old = early
    lo = split * CHUNK
    hi = min(lo + CHUNK, length)
    if PREFETCH:
        acc, m_i, l_i = _tile_after_wait(
            old, query, keys, values, b, h, lo, length, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D
        )
    elif DOT:
        acc, m_i, l_i = _chunk_dot(query, keys, values, b, h, lo, hi, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D)
    else:
        acc, m_i, l_i = _chunk_vector(query, keys, values, b, h, lo, hi, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D)
    return acc, m_i, l_i


@triton.jit
def _decode_partial_kernel(
    query,
    keys,
    values,
    Lengths,
    Part,
    H,
    SPLITS,
    CHUNK,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PREFETCH: tl.constexpr,
    DOT: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    early = early_rows(keys, values, Lengths, bh, split, H, CHUNK, HEAD_DIM, BLOCK_N, BLOCK_D, PREFETCH=PREFETCH)
    acc, m_i, l_i = split_partial(
        bh,
        split,
        query,
        keys,
        values,
        early,
        H,
        CHUNK,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        PREFETCH=PREFETCH,
        DOT=DOT,
    )
    store_partial(Part, SPLITS, tl.num_programs(0), bh, split, acc, m_i, l_i, BLOCK_D)
    stamps.end(Stamps)


@triton.jit
def _decode_merge_kernel(
    Part, out, H, SPLITS, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, Stamps
):
    stamps.begin(Stamps)
    bh = tl.program_id(0).to(tl.int64)
    b, h = bh // H, bh % H
    PartO, PartM, PartL = partial_buffers(Part, SPLITS, tl.num_programs(0), BLOCK_D)
    _store_row(out, b, h, _decode_merge(PartO, PartM, PartL, bh, SPLITS, BLOCK_S, BLOCK_D), HEAD_DIM, BLOCK_D)
    stamps.end(Stamps)


@triton.jit
def _store_row(out, b, h, o, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """o into out's row of (sequence b, head h): out = (Out, stride_b, stride_h, stride_d)."""
    Out, stride_ob, stride_oh, stride_od = out
    dims = tl.arange(0, BLOCK_D)
    tl.store(Out + b * stride_ob + h * stride_oh + dims * stride_od, o.to(Out.dtype.element_ty), mask=dims < HEAD_DIM)


@triton.jit
def _decode_one_launch_kernel(
    query,
    keys,
    values,
    out,
    Lengths,
    partial,
    H,
    CHUNK,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    DOT: tl.constexpr,
    Stamps,
):
    # Under PDL (kernels.pdl) the next kernel may start loading its weights now. This one reads the lengths
    # before its wait, and with PREFETCH (a chunk of one key tile) the cache rows of earlier steps too; the
    # caller guarantees that the kernel just before writes nothing it reads but q and each newest row.
    stamps.begin(Stamps)
    pdl.launch_dependents(PDL)
    bh, split = tl.program_id(0).to(tl.int64), tl.program_id(1)
    early = early_rows(keys, values, Lengths, bh, split, H, CHUNK, HEAD_DIM, BLOCK_N, BLOCK_D, PREFETCH=PREFETCH)
    pdl.wait(PDL)
    attend_item(
        bh,
        split,
        tl.num_programs(0),
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
        PREFETCH=PREFETCH,
        DOT=DOT,
    )
    stamps.end(Stamps)


@triton.jit
def attend_item(
    bh,
    split,
    BH,
    query,
    keys,
    values,
    out,
    early,
    partial,
    H,
    CHUNK,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PREFETCH: tl.constexpr,
    DOT: tl.constexpr,
):
    """Split `split` of (sequence, head) pair bh, of BH pairs, after its wait: its partial (split_partial), and
    the merge when it arrives last; with partial None (one split), the whole answer. query, out = (tensor,
    stride_b, stride_h, stride_d); keys, values = (cache, stride_b, stride_h, stride_n, stride_d); early =
    early_rows(...), PREFETCH as it was called with; partial = (Part, Counters, splits). The one-launch kernel
    runs one per program, the decode layer kernel many."""
    b, h = bh // H, bh % H
    acc, m_i, l_i = split_partial(
        bh,
        split,
        query,
        keys,
        values,
        early,
        H,
        CHUNK,
        qk_scale,
        HEAD_DIM,
        BLOCK_N,
        BLOCK_D,
        PREFETCH=PREFETCH,
        DOT=DOT,
    )
    if partial is not None:
        Part, Counters, SPLITS = partial
        PartO, PartM, PartL = store_partial(Part, SPLITS, BH, bh, split, acc, m_i, l_i, BLOCK_D)
        # Every thread's partial stores are issued before the barrier, and the barrier comes before the
        # release half of the atomic: a program that sees this arrival sees this program's partial.
        tl.debug_barrier()
        arrived = tl.atomic_add(Counters + bh, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            # The last to arrive. Its loads come after the acquire half of its atomic, which saw every
            # other split's release, so they read the partials those splits stored.
            _store_row(out, b, h, _decode_merge(PartO, PartM, PartL, bh, SPLITS, BLOCK_S, BLOCK_D), HEAD_DIM, BLOCK_D)
            tl.store(Counters + bh, 0)  # every split has arrived: nothing else touches the slot this launch
    else:
        # One split: its partial is the whole answer, normalised as the merge normalises it (weight 1).
        _store_row(out, b, h, acc / tl.where(l_i > 0, l_i, 1.0), HEAD_DIM, BLOCK_D)


def decode_attention(q, k_cache, v_cache, lengths, *, config=None, one_launch=False, pdl=False):
    """One query per sequence over its cache: q (B, H, 1, D), caches (B, H, T_max, D), keys [0, lengths[b]).

    A sequence of length 0 attends to nothing and gets zeros. one_launch=False runs the partial and
    merge kernels; one_launch=True runs one kernel whose last split to finish for a (sequence, head)
    merges its partials (kernels.arrival), with the same result. With pdl=True as well, that kernel is
    launched with programmatic dependent launch where the GPU has it (kernels.pdl): the kernel after it may
    start early, and this one loads the lengths (and, where each split is one key tile, the keys and values
    below lengths[b] - 1) before it waits for the kernel before it. So pdl=True is for a caller (the decode
    step) whose previous kernel writes nothing this one reads except q and each sequence's newest row."""
    check_qkv("decode_attention", q, k_cache, v_cache)
    batch, heads, tq, head_dim = q.shape
    max_len = k_cache.shape[2]
    if tq != 1:
        raise ValueError(f"decode_attention: q must hold one new token per sequence (B, H, 1, D), got {tuple(q.shape)}")
    device = q.device  # once: each read builds a torch.device, which costs the host more than a check
    if lengths.shape != (batch,) or lengths.dtype not in (torch.int32, torch.int64) or lengths.device != device:
        raise ValueError(f"decode_attention: lengths must be an int32/int64 tensor of shape ({batch},) on {q.device}")
    if not isinstance(one_launch, bool):
        raise ValueError(f"decode_attention: one_launch must be True or False, got {one_launch!r}")
    if config == "autotune":
        config = tuned_decode_config(q, k_cache, v_cache, lengths, one_launch=one_launch)
    plan = launch_plan(config, batch * heads, max_len, head_dim, q.dtype, device)
    cfg, chunk, splits, block_d, block_s, prefetch, dot, scale, overlaps = plan
    pdl = bool(pdl) and one_launch and overlaps
    o = new_output(q)
    if o.numel() == 0:
        return o
    part = counters = None  # one launch of one split: each (sequence, head)'s one program writes o, no partials
    if splits > 1 or not one_launch:  # one allocation for the three kinds of partial (partial_buffers): each costs the
        part = new_output(q, (batch * heads * splits * (block_d + 2),), torch.float32)  # host more than its bytes
        counters = _arrival_counters(device, batch * heads) if one_launch else None
    # Each tensor with its strides, as the kernels take them: q and o (B, H, 1, D) by sequence, head and dim.
    sq, so = q.stride(), o.stride()
    query, out = (q, sq[0], sq[1], sq[3]), (o, so[0], so[1], so[3])
    keys, values = (k_cache, *k_cache.stride()), (v_cache, *v_cache.stride())
    with explain_resources("decode_attention", cfg):
        if one_launch:
            launch.fast(_decode_one_launch_kernel)[(batch * heads, splits)](
                query,
                keys,
                values,
                out,
                lengths,
                (part, counters, splits) if splits > 1 else None,
                heads,
                chunk,
                scale,
                HEAD_DIM=head_dim,
                BLOCK_N=cfg.block_n,
                BLOCK_S=block_s,
                BLOCK_D=block_d,
                PDL=pdl,
                PREFETCH=prefetch,
                DOT=dot,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
                launch_pdl=pdl,
            )
            return o
        launch.fast(_decode_partial_kernel)[(batch * heads, splits)](
            query,
            keys,
            values,
            lengths,
            part,
            heads,
            splits,
            chunk,
            scale,
            HEAD_DIM=head_dim,
            BLOCK_N=cfg.block_n,
            BLOCK_D=block_d,
            PREFETCH=prefetch,
            DOT=dot,
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
        launch.fast(_decode_merge_kernel)[(batch * heads,)](
            part, out, heads, splits, HEAD_DIM=head_dim, BLOCK_S=block_s, BLOCK_D=block_d, num_warps=4
        )
    return o


def _arrival_counters(device, needed: int):
    """kernels.arrival's counters, with a refusal that names the kernel and the way out."""
    try:
        return arrival.counters(device, needed)
    except ValueError as e:
        raise ValueError(
            f"decode_attention: one_launch=True with {needed} (sequence, head) pairs: {e}; "
            "use one_launch=False, or fewer sequences"
        ) from None


def tuned_decode_config(q, k_cache, v_cache, lengths, *, one_launch=False):
    """As tuned_config, for decode_attention; keyed by the cache size, not the lengths' values, so it is
    timed over full caches (the lengths at tuning time may be short). The one-launch kernel is tuned on
    its own: without a second launch, more splits may pay."""
    run = lambda c, q, k, v, n: decode_attention(q, k, v, n, config=c, one_launch=one_launch)
    full = torch.full_like(lengths, k_cache.shape[2])
    key = (*q.shape, k_cache.shape[2], q.dtype) + (("one_launch",) if one_launch else ())
    return autotune.pick("decode_attention", key, run, q.device, inputs=(q, k_cache, v_cache, full))
