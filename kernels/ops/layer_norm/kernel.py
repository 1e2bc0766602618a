"""LayerNorm over the last dimension, optionally fused with the pre-LN block's residual add.

    s = x + residual                       (when residual is given; rounded to x's dtype, as torch does)
    y = (s - mean(s)) / sqrt(var(s) + eps) * weight + bias

Each program holds BLOCK_M whole rows (BLOCK_N >= C) in registers, so every row is read once and
written once; mean and variance are computed in fp32 from the registers. With the residual fused,
the block reads x and residual and writes s and y: four row-sized transfers instead of the five
that a separate add followed by LayerNorm needs.
"""

import functools

import triton
import triton.language as tl

from ... import autotune, launch, stamps
from ...config import (
    TileConfig,
    Traffic,
    as_config,
    cdiv,
    check_dtype,
    check_fields,
    device_limits,
    explain_resources,
    l2_miss,
    new_output,
    next_pow2,
)
from ...parts.stats import moments, normalized, summed_rows


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("M",))
def _layer_norm_kernel(
    X,
    R,
    Y,
    S,
    W,
    B,
    stride_xm,
    stride_rm,
    stride_ym,
    stride_sm,
    M,
    N,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]

    x = summed_rows(X, R, S, rows, cols, mask, stride_xm, stride_rm, stride_sm, HAS_RESIDUAL=HAS_RESIDUAL)
    _, rstd, diff = moments(x, mask, N, eps, 1)

    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    b = tl.load(B + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = normalized(diff, rstd[:, None], w[None, :], b[None, :])
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    stamps.end(Stamps)


def default_config(rows: int, width: int, device) -> TileConfig:
    block_n = max(16, next_pow2(width))
    # About 4K elements per program: enough bytes in flight per SM without spilling registers. The interpreter
    # runs programs one after another at a cost per program, not per element: there, as many rows as one
    # program may hold (64, or 65536 elements).
    per_program = 65536 if device_limits(device).is_cpu else 4096
    block_m = max(1, min(64, per_program // block_n, next_pow2(rows)))
    num_warps = 4 if block_m * block_n <= 4096 else 8
    return TileConfig(block_m=block_m, block_n=block_n, num_warps=num_warps)


@functools.lru_cache(maxsize=1024)  # called on every launch: resolve each shape once
def resolve_config(config: TileConfig | None, rows: int, width: int, device, name: str = "layer_norm") -> TileConfig:
    """The tiles of a row normalisation (`name`: layer_norm, or rms_norm, which holds rows the same way)."""
    cfg = as_config(name, config).merged(default_config(rows, width, device))
    check_fields(name, cfg)
    if cfg.block_n < width:
        raise ValueError(
            f"{name}: block_n={cfg.block_n} is smaller than the row width {width}; the kernel holds whole "
            f"rows in registers (one pass), so block_n must be at least {next_pow2(width)}"
        )
    if cfg.block_m * cfg.block_n > 65536:
        raise ValueError(
            f"{name}: block_m * block_n = {cfg.block_m * cfg.block_n} elements per program is more than "
            "65536, which does not fit in registers; use a smaller block_m"
        )
    return cfg


def layer_norm(x, weight, bias, eps=1e-5, *, residual=None, config=None):
    """LayerNorm of x (..., C); with `residual`, returns (y, x + residual) from one pass."""
    check_dtype("layer_norm", x)
    width = x.shape[-1]
    if weight.shape != (width,) or bias.shape != (width,):
        raise ValueError(f"layer_norm: weight and bias must have shape ({width},), got {weight.shape}, {bias.shape}")
    x2, r2, y, s, stride_x, stride_r = row_buffers("layer_norm", x, residual)
    rows = x2.shape[0]
    if config == "autotune":
        config = tuned_config(x, weight, bias, eps, residual=residual)
    cfg = resolve_config(config, rows, width, x.device)
    if rows > 0:
        grid = (cdiv(rows, cfg.block_m),)
        with explain_resources("layer_norm", cfg):
            launch.fast(_layer_norm_kernel)[grid](
                x2,
                r2,
                y,
                s,
                weight,
                bias,
                stride_x,
                stride_r,
                width,
                width,
                rows,
                width,
                eps,
                HAS_RESIDUAL=residual is not None,
                BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n,
                num_warps=cfg.num_warps,
            )
    return shaped_like(x, y, s if residual is not None else None)


def row_buffers(name: str, x, residual):
    """What a row normalisation launches with, after checking the residual against x: x and the residual as
    (rows, width) with contiguous columns, their row strides, and new contiguous y and s (s is y without a
    residual: the kernel then leaves it alone). A 2-D x keeps its tensors: a view costs the host more than the
    check."""
    width = x.shape[-1]
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"{name}: residual {residual.shape} {residual.dtype} must match x {x.shape} {x.dtype}")
    x2 = x if x.dim() == 2 else x.reshape(-1, width)
    stride_x = x2.stride()  # one call: each costs the host about as much as a check
    if stride_x[-1] != 1:
        x2 = x2.contiguous()
        stride_x = x2.stride()
    y = new_output(x2)  # contiguous: its rows (and s's) are `width` apart
    if residual is None:
        return x2, x2, y, y, stride_x[0], stride_x[0]
    r2 = residual if residual.dim() == 2 else residual.reshape(-1, width)
    r2 = r2 if r2.stride(-1) == 1 else r2.contiguous()
    return x2, r2, y, new_output(x2), stride_x[0], r2.stride(0)


def shaped_like(x, y, s=None):
    """y (and s, where the residual was given) in x's shape."""
    if x.dim() == 2:
        return y if s is None else (y, s)
    return y.view(x.shape) if s is None else (y.view(x.shape), s.view(x.shape))


def tuned_config(x, weight, bias, eps=1e-5, *, residual=None):
    """The fastest candidate tiles for inputs like these (timed once per shape on a GPU, over random copies
    rotated past L2; defaults on CPU)."""
    key = (x.numel() // x.shape[-1], x.shape[-1], x.dtype, residual is not None)
    run = lambda c, x, w, b, r: layer_norm(x, w, b, eps, residual=r, config=c)
    return autotune.pick("layer_norm", key, run, x.device, inputs=(x, weight, bias, residual))


def traffic(
    rows: int,
    width: int,
    itemsize: int,
    *,
    residual: bool = False,
    config: TileConfig | None = None,
    device="cpu",
    bias: bool = True,
) -> Traffic:
    """Modeled traffic of one fused launch: each row read and written once, and weight and bias requested
    by every program (ncu on an H200 at 4096x768: 15.73 MB through L1, exactly this). Those are plain
    cached loads that hit in L1 after an SM's first program, so the L2 sees them about once per SM (12.70
    MB there) and HBM once: the rows stream, weight and bias stay. bias=False: RMSNorm, weight alone."""
    cfg = resolve_config(config, rows, width, device)
    row_bytes = rows * width * itemsize
    wb = (2 if bias else 1) * width * itemsize
    streams = 2 if residual else 1
    reads = row_bytes * streams + cdiv(rows, cfg.block_m) * wb
    writes = row_bytes * streams
    flops = rows * width * (8 + (1 if residual else 0))
    floor = row_bytes * streams + wb + writes
    return Traffic(reads, writes, flops, floor, row_bytes * streams + wb, writes)


def traffic_unfused(rows: int, width: int, itemsize: int, *, residual: bool = False, device="cpu") -> Traffic:
    """torch's path: a separate add kernel (reads x and residual, writes the sum), then F.layer_norm.
    At the HBM level the sum is read back from L2 when it fits there (its write still reaches HBM)."""
    row_bytes = rows * width * itemsize
    ln = Traffic(row_bytes + 2 * width * itemsize, row_bytes, 8 * rows * width, 2 * row_bytes + 2 * width * itemsize)
    if not residual:
        return ln
    add = Traffic(2 * row_bytes, row_bytes, rows * width, 3 * row_bytes)
    # The sum is the layer norm's input: its first read is a re-read of what the add just wrote.
    ln_hbm_read = round(row_bytes * l2_miss(row_bytes, device)) + 2 * width * itemsize
    return add + Traffic(ln.bytes_read, ln.bytes_written, ln.flops, ln.min_bytes, ln_hbm_read, ln.hbm_written)
