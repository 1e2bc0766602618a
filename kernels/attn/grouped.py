"""Decode attention with grouped-query heads (the Llama family's): a few key/value heads each serve a group of
query heads, and the KV cache holds only those few.

    o[b, h] = softmax(q[b, h] . K[b, h // G, :n]^T / sqrt(D)) V[b, h // G, :n]      G = query heads per KV head

One program per (sequence, key/value head) walks that head's keys once, for all G queries of its group
together: the G query rows form one tile (padded to 16 rows for the tensor cores' dot), so every key and
value row is read from memory once per sequence, not once per query head. Each tile of keys goes through
the online softmax (softmax.online_step), as in flash attention.
"""

import math

import torch
import triton
import triton.language as tl

from .. import launch
from ..config import SECTOR, TileConfig, Traffic, explain_resources, new_output, next_pow2
from .kernel import check_qkv
from .softmax import online_step


@triton.jit
def _grouped_decode_kernel(
    Q,
    K,
    V,
    Out,
    Lengths,
    q_strides,  # (batch, head, dim)
    k_strides,  # (batch, head, position, dim)
    v_strides,
    kv_heads,
    group,
    scale_log2,
    HEAD_DIM: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b, kv = pid // kv_heads, pid % kv_heads
    n = tl.load(Lengths + b)
    queries, dims, keys = tl.arange(0, BLOCK_G), tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_N)
    heads = kv * group + queries
    q_mask = (queries < group)[:, None] & (dims < HEAD_DIM)[None, :]
    sqb, sqh, sqd = q_strides
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + dims[None, :] * sqd, mask=q_mask, other=0.0)
    skb, skh, skt, skd = k_strides
    svb, svh, svt, svd = v_strides
    k_base = K + b * skb + kv * skh + dims[None, :] * skd
    v_base = V + b * svb + kv * svh + dims[None, :] * svd

    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for start in range(0, n, BLOCK_N):  # every tile holds at least one key below n: the max stays finite
        pos = start + keys
        kv_mask = (pos < n)[:, None] & (dims < HEAD_DIM)[None, :]
        k = tl.load(k_base + pos[:, None].to(tl.int64) * skt, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
        scores = tl.where((pos < n)[None, :], scores, float("-inf"))
        m_i, alpha, p, l_i = online_step(m_i, l_i, scores, 1)
        v = tl.load(v_base + pos[:, None].to(tl.int64) * svt, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a sequence of length 0 attends to nothing: zeros
    out = Out + (b * kv_heads * group + heads[:, None]) * HEAD_DIM + dims[None, :]  # o is contiguous (B, H, 1, D)
    tl.store(out, o.to(Out.dtype.element_ty), mask=q_mask)


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


def grouped_decode_attention(q, k_cache, v_cache, lengths, *, block_n=None):
    """One query per sequence and head over a cache of fewer heads: q (B, H, 1, D), caches (B, H_kv, T_max, D)
    with H a multiple of H_kv (query head h reads key/value head h // (H / H_kv)), keys [0, lengths[b])."""
    group = check_groups("grouped_decode_attention", q, k_cache, v_cache)
    batch, heads, tq, head_dim = q.shape
    if tq != 1:
        raise ValueError(f"grouped_decode_attention: q must hold one new token per sequence, got {tuple(q.shape)}")
    if lengths.shape != (batch,) or lengths.dtype not in (torch.int32, torch.int64) or lengths.device != q.device:
        raise ValueError(f"grouped_decode_attention: lengths must be an int32/int64 tensor of shape ({batch},)")
    kv_heads = k_cache.shape[1]
    block_d = max(16, next_pow2(head_dim))
    block_g = max(16, next_pow2(group))
    block_n = block_n or (64 if q.device.type == "cpu" else max(16, min(128, 8192 // block_d)))
    o = new_output(q)
    if o.numel():
        with explain_resources("grouped_decode_attention", TileConfig(block_n=block_n)):
            launch.fast(_grouped_decode_kernel)[(batch * kv_heads,)](
                q,
                k_cache,
                v_cache,
                o,
                lengths,
                (q.stride(0), q.stride(1), q.stride(3)),
                k_cache.stride(),
                v_cache.stride(),
                kv_heads,
                group,
                math.log2(math.e) / math.sqrt(head_dim),
                HEAD_DIM=head_dim,
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                BLOCK_G=block_g,
                BLOCK_N=block_n,
                BLOCK_D=block_d,
            )
    return o


def traffic(lengths: list[int], heads: int, kv_heads: int, head_dim: int, itemsize: int) -> Traffic:
    """One launch: each sequence's keys and values below its length read once per key/value head (a group's
    query heads share them), its queries read and outputs written once, and its length read by every one of
    its programs (a sector each). The score and output dots count 4 flops per key, dimension and query head."""
    row = head_dim * itemsize
    kv = sum(2 * kv_heads * n * row for n in lengths)
    qo = len(lengths) * heads * row
    reads = kv + qo + len(lengths) * kv_heads * SECTOR
    flops = sum(4 * heads * n * head_dim for n in lengths)
    return Traffic(reads, qo, flops, kv + 2 * qo, kv + qo + len(lengths) * SECTOR, qo)
