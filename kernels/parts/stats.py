"""The normalisations' statistics, written once for every kernel that normalises rows: LayerNorm's (LayerNorm
itself, and the decode step's linear with the LayerNorm in its prologue) and RMSNorm's."""

import triton
import triton.language as tl


@triton.jit
def moments(x, mask, n, eps, AXIS: tl.constexpr):
    """Mean and 1 / sqrt(variance + eps) of x along AXIS over its n valid entries, and x less its mean (zero
    where `mask` is false). x is fp32 and zero where masked. The variance is the mean of squared differences
    from the mean, two passes over registers as PyTorch computes it; AXIS 1 for rows of a 2-D tile, 0 for one
    row."""
    mean = tl.sum(x, axis=AXIS) / n
    if AXIS == 1:
        diff = tl.where(mask, x - mean[:, None], 0.0)
    else:
        diff = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(diff * diff, axis=AXIS) / n + eps)
    return mean, rstd, diff


@triton.jit
def inverse_rms(x, n, eps, AXIS: tl.constexpr):
    """1 / sqrt(mean(x^2) + eps) of x along AXIS over its n valid entries: RMSNorm's one statistic (no mean is
    taken out). x is fp32 and zero where masked, so masked lanes add nothing to the sum."""
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=AXIS) / n + eps)


@triton.jit
def normalized(centred, rstd, w, b):
    """The normalisation's output in fp32: LayerNorm's (x - mean) * rstd * w + b from centred = x - mean, or with
    b None RMSNorm's x * rstd * w from centred = x. Every operand already broadcasts to centred's shape."""
    y = centred * rstd * w
    if b is not None:
        y = y + b
    return y


@triton.jit
def summed_rows(X, R, S, rows, cols, mask, stride_xm, stride_rm, stride_sm, HAS_RESIDUAL: tl.constexpr):
    """A normalisation's input rows as fp32 (zero where masked): X's, or with HAS_RESIDUAL X + R, rounded to
    S's dtype as torch's separate add rounds it, and stored to S (the block's residual stream goes on from it)."""
    x = tl.load(X + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(S.dtype.element_ty)
        tl.store(S + rows[:, None] * stride_sm + cols[None, :], x, mask=mask)
    return x.to(tl.float32)
