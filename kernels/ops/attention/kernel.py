"""Causal flash attention (prefill); decode attention (one query per sequence) is in attention_decode.

attention: o = softmax(q k^T / sqrt(D) + mask) v for q (B, H, Tq, D) and k, v (B, H, Tk, D), Tk >= Tq.
With causal=True query i sits at key position Tk - Tq + i (bottom-right aligned), so the same
kernel runs prefill over a fresh prompt (Tk == Tq) and a chunk of new tokens over a cache that
already holds a prefix (Tk > Tq). Each program keeps one BLOCK_M tile of queries in SRAM and
streams BLOCK_N tiles of K and V past it with an online softmax: the Tq x Tk score matrix lives only
in registers, and K and V are read once per query tile (so BLOCK_M sets how often). Key tiles wholly
below the diagonal skip the mask arithmetic; only the tiles it crosses pay for it.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from ... import autotune, launch, stamps
from ...config import (
    TileConfig,
    Traffic,
    as_config,
    buffered_stages,
    cdiv,
    check_dtype,
    check_fields,
    check_shared_memory,
    device_limits,
    explain_resources,
    fit_defaults,
    l2_miss,
    new_output,
    next_pow2,
    pipeline_stages,
    resident_programs,
)
from ...parts.softmax import online_step

LOG2E = 1.4426950408889634
MASKED_SCORE = tl.constexpr(-1.0e30)  # finite, so a row whose first tile is all masked gives no inf - inf = NaN


@triton.jit
def attend_tiles(
    acc,
    l_i,
    m_i,
    q,
    keys,
    values,
    rows,
    dims,
    lo,
    hi,
    TK,
    offset,
    qk_scale,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The online softmax over key tiles [lo, hi) of one head for the query tile q at positions rows: keys =
    (K, stride over keys, stride over dims) and values alike, both at the head's first key. MASKED: the
    tiles past TK or (CAUSAL) past the diagonal, where scores are masked; without it no mask is computed."""
    K, stride_kn, stride_kd = keys
    V, stride_vn, stride_vd = values
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_mask = dims[None, :] < HEAD_DIM
        if MASKED:
            kv_mask = kv_mask & (cols < TK)[:, None]
        k = tl.load(K + cols[:, None] * stride_kn + dims[None, :] * stride_kd, mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        if MASKED:
            keep = (cols < TK)[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None] + offset)
            qk = tl.where(keep, qk, MASKED_SCORE)
        m_new, alpha, p, l_i = online_step(m_i, l_i, qk, 1)
        v = tl.load(V + cols[:, None] * stride_vn + dims[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("TQ", "TK"))
def _attention_kernel(
    q,
    k,
    v,
    out,
    H,
    TQ,
    TK,
    qk_scale,
    CAUSAL: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    Stamps,
):
    """q, k, v and out each (tensor, stride over batch, head, position, dim)."""
    stamps.begin(Stamps)
    Q, stride_qb, stride_qh, stride_qm, stride_qd = q
    K, stride_kb, stride_kh, stride_kn, stride_kd = k
    V, stride_vb, stride_vh, stride_vn, stride_vd = v
    Out, stride_ob, stride_oh, stride_om, stride_od = out
    start_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // H, bh % H
    Q += b * stride_qb + h * stride_qh
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    Out += b * stride_ob + h * stride_oh

    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q_mask = (rows < TQ)[:, None] & (dims < HEAD_DIM)[None, :]
    queries = tl.load(Q + rows[:, None] * stride_qm + dims[None, :] * stride_qd, mask=q_mask, other=0.0)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    offset = TK - TQ  # key position of query 0
    if CAUSAL:
        # Tiles every query of this tile may see in full, then the tiles the diagonal crosses.
        full_hi = (offset + start_m * BLOCK_M + 1) // BLOCK_N * BLOCK_N
        hi = min(offset + (start_m + 1) * BLOCK_M, TK)
    else:
        full_hi = TK // BLOCK_N * BLOCK_N
        hi = TK
    acc, l_i, m_i = attend_tiles(
        acc,
        l_i,
        m_i,
        queries,
        (K, stride_kn, stride_kd),
        (V, stride_vn, stride_vd),
        rows,
        dims,
        0,
        full_hi,
        TK,
        offset,
        qk_scale,
        MASKED=False,
        CAUSAL=CAUSAL,
        HEAD_DIM=HEAD_DIM,
        PRECISION=PRECISION,
        BLOCK_N=BLOCK_N,
    )
    acc, l_i, m_i = attend_tiles(
        acc,
        l_i,
        m_i,
        queries,
        (K, stride_kn, stride_kd),
        (V, stride_vn, stride_vd),
        rows,
        dims,
        full_hi,
        hi,
        TK,
        offset,
        qk_scale,
        MASKED=True,
        CAUSAL=CAUSAL,
        HEAD_DIM=HEAD_DIM,
        PRECISION=PRECISION,
        BLOCK_N=BLOCK_N,
    )
    o = acc / l_i[:, None]
    tl.store(Out + rows[:, None] * stride_om + dims[None, :] * stride_od, o.to(Out.dtype.element_ty), mask=q_mask)
    stamps.end(Stamps)


def default_config(tq: int, head_dim: int, device) -> TileConfig:
    """Query tiles over 64-key tiles: 64 queries and 4 warps for heads of up to 64 dims (the fastest of
    24 configs at GPT-2's shape on an H200, see benchmarks/RESULTS.md), 128 queries and 8 warps for
    larger heads, fewer for short prompts. On CPU, 128 queries over 128-key tiles: the interpreter's cost is
    per program and per loop step, not per element. resolve_config shrinks what the device's shared memory
    cannot hold (fp32, large heads, small GPUs; on CPU, fp32 query tiles of 64 or more keep 64-key tiles)."""
    cpu = device_limits(device).is_cpu
    largest = 128 if head_dim > 64 or cpu else 64
    block_m = max(16, min(largest, next_pow2(tq)))
    num_warps = 8 if block_m == 128 and head_dim > 64 else 4
    block_n = 128 if cpu else 64
    return TileConfig(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=pipeline_stages(device))


def shared_memory(cfg: TileConfig, head_dim: int, itemsize: int, device) -> int:
    """Bytes of shared memory the flash kernel needs: the query tile, K and V tiles per pipeline stage,
    and the probability tile (staged through shared memory on Turing)."""
    block_d = max(16, next_pow2(head_dim))
    stages = buffered_stages(cfg.num_stages, device)
    return (cfg.block_m * block_d + 2 * stages * cfg.block_n * block_d + cfg.block_m * cfg.block_n) * itemsize


@functools.lru_cache(maxsize=1024)  # called on every launch: resolve each shape once
def resolve_config(config, tq, head_dim, dtype, device) -> TileConfig:
    itemsize = torch.empty((), dtype=dtype).element_size()
    user = as_config("attention", config)
    check_fields("attention", user)
    cfg = user.merged(default_config(tq, head_dim, device))
    cfg = fit_defaults("attention", cfg, user, lambda c: shared_memory(c, head_dim, itemsize, device), device)
    block_d = max(16, next_pow2(head_dim))
    need = shared_memory(cfg, head_dim, itemsize, device)
    what = f"a {cfg.block_m}x{block_d} query tile and {cfg.num_stages} stages of {cfg.block_n}x{block_d} K and V tiles"
    check_shared_memory("attention", cfg, need, device, what)
    return cfg


def check_qkv(name, q, k, v):
    check_dtype(name, q)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"{name}: q, k and v must be 4-D (B, H, T, D)")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"{name}: shapes do not match: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{name}: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not 1 <= q.shape[3] <= 256:
        raise ValueError(f"{name}: head dimension {q.shape[3]} is not supported (allowed: 1 to 256)")


