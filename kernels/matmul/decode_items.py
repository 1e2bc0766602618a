"""The work items of decode_linear, shared by its two kernels (kernels.matmul.decode) and by the decode layer
kernel (kernels.layer.kernel): the LayerNorm statistics of the rows, the rows times a weight slice, the
arrival of split partials and the epilogue (bias, GELU, residual, the KV-cache write).

A prefetch-form item is two calls: load_slice issues the loads of its weight slice, and slice_item waits for
what earlier work writes (the kernel ahead under PDL, or a stage barrier) and does the rest, so the slice is
in flight while the program waits.
"""

import triton
import triton.language as tl

from .. import barrier, pdl
from ..norm.stats import moments
from .kernel import _bias_gelu_residual


@triton.jit
def _epilogue(acc, rows, cols, pid_n, Bias, R, Y, KC, VC, Lengths, M, N, C, HEAD_DIM, stride_rm, stride_ym,
              stride_kcb, stride_kch, stride_kct, stride_kcd, stride_vcb, stride_vch, stride_vct, stride_vcd,
              HAS_BIAS: tl.constexpr, APPLY_GELU: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_KV: tl.constexpr,
              BLOCK_N: tl.constexpr):  # fmt: skip
    # linear's epilogue, keeping the stored value for the cache write.
    acc = _bias_gelu_residual(acc, rows, cols, Bias, R, M, N, stride_rm, HAS_BIAS, APPLY_GELU, HAS_RESIDUAL)
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    y = acc.to(Y.dtype.element_ty)
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y, mask=mask)
    if HAS_KV:
        if pid_n * BLOCK_N + BLOCK_N > C:  # tiles wholly inside q's columns store no cache rows
            # Columns [C, 2C) are K and [2C, 3C) are V, head h at [h * D, (h + 1) * D) of each. 64-bit
            # offsets throughout: a cache can pass 2^31 elements (see kv_write).
            pos = tl.load(Lengths + rows, mask=row_mask, other=0).to(tl.int64)
            in_kv = (cols >= C) & (cols < N)
            c = tl.where(in_kv, cols - C, 0) % C  # column within K or V
            h, d = c // HEAD_DIM, c % HEAD_DIM
            is_k = cols < 2 * C
            k_ptrs = (
                KC + rows[:, None] * stride_kcb + pos[:, None] * stride_kct + (h * stride_kch + d * stride_kcd)[None, :]
            )
            v_ptrs = (
                VC + rows[:, None] * stride_vcb + pos[:, None] * stride_vct + (h * stride_vch + d * stride_vcd)[None, :]
            )
            tl.store(k_ptrs, y, mask=row_mask[:, None] & (in_kv & is_k)[None, :])
            tl.store(v_ptrs, y, mask=row_mask[:, None] & (in_kv & ~is_k)[None, :])


