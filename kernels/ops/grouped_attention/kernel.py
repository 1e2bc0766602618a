"""Prefill attention with grouped-query heads: flash attention in which a few key/value heads each serve a
group of G query heads.

One program per (sequence, key/value head, block of query positions) holds the G query heads' rows for those
positions as one tile of BLOCK_R rows (position-major: row r is head r % G at position r // G, so BLOCK_R // G
positions per program and at most G - 1 rows idle, where padding G to a power of two would idle a quarter of
SmolLM2's tile), so each tile of keys and values is read once for the whole group instead of once per query
head. The key tiles are the flash kernel's own loop (kernel.attend_tiles: the shared online softmax, the
tiles below the diagonal unmasked); its causal mask reads each row's position, so it holds for any layout of
rows. Causal masking is bottom-right aligned, as the other attention kernels align it: query i sits at key
position Tk - Tq + i.
"""

import math

import torch
import triton
import triton.language as tl

from ... import launch, stamps
from ...config import (
    TileConfig,
    Traffic,
    cdiv,
    device_limits,
    explain_resources,
    new_output,
    next_pow2,
    pipeline_stages,
)
from ..attention.kernel import LOG2E, attend_tiles
from ..grouped_decode_attention.kernel import check_groups


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("tq", "tk"))
def _grouped_attention_kernel(
    Q,
    K,
    V,
    Out,
    q_strides,  # (batch, head, position, dim)
    k_strides,
    v_strides,
    kv_heads,
    group,
    tq,
    tk,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    bk = tl.program_id(1).to(tl.int64)
    b, kv = bk // kv_heads, bk % kv_heads
    positions = BLOCK_R // group  # query positions per program, each with its group's G heads
    first = tl.program_id(0) * positions
    r = tl.arange(0, BLOCK_R)
    pos, head = first + r // group, kv * group + r % group
    dims = tl.arange(0, BLOCK_D)
    row_ok = (r < positions * group) & (pos < tq)
    q_mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    sqb, sqh, sqt, sqd = q_strides
    q = tl.load(Q + b * sqb + head[:, None] * sqh + pos[:, None] * sqt + dims[None, :] * sqd, mask=q_mask, other=0.0)
    skb, skh, skt, skd = k_strides
    svb, svh, svt, svd = v_strides

    m_i = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
    offset = tk - tq  # key position of query 0
    if CAUSAL:
        full_hi = (offset + first + 1) // BLOCK_N * BLOCK_N
        hi = tl.minimum(offset + first + positions, tk)
    else:
        full_hi = tk // BLOCK_N * BLOCK_N
        hi = tk
    K, V = K + b * skb + kv * skh, V + b * svb + kv * svh
    # The key tiles every row sees in full, unmasked, then the tiles the diagonal crosses (or the last, partial
    # tile), masked.
    acc, l_i, m_i = attend_tiles(
        acc,
        l_i,
        m_i,
        q,
        (K, skt, skd),
        (V, svt, svd),
        pos,
        dims,
        0,
        full_hi,
        tk,
        offset,
        scale_log2,
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
        q,
        (K, skt, skd),
        (V, svt, svd),
        pos,
        dims,
        full_hi,
        hi,
        tk,
        offset,
        scale_log2,
        MASKED=True,
        CAUSAL=CAUSAL,
        HEAD_DIM=HEAD_DIM,
        PRECISION=PRECISION,
        BLOCK_N=BLOCK_N,
    )
    o = acc / l_i[:, None]  # every row saw a key, or only masked scores (finite: weight 1 each, never 0 / 0)
    heads = kv_heads * group
    out = Out + ((b * heads + head[:, None]) * tq + pos[:, None]) * HEAD_DIM + dims[None, :]  # contiguous
    tl.store(out, o.to(Out.dtype.element_ty), mask=q_mask)
    stamps.end(Stamps)


def tiles(batch, kv_heads, group, tq, device, block_m=None, block_n=None, num_warps=None) -> tuple[int, int, int]:
    """(rows per query tile, keys per tile, warps): grouped_attention's defaults, where not given."""
    limits = device_limits(device)
    wide = limits.is_cpu or cdiv(tq, max(1, 128 // group)) * batch * kv_heads >= 4 * limits.num_sms
    block_r = max(16, next_pow2(group), block_m or (128 if wide else 64))
    return block_r, block_n or (128 if limits.is_cpu else 64), num_warps or (8 if wide and not limits.is_cpu else 4)


def grouped_attention(q, k, v, *, causal=True, block_m=None, block_n=None, num_warps=None):
    """Flash attention with grouped-query heads: q (B, H, Tq, D), k and v (B, H_kv, Tk, D), H a multiple of
    H_kv (query head h reads key/value head h // (H / H_kv)), Tk >= Tq -> o like q.

    block_m: rows of the query tile, each a (position, query head) of one group, so block_m // G positions per
    program (G = H / H_kv); block_n: keys per tile. On a GPU 64-key tiles, and 64 rows in 4 warps, or 128 rows
    in 8 warps where those still make four programs per SM (the fastest of 18 tilings at B=1 and 1024 positions,
    and at B=4 and 4096, on an H200: experiments/README.md, grouped_sweep); on CPU 128 rows over 128-key tiles (the
    interpreter's cost is per program and loop step)."""
    group = check_groups("grouped_attention", q, k, v)
    batch, heads, tq, head_dim = q.shape
    kv_heads, tk = k.shape[1], k.shape[2]
    if tk < tq:
        raise ValueError(f"grouped_attention: keys ({tk}) must be at least as many as queries ({tq})")
    block_r, block_n, num_warps = tiles(batch, kv_heads, group, tq, q.device, block_m, block_n, num_warps)
    block_d = max(16, next_pow2(head_dim))
    o = new_output(q, (batch, heads, tq, head_dim))
    if o.numel():
        with explain_resources("grouped_attention", TileConfig(block_m=block_r, block_n=block_n)):
            launch.fast(_grouped_attention_kernel)[(cdiv(tq, block_r // group), batch * kv_heads)](
                q,
                k,
                v,
                o,
                q.stride(),
                k.stride(),
                v.stride(),
                kv_heads,
                group,
                tq,
                tk,
                LOG2E / math.sqrt(head_dim),
                HEAD_DIM=head_dim,
                CAUSAL=causal,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                BLOCK_R=block_r,
                BLOCK_N=block_n,
                BLOCK_D=block_d,
                num_warps=num_warps,
                num_stages=pipeline_stages(q.device),
            )
    return o


def traffic(batch, heads, kv_heads, tq, tk, head_dim, itemsize, *, causal=True, device="cpu") -> Traffic:
    """One launch at grouped_attention's default tiles. SM requests: each query row read and each output row
    written once; each program loads its key/value head's tiles up to its last row's diagonal (the crossing
    tile in full), once for its group's G heads. HBM: q, k, v and o once, the key/value re-reads of later
    programs served by the L2 (a key/value head's rows are a few hundred KB at SmolLM2's shape). Not yet
    checked against ncu's counters."""
    group = heads // kv_heads
    block_r, block_n, _ = tiles(batch, kv_heads, group, tq, device)
    positions, offset = block_r // group, tk - tq
    keys_loaded = 0
    for first in range(0, tq, positions):
        hi = min(offset + first + positions, tk) if causal else tk
        keys_loaded += min(cdiv(hi, block_n) * block_n, tk)
    row = head_dim * itemsize
    q_bytes, kv_bytes = batch * heads * tq * row, 2 * batch * kv_heads * tk * row
    flops = 4 * batch * heads * head_dim * sum(min(tk, offset + i + 1) if causal else tk for i in range(tq))
    loaded = q_bytes + 2 * batch * kv_heads * keys_loaded * row
    return Traffic(loaded, q_bytes, flops, 2 * q_bytes + kv_bytes, q_bytes + kv_bytes, q_bytes)