def attention(q, k, v, *, causal=True, config=None):
    """Flash attention forward; q (B, H, Tq, D), k and v (B, H, Tk, D) with Tk >= Tq -> o like q."""
    check_qkv("attention", q, k, v)
    batch, heads, tq, head_dim = q.shape
    tk = k.shape[2]
    if tk < tq:
        raise ValueError(f"attention: keys ({tk}) must be at least as many as queries ({tq})")
    if config == "autotune":
        config = tuned_config(q, k, v, causal=causal)
    cfg = resolve_config(config, tq, head_dim, q.dtype, q.device)
    # Stored as (B, Tq, H, D) and returned as its (B, H, Tq, D) view, so merging the heads back into
    # (B, Tq, H * D) for the output projection is free.
    o = new_output(q, (batch, tq, heads, head_dim)).transpose(1, 2)
    if o.numel() == 0:
        return o
    grid = (cdiv(tq, cfg.block_m), batch * heads)
    with explain_resources("attention", cfg):
        launch.fast(_attention_kernel)[grid](
            (q, *q.stride()),
            (k, *k.stride()),
            (v, *v.stride()),
            (o, *o.stride()),
            heads,
            tq,
            tk,
            LOG2E / math.sqrt(head_dim),
            CAUSAL=causal,
            HEAD_DIM=head_dim,
            PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_D=max(16, next_pow2(head_dim)),
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
        )
    return o