@triton.jit
def _finish(acc, rows, cols, pid_n, split, Bias, R, Y, P, Counters, KC, VC, Lengths, M, N, C, SPLITS, HEAD_DIM,
            stride_rm, stride_ym, stride_kcb, stride_kch, stride_kct, stride_kcd,
            stride_vcb, stride_vch, stride_vct, stride_vcd,
            HAS_BIAS: tl.constexpr, APPLY_GELU: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_KV: tl.constexpr,
            ARRIVE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The epilogue, after the arrival when the K range was split: acc is this program's (BLOCK_M, BLOCK_N)
    share of the output tile."""
    if ARRIVE:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        partials = P + rows[:, None] * N + cols[None, :]
        tl.store(partials + split * M * N, acc, mask=mask)
        # Every thread's partial stores come before the one atomic (the barrier), and the atomic releases
        # them at GPU scope; the last arriver's atomic acquires everyone's, and its loads come after it.
        tl.debug_barrier()
        arrived = tl.atomic_add(Counters + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLITS - 1:
            tl.debug_barrier()
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(0, SPLITS):  # in split order: the same sum whichever program arrives last
                # .cg: from L2, never from a line this SM's L1 may hold from before the others stored.
                acc += tl.load(partials + s * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            _epilogue(acc, rows, cols, pid_n, Bias, R, Y, KC, VC, Lengths, M, N, C, HEAD_DIM, stride_rm, stride_ym,
                      stride_kcb, stride_kch, stride_kct, stride_kcd, stride_vcb, stride_vch, stride_vct, stride_vcd,
                      HAS_BIAS, APPLY_GELU, HAS_RESIDUAL, HAS_KV, BLOCK_N)  # fmt: skip
            tl.store(Counters + pid_n, 0)  # the next launch on this stream finds zeros
    else:
        _epilogue(acc, rows, cols, pid_n, Bias, R, Y, KC, VC, Lengths, M, N, C, HEAD_DIM, stride_rm, stride_ym,
                  stride_kcb, stride_kch, stride_kct, stride_kcd, stride_vcb, stride_vch, stride_vct, stride_vcd,
                  HAS_BIAS, APPLY_GELU, HAS_RESIDUAL, HAS_KV, BLOCK_N)  # fmt: skip


@triton.jit
def _row_stats(X, M, K, eps, stride_xm, stride_xk, ROWS: tl.constexpr, STATS_COLS: tl.constexpr):
    """Each row's mean and rstd over its K columns, as kernels.norm.kernel computes them: (ROWS,) each."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, STATS_COLS)
    mean = tl.zeros((ROWS,), dtype=tl.float32)
    rstd = tl.zeros((ROWS,), dtype=tl.float32)
    for r in tl.static_range(ROWS):  # rows past M (ROWS is M rounded up to a power of two) load zeros
        x = tl.load(X + r * stride_xm + cols * stride_xk, mask=(cols < K) & (cols * 0 + r < M), other=0.0)
        m, s, _ = moments(x.to(tl.float32), cols < K, K, eps, 0)
        mean = tl.where(rows == r, m, mean)
        rstd = tl.where(rows == r, s, rstd)
    return mean, rstd


@triton.jit
def _rows_times(X, w, ks, k_mask, mean, rstd, LnW, LnB, M, stride_xm, stride_xk, HAS_NORM: tl.constexpr,
                ROWS: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """x's rows over columns ks (layer-normed with the rows' mean and rstd when HAS_NORM, rounded to x's dtype
    as the unfused path stores them) times the weight tile w (len(ks) x BLOCK_N): (ROWS, BLOCK_N) in fp32.
    One row at a time on the vector units: for a handful of rows tl.dot would pad them to 16."""
    rows = tl.arange(0, ROWS)
    wf = w.to(tl.float32)
    if HAS_NORM:
        lw = tl.load(LnW + ks, mask=k_mask, other=0.0).to(tl.float32)
        lb = tl.load(LnB + ks, mask=k_mask, other=0.0).to(tl.float32)
    out = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for r in tl.static_range(ROWS):
        a = tl.load(X + r * stride_xm + ks * stride_xk, mask=k_mask & (ks * 0 + r < M), other=0.0).to(tl.float32)
        if HAS_NORM:  # the same expression as layer_norm's
            mean_r = tl.sum(tl.where(rows == r, mean, 0.0), axis=0)
            rstd_r = tl.sum(tl.where(rows == r, rstd, 0.0), axis=0)
            a = tl.where(k_mask, (a - mean_r) * rstd_r * lw + lb, 0.0).to(X.dtype.element_ty).to(tl.float32)
        out = tl.where(rows[:, None] == r, tl.sum(a[:, None] * wf, axis=0)[None, :], out)
    return out


@triton.jit
def load_slice(pid_n, split, W, N, K, K_PER_SPLIT, stride_wn, stride_wk,
               BLOCK_N: tl.constexpr, HEAD_K: tl.constexpr, TAIL_K: tl.constexpr):  # fmt: skip
    """The weight slice of (column tile, split): HEAD_K rows of K, then TAIL_K more (w1 is w0 when TAIL_K is 0)."""
    cols = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_cols = W + (cols % N)[None, :] * stride_wn  # columns wrap, never masked, as the K loop's
    k_lo = split * K_PER_SPLIT
    k_hi = min(k_lo + K_PER_SPLIT, K)
    ks0 = k_lo + tl.arange(0, HEAD_K)
    w0 = tl.load(w_cols + ks0[:, None] * stride_wk, mask=(ks0 < k_hi)[:, None], other=0.0)
    if TAIL_K > 0:
        ks1 = k_lo + HEAD_K + tl.arange(0, TAIL_K)
        w1 = tl.load(w_cols + ks1[:, None] * stride_wk, mask=(ks1 < k_hi)[:, None], other=0.0)
    else:
        w1 = w0
    return w0, w1


@triton.jit
def slice_item(
    w0, w1, pid_n, split, X, Bias, R, Y, P, Counters, LnW, LnB, KC, VC, Lengths,
    M, N, K, K_PER_SPLIT, SPLITS, eps, HEAD_DIM,
    stride_xm, stride_xk, stride_rm, stride_ym,
    stride_kcb, stride_kch, stride_kct, stride_kcd, stride_vcb, stride_vch, stride_vct, stride_vcd,
    Sync, stage, arrivals,
    HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, APPLY_GELU: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    HAS_KV: tl.constexpr, ARRIVE: tl.constexpr, PDL: tl.constexpr, BARRIER: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_K: tl.constexpr, TAIL_K: tl.constexpr,
    STATS_COLS: tl.constexpr,
):  # fmt: skip
    """The rest of a (column tile, split) once its slice (load_slice) is on its way: the wait for what earlier
    work writes (the kernel ahead under PDL; with BARRIER, `arrivals` arrivals at Sync[stage], kernels.barrier),
    then the rows times the slice and the epilogue."""
    cols = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * K_PER_SPLIT
    k_hi = min(k_lo + K_PER_SPLIT, K)
    ks0 = k_lo + tl.arange(0, HEAD_K)
    if BARRIER:
        barrier.wait(Sync, stage, arrivals)
    else:
        pdl.wait(PDL)  # from here on x, the residual, the caches and the partials: what earlier kernels write
    mean = tl.zeros((ROWS,), dtype=tl.float32)
    rstd = tl.zeros((ROWS,), dtype=tl.float32)
    if HAS_NORM:  # every program needs the statistics of the full rows, not only of its slice
        mean, rstd = _row_stats(X, M, K, eps, stride_xm, stride_xk, ROWS, STATS_COLS)
    acc = _rows_times(X, w0, ks0, ks0 < k_hi, mean, rstd, LnW, LnB, M, stride_xm, stride_xk, HAS_NORM, ROWS, BLOCK_N)
    if TAIL_K > 0:
        ks1 = k_lo + HEAD_K + tl.arange(0, TAIL_K)
        acc += _rows_times(X, w1, ks1, ks1 < k_hi, mean, rstd, LnW, LnB, M, stride_xm, stride_xk, HAS_NORM, ROWS,
                           BLOCK_N)  # fmt: skip
    _finish(acc, tl.arange(0, ROWS).to(tl.int64), cols, pid_n, split, Bias, R, Y, P, Counters, KC, VC, Lengths,
            M, N, K, SPLITS, HEAD_DIM, stride_rm, stride_ym, stride_kcb, stride_kch, stride_kct, stride_kcd,
            stride_vcb, stride_vch, stride_vct, stride_vcd,
            HAS_BIAS, APPLY_GELU, HAS_RESIDUAL, HAS_KV, ARRIVE, ROWS, BLOCK_N)  # fmt: skip
