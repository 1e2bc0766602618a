"""Rotary positions' maths, written once for every kernel that rotates queries and keys (the standalone
launch here; next, the q/k projection's epilogue and the cache write)."""

import triton
import triton.language as tl


@triton.jit
def rotate(x1, x2, positions, dims, head_dim, log2_theta):
    """(x1, x2) turned by angle position * theta^(-2i / head_dim), where x1 holds the first half of each row's
    dims (i = dims) and x2 the second: Llama's convention (rotate_half), not interleaved pairs. positions: one
    per row; all fp32. The angle is formed in fp32, as transformers forms it."""
    inv_freq = tl.exp2(-(2.0 * dims.to(tl.float32) / head_dim) * log2_theta)
    angle = positions.to(tl.float32)[:, None] * inv_freq[None, :]
    cos, sin = tl.cos(angle), tl.sin(angle)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin
