"""The separate launches eager PyTorch makes around a matmul: the residual add, the bias add and the GELU.

    add(x, y)          x + y for two tensors of one shape (the residual add)
    bias_add(x, bias)  x + bias, with bias (C,) broadcast over x's last dimension (..., C)
    gelu(x)            GPT-2's tanh GELU, the formula kernels.ops.linear.kernel's epilogue applies

They are the "no fusion" rung of the fusion ladder: each operation is its own kernel, and each kernel
reads its whole input from memory and writes its whole output back, where a fused kernel keeps the
intermediate in registers. Each launch is a 1-D grid over the flat view of the tensor; a program
handles BLOCK_N consecutive elements (1024 on a GPU; on CPU, up to 65536, since the interpreter's cost
is per program). Every value is computed in fp32 and rounded once to the input's dtype on the store.
Inputs that are not contiguous are copied to contiguous tensors first (one more kernel, which the
traffic models do not count); the output is always contiguous.

Memory traffic, SM requests and HBM alike: each input read once and the output written once, the floor
for an operation on its own, from cold caches (a launch that reads what the previous one wrote may
find it in L2: the caller's to model, as kernels.ops.linear.traffic_unfused does). The exception is
bias_add's bias: each program loads the bias columns its span of the flat view covers, in whole
32-byte sectors (all of them when the span holds a row or more); HBM serves the bias once.
"""

import functools
import math

import torch
import triton
import triton.language as tl

from ... import launch, stamps
from ...config import (
    SECTOR,
    TileConfig,
    Traffic,
    as_config,
    cdiv,
    check_dtype,
    check_fields,
    device_limits,
    explain_resources,
    new_output,
    next_pow2,
    sectors,
)
from ..linear.kernel import gelu_tanh

CPU_BLOCK = 65536  # largest default span on CPU: few programs for the interpreter


@triton.jit
def _add_kernel(X, Y, Out, N, BLOCK_N: tl.constexpr, Stamps):
    stamps.begin(Stamps)
    offs = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    x = tl.load(X + offs, mask=mask).to(tl.float32)
    y = tl.load(Y + offs, mask=mask).to(tl.float32)
    tl.store(Out + offs, (x + y).to(Out.dtype.element_ty), mask=mask)
    stamps.end(Stamps)


@triton.jit
def _bias_add_kernel(X, Bias, Out, N, WIDTH, BLOCK_N: tl.constexpr, Stamps):
    stamps.begin(Stamps)
    start = tl.program_id(0).to(tl.int64) * BLOCK_N
    offs = start + tl.arange(0, BLOCK_N)
    mask = offs < N
    # The span's first column, then 32-bit column arithmetic: col0 + BLOCK_N stays far below 2^31.
    cols = ((start % WIDTH).to(tl.int32) + tl.arange(0, BLOCK_N)) % WIDTH
    x = tl.load(X + offs, mask=mask).to(tl.float32)
    b = tl.load(Bias + cols, mask=mask).to(tl.float32)
    tl.store(Out + offs, (x + b).to(Out.dtype.element_ty), mask=mask)
    stamps.end(Stamps)


@triton.jit
def _gelu_kernel(X, Out, N, BLOCK_N: tl.constexpr, Stamps):
    stamps.begin(Stamps)
    offs = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < N
    x = tl.load(X + offs, mask=mask).to(tl.float32)
    tl.store(Out + offs, gelu_tanh(x).to(Out.dtype.element_ty), mask=mask)
    stamps.end(Stamps)


def default_config(numel: int, device) -> TileConfig:
    """1024 elements in 4 warps on a GPU (8 per thread: one 16-byte load in fp16, two in fp32); on CPU
    the whole tensor in one program up to 65536 elements, since the interpreter's cost is per program."""
    if device_limits(device).is_cpu:
        return TileConfig(block_n=max(16, min(CPU_BLOCK, next_pow2(numel))), num_warps=4)
    return TileConfig(block_n=1024, num_warps=4)


@functools.lru_cache(maxsize=1024)  # called on every launch: resolve each shape once
def resolve_config(kernel: str, config, numel: int, device) -> TileConfig:
    """`kernel` is "add", "bias_add" or "gelu", for the messages. One span serves every shape, so
    config="autotune" takes the defaults."""
    user = as_config(kernel, None if config == "autotune" else config)
    check_fields(kernel, user)
    return user.merged(default_config(numel, device))


def _flat(name: str, t: torch.Tensor) -> torch.Tensor:
    """t itself if contiguous, else a contiguous copy: the kernels index the flat view."""
    check_dtype(name, t)
    return t if t.is_contiguous() else t.contiguous()


