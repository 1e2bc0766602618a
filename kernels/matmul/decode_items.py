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
def _epilogue(acc, rows, cols, pid_n, Bias, res, y, kv, M, N, APPLY_GELU: tl.constexpr, BLOCK_N: tl.constexpr):
    """linear's epilogue on the fp32 tile acc at (rows, cols), storing y, then (with kv) the new K and V rows:
    y's columns [C, 2C) and [2C, 3C) of row b into the caches at lengths[b], C = N // 3."""
    R, stride_rm = None, 0
    if res is not None:
        R, stride_rm = res
    acc = _bias_gelu_residual(
        acc,
        rows,
        cols,
        Bias,
        R,
        M,
        N,
        stride_rm,
        HAS_BIAS=Bias is not None,
        APPLY_GELU=APPLY_GELU,
        HAS_RESIDUAL=res is not None,
    )
    Y, stride_ym = y
    row_mask = rows < M
    mask = row_mask[:, None] & (cols < N)[None, :]
    out = acc.to(Y.dtype.element_ty)
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], out, mask=mask)
    if kv is not None:
        KC, VC, Lengths, HEAD_DIM, k_strides, v_strides = kv
        C = N // 3
        if pid_n * BLOCK_N + BLOCK_N > C:  # tiles wholly inside q's columns store no cache rows
            # Columns [C, 2C) are K and [2C, 3C) are V, head h at [h * D, (h + 1) * D) of each. 64-bit
            # offsets throughout: a cache can pass 2^31 elements (see kv_write).
            pos = tl.load(Lengths + rows, mask=row_mask, other=0).to(tl.int64)
            in_kv = (cols >= C) & (cols < N)
            c = tl.where(in_kv, cols - C, 0) % C  # column within K or V
            h, d = c // HEAD_DIM, c % HEAD_DIM
            is_k = cols < 2 * C
            tl.store(_cache_rows(KC, k_strides, rows, pos, h, d), out, mask=row_mask[:, None] & (in_kv & is_k)[None, :])
            tl.store(
                _cache_rows(VC, v_strides, rows, pos, h, d), out, mask=row_mask[:, None] & (in_kv & ~is_k)[None, :]
            )


@triton.jit
def _cache_rows(Cache, strides, rows, pos, h, d):
    """Pointers to cache[rows, h, pos, d] of a (B, H, T_max, D) cache with these strides: (rows, columns)."""
    sb, sh, st, sd = strides
    return Cache + rows[:, None] * sb + pos[:, None] * st + (h * sh + d * sd)[None, :]


@triton.jit
def _finish(
    acc,
    rows,
    cols,
    pid_n,
    split,
    Bias,
    res,
    y,
    partial,
    kv,
    M,
    N,
    APPLY_GELU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The epilogue, after the arrival when the K range was split (partial = (P, Counters, splits) then,
    None with one split): acc is this program's (BLOCK_M, BLOCK_N) share of the output tile."""
    if partial is not None:
        P, Counters, SPLITS = partial
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
            _epilogue(acc, rows, cols, pid_n, Bias, res, y, kv, M, N, APPLY_GELU, BLOCK_N)
            tl.store(Counters + pid_n, 0)  # the next launch on this stream finds zeros
    else:
        _epilogue(acc, rows, cols, pid_n, Bias, res, y, kv, M, N, APPLY_GELU, BLOCK_N)


@triton.jit
def _row_stats(x, M, K, eps, ROWS: tl.constexpr, STATS_COLS: tl.constexpr):
    """Each row's mean and rstd over its K columns, as kernels.norm.kernel computes them: (ROWS,) each."""
    X, stride_xm, stride_xk = x
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, STATS_COLS)
    mean = tl.zeros((ROWS,), dtype=tl.float32)
    rstd = tl.zeros((ROWS,), dtype=tl.float32)
    for r in tl.static_range(ROWS):  # rows past M (ROWS is M rounded up to a power of two) load zeros
        v = tl.load(X + r * stride_xm + cols * stride_xk, mask=(cols < K) & (cols * 0 + r < M), other=0.0)
        m, s, _ = moments(v.to(tl.float32), cols < K, K, eps, 0)
        mean = tl.where(rows == r, m, mean)
        rstd = tl.where(rows == r, s, rstd)
    return mean, rstd


