"""RMSNorm over the last dimension (the Llama family's normalisation), optionally fused with the block's
residual add, as LayerNorm is (kernel.py):

    s = x + residual                       (when residual is given; rounded to x's dtype, as torch does)
    y = s / sqrt(mean(s^2) + eps) * weight

No mean is taken out and there is no bias: one statistic, one parameter vector. Rows are held whole in
registers as LayerNorm holds them (the same tile rules, resolve_config), so each row is read and written
once; with the residual, four row-sized transfers instead of the five of a separate add.
"""

import triton
import triton.language as tl

from ... import launch, stamps
from ...config import Traffic, cdiv, check_dtype, explain_resources
from ...parts.stats import inverse_rms, normalized, summed_rows
from ..layer_norm.kernel import resolve_config, row_buffers, shaped_like
from ..layer_norm.kernel import traffic as layer_norm_traffic


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("M",))
def _rms_norm_kernel(
    X,
    R,
    Y,
    S,
    W,
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
    scale = inverse_rms(x, N, eps, 1)

    w = tl.load(W + cols, mask=col_mask, other=0.0).to(tl.float32)
    y = normalized(x, scale[:, None], w[None, :], b=None)
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    stamps.end(Stamps)


def rms_norm(x, weight, eps=1e-5, *, residual=None, config=None):
    """RMSNorm of x (..., C); with `residual`, returns (y, x + residual) from one pass."""
    check_dtype("rms_norm", x)
    width = x.shape[-1]
    if weight.shape != (width,):
        raise ValueError(f"rms_norm: weight must have shape ({width},), got {tuple(weight.shape)}")
    x2, r2, y, s, stride_x, stride_r = row_buffers("rms_norm", x, residual)
    rows = x2.shape[0]
    cfg = resolve_config(config, rows, width, x.device, "rms_norm")
    if rows > 0:
        with explain_resources("rms_norm", cfg):
            launch.fast(_rms_norm_kernel)[(cdiv(rows, cfg.block_m),)](
                x2,
                r2,
                y,
                s,
                weight,
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


def traffic(rows: int, width: int, itemsize: int, *, residual: bool = False, config=None, device="cpu") -> Traffic:
    """Modeled traffic of one launch: LayerNorm's (kernel.traffic), with the weight alone requested by every
    program and read from HBM once."""
    return layer_norm_traffic(rows, width, itemsize, residual=residual, config=config, device=device, bias=False)