def _check_pair(name: str, x, other, what: str):
    if other.dtype != x.dtype or other.device != x.device:
        raise ValueError(
            f"{name}: x and {what} must share a dtype and a device, got {x.dtype} on {x.device} "
            f"and {other.dtype} on {other.device}"
        )


def _launch(name: str, kernel, config, x, *inputs, width: int | None = None):
    """One launch of `kernel` over x's elements (x and `inputs` flat, contiguous, checked): the output is
    a new tensor like x, the grid one program per BLOCK_N elements; `width`, when given, follows N."""
    cfg = resolve_config(name, config, x.numel(), x.device)
    out = new_output(x)
    if out.numel() == 0:
        return out
    sizes = (x.numel(),) if width is None else (x.numel(), width)
    with explain_resources(name, cfg):
        grid = (cdiv(x.numel(), cfg.block_n),)
        launch.fast(kernel)[grid](x, *inputs, out, *sizes, BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    return out


def add(x, y, *, config=None):
    """x + y for x and y of the same shape (no broadcasting), one launch -> a contiguous tensor like x."""
    if x.shape != y.shape:
        raise ValueError(f"add: x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    _check_pair("add", x, y, "y")
    return _launch("add", _add_kernel, config, _flat("add", x), _flat("add", y))


def bias_add(x, bias, *, config=None):
    """x + bias for x (..., C) and bias (C,), one launch -> a contiguous tensor like x."""
    if x.dim() == 0 or bias.shape != (x.shape[-1],):
        width = f"({x.shape[-1]},)" if x.dim() else "(C,) with x at least 1-D (..., C)"
        raise ValueError(f"bias_add: bias must have shape {width}, got bias {tuple(bias.shape)} for x {tuple(x.shape)}")
    _check_pair("bias_add", x, bias, "bias")
    x = _flat("bias_add", x)
    return _launch("bias_add", _bias_add_kernel, config, x, _flat("bias_add", bias), width=x.shape[-1])


def gelu(x, *, config=None):
    """GPT-2's tanh GELU of x, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), one launch -> a contiguous
    tensor like x."""
    return _launch("gelu", _gelu_kernel, config, _flat("gelu", x))


def traffic_add(n: int, itemsize: int) -> Traffic:
    """Modeled traffic of add over n elements: both inputs read once, the sum written once (both levels)."""
    return Traffic(2 * n * itemsize, n * itemsize, n, 3 * n * itemsize)


def traffic_gelu(n: int, itemsize: int) -> Traffic:
    """Modeled traffic of gelu over n elements: read once, written once (both levels); about 10 flops each,
    as kernels.ops.linear.kernel counts its fused GELU."""
    return Traffic(n * itemsize, n * itemsize, 10 * n, 2 * n * itemsize)


def _bias_bytes(n: int, width: int, itemsize: int, block: int) -> int:
    """Bias bytes L2 serves: every program loads the columns its span [start, end) of the flat view covers,
    once each, in whole sectors (the bias starting on a sector, as torch allocates it). A span of a whole
    row or more covers all of it; a shorter one a run of columns that may wrap past the row's end, whose
    two pieces can share a sector. The spans' first columns repeat every width / gcd(block, width)
    programs, so one period is walked."""

    def span(start: int, end: int) -> int:
        if end - start >= width:
            return sectors(width * itemsize)
        lo, hi = start % width * itemsize, ((end - 1) % width + 1) * itemsize  # byte range within the bias
        if lo < hi:
            return (cdiv(hi, SECTOR) - lo // SECTOR) * SECTOR
        tail, head = cdiv(width * itemsize, SECTOR) - lo // SECTOR, cdiv(hi, SECTOR)
        return (tail + head - max(0, head - lo // SECTOR)) * SECTOR

    full, rest = divmod(n, block)
    period = width // math.gcd(block, width)
    per_program = [span(p * block, (p + 1) * block) for p in range(min(period, full))]
    cycles, left = divmod(full, period)
    return cycles * sum(per_program) + sum(per_program[:left]) + (span(full * block, n) if rest else 0)


def traffic_bias_add(rows: int, width: int, itemsize: int, *, config=None, device="cpu") -> Traffic:
    """Modeled traffic of bias_add over (rows, width) at these spans. SM requests: x read and the sum written
    once; the bias once per program, the sectors its span covers. HBM: x and the bias once, the sum
    written once."""
    n = rows * width
    cfg = resolve_config("bias_add", config, n, device)
    x_bytes = n * itemsize
    if n == 0:  # nothing is launched
        return Traffic(0, 0, 0, width * itemsize, 0, 0)
    bias_l2 = _bias_bytes(n, width, itemsize, cfg.block_n)
    return Traffic(x_bytes + bias_l2, x_bytes, n, 2 * x_bytes + width * itemsize, x_bytes + width * itemsize, x_bytes)
