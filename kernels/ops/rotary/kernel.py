"""Rotary position embedding (RoPE), the Llama family's positions: each query and key row turned by an
angle that grows with its position, so attention scores depend on how far apart two tokens are.

    y[..., :D/2] = x1 * cos(p * f) - x2 * sin(p * f)      x1, x2: the first and second half of a row
    y[..., D/2:] = x2 * cos(p * f) + x1 * sin(p * f)      f_i = theta^(-2i / D), p: the row's position

This is the standalone launch (the "none" rung runs it apart: one read and one write of q or k). The angles
come from the positions in registers, never from a cos/sin table in memory, so the rotation costs no bytes
beyond the rows themselves; rotate.py holds the maths for the kernels that fuse it.
"""

import math

import triton
import triton.language as tl

from ... import launch, stamps
from ...config import TileConfig, Traffic, cdiv, check_dtype, explain_resources, new_output, next_pow2
from ...parts.rotate import rotate


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("tokens",))
def _rotary_kernel(
    X,
    Y,
    Positions,
    x_strides,  # (batch, head, token) of x; its dims are contiguous
    heads,
    tokens,
    log2_theta,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    HALF: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    bh = tl.program_id(1).to(tl.int64)
    b, h = bh // heads, bh % heads
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HALF)
    mask = (rows < tokens)[:, None] & (dims < HEAD_DIM // 2)[None, :]
    stride_b, stride_h, stride_t = x_strides
    src = X + b * stride_b + h * stride_h + rows[:, None].to(tl.int64) * stride_t + dims[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HEAD_DIM // 2, mask=mask, other=0.0).to(tl.float32)
    positions = tl.load(Positions + b * tokens + rows, mask=rows < tokens, other=0)
    y1, y2 = rotate(x1, x2, positions, dims, HEAD_DIM, log2_theta)
    dst = Y + ((bh * tokens + rows[:, None]) * HEAD_DIM + dims[None, :])  # y is contiguous (B, H, T, D)
    tl.store(dst, y1.to(Y.dtype.element_ty), mask=mask)
    tl.store(dst + HEAD_DIM // 2, y2.to(Y.dtype.element_ty), mask=mask)
    stamps.end(Stamps)


def rotary(x, positions, theta=10000.0, *, block_m=None):
    """x (B, H, T, D) turned by its rows' positions (B, T), integers; D even. Returns a new (B, H, T, D)."""
    check_dtype("rotary", x)
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"rotary: x must be (B, H, T, D) with D even, got {tuple(x.shape)}")
    batch, heads, tokens, head_dim = x.shape
    if tuple(positions.shape) != (batch, tokens) or positions.is_floating_point():
        raise ValueError(
            f"rotary: positions must be integers of shape (B={batch}, T={tokens}), got "
            f"{tuple(positions.shape)} {positions.dtype}"
        )
    if theta <= 1:
        raise ValueError(f"rotary: theta={theta} must be above 1")
    if x.stride(-1) != 1:
        x = x.contiguous()
    positions = positions.contiguous()
    y = new_output(x, (batch, heads, tokens, head_dim))
    half = next_pow2(head_dim // 2)
    block_m = block_m or max(1, min(64, 4096 // half, next_pow2(tokens)))
    if y.numel():
        grid = (cdiv(tokens, block_m), batch * heads)
        with explain_resources("rotary", TileConfig(block_m=block_m)):
            launch.fast(_rotary_kernel)[grid](
                x,
                y,
                positions,
                (x.stride(0), x.stride(1), x.stride(2)),
                heads,
                tokens,
                math.log2(theta),
                HEAD_DIM=head_dim,
                BLOCK_M=block_m,
                HALF=half,
            )
    return y


def traffic(batch: int, heads: int, tokens: int, head_dim: int, itemsize: int, position_bytes: int = 8) -> Traffic:
    """One launch: each row read and written once, and each program reads its rows' positions (every head
    of a sequence reads them again: B * H * T of them). The angles cost no bytes."""
    rows = batch * heads * tokens * head_dim * itemsize
    reads = rows + batch * heads * tokens * position_bytes
    flops = batch * heads * tokens * head_dim * 3  # two products and a sum per element, after the angle
    floor = rows + batch * tokens * position_bytes + rows
    return Traffic(reads, rows, flops, floor, rows + batch * tokens * position_bytes, rows)
