"""Prefill attention with grouped-query heads: flash attention in which a few key/value heads each serve a
group of G query heads.

One program per (sequence, key/value head, block of query positions) holds the G query heads' rows for those
positions as one tile of G x BLOCK_M rows (head-major: row r is head r // BLOCK_M at position r % BLOCK_M),
so each tile of keys and values is read once for the whole group instead of once per query head. Scores go
through the shared online softmax (softmax.online_step). Causal masking is bottom-right aligned, as the
other attention kernels align it: query i sits at key position Tk - Tq + i.
"""

import math

import torch
import triton
import triton.language as tl

from .. import launch
from ..config import TileConfig, cdiv, explain_resources, new_output, next_pow2
from .grouped import check_groups
from .softmax import online_step


@triton.jit
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
    BLOCK_M: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    bk = tl.program_id(1).to(tl.int64)
    b, kv = bk // kv_heads, bk % kv_heads
    r = tl.arange(0, BLOCK_G * BLOCK_M)
    g, pos = r // BLOCK_M, tl.program_id(0) * BLOCK_M + r % BLOCK_M
    head = kv * group + g
    dims, keys = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    row_ok = (g < group) & (pos < tq)
    q_mask = row_ok[:, None] & (dims < HEAD_DIM)[None, :]
    sqb, sqh, sqt, sqd = q_strides
    q = tl.load(Q + b * sqb + head[:, None] * sqh + pos[:, None] * sqt + dims[None, :] * sqd, mask=q_mask, other=0.0)
    skb, skh, skt, skd = k_strides
    svb, svh, svt, svd = v_strides
    k_base = K + b * skb + kv * skh + dims[None, :] * skd
    v_base = V + b * svb + kv * svh + dims[None, :] * svd

    last = tk - tq + pos  # the last key each query row may see
    end = tk
    if CAUSAL:
        end = tl.minimum(tk, tk - tq + (tl.program_id(0) + 1) * BLOCK_M)
    m_i = tl.full((BLOCK_G * BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G * BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_G * BLOCK_M, BLOCK_D), tl.float32)
    for start in range(0, end, BLOCK_N):
        kpos = start + keys
        kv_mask = (kpos < tk)[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(k_base + kpos[:, None].to(tl.int64) * skt, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        seen = (kpos < tk)[None, :]
        if CAUSAL:
            seen = seen & (kpos[None, :] <= last[:, None])
        # A row with no key seen yet (a padded row, or an early query in a late tile) keeps a finite max.
        scores = tl.where(seen, scores, -1.0e30)
        m_i, alpha, p, l_i = online_step(m_i, l_i, scores, 1)
        p = tl.where(seen, p, 0.0)
        v = tl.load(v_base + kpos[:, None].to(tl.int64) * svt, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    heads = kv_heads * group
    out = Out + ((b * heads + head[:, None]) * tq + pos[:, None]) * HEAD_DIM + dims[None, :]  # contiguous
    tl.store(out, o.to(Out.dtype.element_ty), mask=q_mask)


def grouped_attention(q, k, v, *, causal=True, block_m=None, block_n=None):
    """Flash attention with grouped-query heads: q (B, H, Tq, D), k and v (B, H_kv, Tk, D), H a multiple of
    H_kv (query head h reads key/value head h // (H / H_kv)), Tk >= Tq -> o like q."""
    group = check_groups("grouped_attention", q, k, v)
    batch, heads, tq, head_dim = q.shape
    kv_heads, tk = k.shape[1], k.shape[2]
    if tk < tq:
        raise ValueError(f"grouped_attention: keys ({tk}) must be at least as many as queries ({tq})")
    block_g = next_pow2(group)
    block_m = block_m or max(1, min(64, 64 // block_g, next_pow2(tq)))
    if block_g * block_m < 16:
        block_m = 16 // block_g  # the dot's tile needs 16 rows
    block_n = block_n or 32
    block_d = max(16, next_pow2(head_dim))
    o = new_output(q, (batch, heads, tq, head_dim))
    if o.numel():
        with explain_resources("grouped_attention", TileConfig(block_m=block_m, block_n=block_n)):
            launch.fast(_grouped_attention_kernel)[(cdiv(tq, block_m), batch * kv_heads)](
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
                math.log2(math.e) / math.sqrt(head_dim),
                HEAD_DIM=head_dim,
                CAUSAL=causal,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                BLOCK_M=block_m,
                BLOCK_G=block_g,
                BLOCK_N=block_n,
                BLOCK_D=block_d,
            )
    return o