@triton.jit
def _rows_times(x, w, ks, k_mask, stats, norm, M, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """x's rows over columns ks (with norm, layer-normed with the rows' stats = (mean, rstd), rounded to x's
    dtype as the unfused path stores them) times the weight tile w (len(ks) x BLOCK_N): (ROWS, BLOCK_N) in
    fp32. One row at a time on the vector units: for a handful of rows tl.dot would pad them to 16."""
    X, stride_xm, stride_xk = x
    rows = tl.arange(0, ROWS)
    wf = w.to(tl.float32)
    if norm is not None:
        LnW, LnB, _ = norm
        mean, rstd = stats
        lw = tl.load(LnW + ks, mask=k_mask, other=0.0).to(tl.float32)
        lb = tl.load(LnB + ks, mask=k_mask, other=0.0).to(tl.float32)
    out = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for r in tl.static_range(ROWS):
        a = tl.load(X + r * stride_xm + ks * stride_xk, mask=k_mask & (ks * 0 + r < M), other=0.0).to(tl.float32)
        if norm is not None:  # the same expression as layer_norm's
            mean_r = tl.sum(tl.where(rows == r, mean, 0.0), axis=0)
            rstd_r = tl.sum(tl.where(rows == r, rstd, 0.0), axis=0)
            a = tl.where(k_mask, (a - mean_r) * rstd_r * lw + lb, 0.0).to(X.dtype.element_ty).to(tl.float32)
        out = tl.where(rows[:, None] == r, tl.sum(a[:, None] * wf, axis=0)[None, :], out)
    return out


@triton.jit
def load_slice(pid_n, split, w, N, K, K_PER_SPLIT, BLOCK_N: tl.constexpr, HEAD_K: tl.constexpr, TAIL_K: tl.constexpr):
    """The slice of the weight w = (W, stride_wn, stride_wk) for (column tile, split): HEAD_K rows of K, then
    TAIL_K more; returned as (w0, w1), w1 being w0 when TAIL_K is 0."""
    W, stride_wn, stride_wk = w
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
    w_slice,
    pid_n,
    split,
    x,
    norm,
    Bias,
    res,
    y,
    partial,
    kv,
    M,
    N,
    K,
    K_PER_SPLIT,
    wait,
    APPLY_GELU: tl.constexpr,
    PDL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_K: tl.constexpr,
    TAIL_K: tl.constexpr,
    STATS_COLS: tl.constexpr,
):
    """The rest of a (column tile, split) once its slice w_slice = load_slice(...) is on its way: the wait for
    what earlier work writes, then the rows times the slice and the epilogue.

    x = (X, stride_xm, stride_xk); norm = (LnW, LnB, eps) or None; Bias or None; res = (R, stride_rm) or None;
    y = (Y, stride_ym); partial = (P, Counters, splits) or None (one split); kv = (k_cache, v_cache, lengths,
    head_dim, k_strides, v_strides) or None. wait = (Sync, stage, arrivals): wait for `arrivals` arrivals at
    Sync[stage] (kernels.barrier); None: wait for the kernel ahead under PDL."""
    w0, w1 = w_slice
    cols = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * K_PER_SPLIT
    k_hi = min(k_lo + K_PER_SPLIT, K)
    ks0 = k_lo + tl.arange(0, HEAD_K)
    if wait is not None:
        Sync, stage, arrivals = wait
        barrier.wait(Sync, stage, arrivals)
    else:
        pdl.wait(PDL)  # from here on x, the residual, the caches and the partials: what earlier kernels write
    stats = (tl.zeros((ROWS,), dtype=tl.float32), tl.zeros((ROWS,), dtype=tl.float32))
    if norm is not None:  # every program needs the statistics of the full rows, not only of its slice
        stats = _row_stats(x, M, K, norm[2], ROWS, STATS_COLS)
    acc = _rows_times(x, w0, ks0, ks0 < k_hi, stats, norm, M, ROWS, BLOCK_N)
    if TAIL_K > 0:
        ks1 = k_lo + HEAD_K + tl.arange(0, TAIL_K)
        acc += _rows_times(x, w1, ks1, ks1 < k_hi, stats, norm, M, ROWS, BLOCK_N)
    rows = tl.arange(0, ROWS).to(tl.int64)
    _finish(acc, rows, cols, pid_n, split, Bias, res, y, partial, kv, M, N, APPLY_GELU, ROWS, BLOCK_N)
