"""The decode step's KV-cache write: each sequence's new K and V row stored at its own position.

    k_cache[b, h, lengths[b], :] = k[b, h, 0, :]      and the same for v

One program per (sequence, head) copies both rows. It replaces two advanced-indexing assignments
and an index conversion per layer (three launches) with one, and reads the positions from the
device, so a decode step stays free of host synchronisation and can be replayed from a CUDA graph.
"""

import torch
import triton
import triton.language as tl

from ... import launch, stamps
from ...config import SECTOR, Traffic, check_dtype, next_pow2, sectors


@triton.jit
def _kv_write_kernel(
    K,
    V,
    KC,
    VC,
    Lengths,
    stride_kb,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vd,
    stride_kcb,
    stride_kch,
    stride_kct,
    stride_kcd,
    stride_vcb,
    stride_vch,
    stride_vct,
    stride_vcd,
    heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    Stamps,
):
    # 64-bit before any pointer arithmetic: b * stride_kcb passes 2^31 elements in a large cache
    # (B=3, T_max=20M, D=64: sequence 2 starts at 2.56e9), and int32 would wrap to a wrong address.
    stamps.begin(Stamps)
    bh = tl.program_id(0).to(tl.int64)
    b = bh // heads
    h = bh % heads
    pos = tl.load(Lengths + b).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    mask = dims < HEAD_DIM
    k = tl.load(K + b * stride_kb + h * stride_kh + dims * stride_kd, mask=mask)
    v = tl.load(V + b * stride_vb + h * stride_vh + dims * stride_vd, mask=mask)
    tl.store(KC + b * stride_kcb + h * stride_kch + pos * stride_kct + dims * stride_kcd, k, mask=mask)
    tl.store(VC + b * stride_vcb + h * stride_vch + pos * stride_vct + dims * stride_vcd, v, mask=mask)
    stamps.end(Stamps)


def kv_write(k, v, k_cache, v_cache, lengths) -> None:
    """Store k and v (B, H, 1, D) into the caches (B, H, T_max, D) at position lengths[b] (0 <= it < T_max,
    which the caller guarantees: the kernel reads the positions on the device and cannot check them)."""
    check_dtype("kv_write", k)
    if k.dim() != 4 or k.shape[2] != 1 or v.shape != k.shape:
        raise ValueError(f"kv_write: k and v must be (B, H, 1, D) alike, got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, heads, _, head_dim = k.shape
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4 or k_cache.shape[:2] != (batch, heads):
        raise ValueError(
            f"kv_write: caches must be (B={batch}, H={heads}, T_max, D={head_dim}) alike, "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"kv_write: cache head dimension {k_cache.shape[3]} does not match k's {head_dim}")
    if len({k.dtype, v.dtype, k_cache.dtype, v_cache.dtype}) != 1:
        raise ValueError(
            f"kv_write: k, v and the caches must share a dtype, got {k.dtype}, {v.dtype}, "
            f"{k_cache.dtype}, {v_cache.dtype}"
        )
    if lengths.shape != (batch,) or lengths.dtype not in (torch.int32, torch.int64) or lengths.device != k.device:
        raise ValueError(f"kv_write: lengths must be a ({batch},) int32 or int64 tensor on {k.device}")
    if k.numel() == 0:
        return
    launch.fast(_kv_write_kernel)[(batch * heads,)](
        k,
        v,
        k_cache,
        v_cache,
        lengths,
        k.stride(0),
        k.stride(1),
        k.stride(3),
        v.stride(0),
        v.stride(1),
        v.stride(3),
        *k_cache.stride(),
        *v_cache.stride(),
        heads,
        HEAD_DIM=head_dim,
        BLOCK_D=max(16, next_pow2(head_dim)),
        num_warps=1,  # a row of D elements each
    )


def traffic(batch: int, heads: int, head_dim: int, itemsize: int, *, lengths_itemsize: int = 4) -> Traffic:
    """Modeled traffic of one kv_write call. SM requests: each program loads its sequence's position (one
    sector), its K and V rows, and stores the two rows, in whole sectors. HBM: the rows and positions
    read once from cold caches, the rows written (reaching HBM eventually)."""
    row = head_dim * itemsize
    programs = batch * heads
    reads = programs * (2 * sectors(row) + SECTOR)
    writes = programs * 2 * sectors(row)
    hbm_read = 2 * programs * row + sectors(batch * lengths_itemsize)
    return Traffic(reads, writes, 0, 4 * programs * row, hbm_read, 2 * programs * row)