def tuned_config(q, k, v, *, causal=True):
    """The fastest candidate tiles for inputs like these (timed once per shape on a GPU, over random copies
    rotated past L2; defaults on CPU)."""
    run = lambda c, q, k, v: attention(q, k, v, causal=causal, config=c)
    return autotune.pick("attention", (*q.shape, k.shape[2], q.dtype, causal), run, q.device, inputs=(q, k, v))


def _visible_keys(tq: int, tk: int, causal: bool) -> int:
    """Query-key pairs the mask lets through."""
    if not causal:
        return tq * tk
    offset = tk - tq
    return tq * offset + tq * (tq + 1) // 2


def traffic(batch, heads, tq, tk, head_dim, itemsize, *, causal=True, config=None, dtype=torch.float16, device="cpu"):
    """Modeled traffic of the flash kernel.

    SM requests: Q read and O written once; each query tile loads the key tiles up to its diagonal (the
    tile the diagonal crosses in full: its upper part is masked after the load), all of them without
    the mask, so a taller BLOCK_M means fewer passes over K and V. Nothing above the crossing tile is
    loaded. (The H200's 15.4 MB at B1 H12 T1024 matches the 128-query tiles that were the default
    before 64, 15.7 MB here, not today's 28.3; at B4 T4096 it counted 1547 MB against 1661 for the
    64-query tiles: re-measure with kernels.ncu_check, which prints the tiles each row ran with.)
    HBM: Q, K and V once. Programs run query tile first, so the query tiles of one (batch, head) pair
    that start in the same wave stream its key tiles side by side: their re-reads are L2 hits. Query
    tiles that start a wave later (long prompts: more tiles than resident programs) re-read K and V
    from L2 while the K and V of the pairs in flight fit the usable L2 (config.l2_miss)."""
    cfg = resolve_config(config, tq, head_dim, dtype, device)
    offset = tk - tq
    q_tiles = cdiv(tq, cfg.block_m)
    in_flight = resident_programs(shared_memory(cfg, head_dim, itemsize, device), device)
    keys_loaded = later_keys = 0
    for m in range(q_tiles):
        hi = min(offset + (m + 1) * cfg.block_m, tk) if causal else tk
        keys = min(cdiv(hi, cfg.block_n) * cfg.block_n, tk)
        keys_loaded += keys
        later_keys += keys if m >= in_flight else 0  # starts after the pair's first wave
    row = batch * heads * head_dim * itemsize
    q_bytes, kv_bytes = tq * row, 2 * tk * row
    flops = 4 * batch * heads * head_dim * _visible_keys(tq, tk, causal)
    kv_loaded = 2 * keys_loaded * row
    working_set = 2 * tk * head_dim * itemsize * max(1, cdiv(in_flight, q_tiles))
    later_share = later_keys / keys_loaded if keys_loaded else 0.0
    hbm = q_bytes + kv_bytes + round(max(0, kv_loaded - kv_bytes) * later_share * l2_miss(working_set, device))
    return Traffic(q_bytes + kv_loaded, q_bytes, flops, 2 * q_bytes + kv_bytes, hbm, q_bytes)


def traffic_floor(batch, heads, tq, tk, head_dim, itemsize, *, causal=True):
    """Any fused attention at its floor: q, k and v read once, o written once (at both levels)."""
    row = batch * heads * head_dim * itemsize
    flops = 4 * batch * heads * head_dim * _visible_keys(tq, tk, causal)
    return Traffic((tq + 2 * tk) * row, tq * row, flops, (2 * tq + 2 * tk) * row)


def traffic_naive(batch, heads, tq, tk, head_dim, itemsize, *, causal=True, device="cpu"):
    """Unfused attention: S = q k^T written to memory, softmax reads S and writes P, then P v reads P.
    The Tq x Tk matrices make four extra passes through L2; at the HBM level S and P are written
    (eventually reaching HBM) and read back from L2 while one of them fits the usable L2."""
    row = batch * heads * head_dim * itemsize
    scores = batch * heads * tq * tk * itemsize
    q_bytes, kv_bytes = tq * row, 2 * tk * row
    flops = 4 * batch * heads * head_dim * _visible_keys(tq, tk, causal) + 5 * batch * heads * tq * tk
    reads = q_bytes + kv_bytes + 2 * scores
    writes = 2 * scores + q_bytes
    hbm = q_bytes + kv_bytes + round(2 * scores * l2_miss(scores, device))
    return Traffic(reads, writes, flops, 2 * q_bytes + kv_bytes, hbm, writes)
