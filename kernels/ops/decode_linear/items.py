"""The work items of decode_linear, shared by its two kernels (kernels.ops.decode_linear.kernel) and by the decode layer
kernel (kernels.ops.decode_layer.kernel), each a device function of one idea:

    load_slice    the loads of a (column tile, split)'s weight slice, issued before anything waits
    row_stats     the LayerNorm or RMSNorm statistics of every row (the same arithmetic as kernels.parts.stats)
    slice_times   the rows, normalised, times the slice: the program's fp32 share of its output tile (a row at a
                  time, or with DOT, the megakernel's variant, 8 or 16 rows in one tl.dot)
    finish        with several splits, the arrival of the partials (the last arriver adds them all), then the
    epilogue:     store_linear (bias, residual, and with kv rotary positions and the KV-cache write),
                  store_gelu (the same with GPT-2's GELU after the bias) and store_swiglu (silu(gate) * up), each
                  with one signature so that a kernel takes the one it needs as a constexpr

A prefetch-form item is load_slice, a wait for what earlier work writes (the kernel ahead under PDL, or a stage
barrier), then slice_times and finish, so the slice is in flight while the program waits. The groups the
functions pass: x = (X, stride_xm, stride_xk); w = (W, stride_wn, stride_wk); norm = (LnW, LnB, eps) or None,
LnB unread with RMS (RMSNorm has no bias); out = (y, Bias, res, kv, rope) with y = (Y, stride_ym), res = (R,
stride_rm), and Bias, res, kv, rope each None where the launch has none (kv and rope as _stored takes them);
partial = (P, Counters, splits) or None with one split.
"""

import triton
import triton.language as tl

from ...parts.rotate import rotate
from ...parts.stats import inverse_rms, moments, normalized
from ..linear.kernel import bias_gelu_residual


@triton.jit
def weight_rows(cols, N, rope, SWIGLU: tl.constexpr):
    """The weight row each of a tile's columns computes, which is also its output column (before SwiGLU halves
    them). Most launches take rows in order. SWIGLU: the gate's row f and the up projection's row F + f side by
    side (columns 2f and 2f + 1 of the tile), so the epilogue gates whole pairs. rope = (log2_theta, turned,
    head_dim): within each rotated head (columns below `turned`), dims i and i + head_dim / 2 side by side,
    the pairs the rotation mixes. Columns past N wrap onto valid rows, as the K loop's do."""
    c = cols % N
    if SWIGLU:
        return c // 2 + (c % 2) * (N // 2)
    if rope is not None:
        _, turned, head_dim = rope
        w = c % head_dim
        return tl.where(c < turned, c - w + w // 2 + (w % 2) * (head_dim // 2), c)
    return c


@triton.jit
def store_linear(acc, rows, cols, pid_n, out, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The epilogue of a plain projection on the fp32 tile acc at (rows, cols): bias, residual, and with kv
    rotary positions and the KV-cache write (as _stored does them), then y."""
    _stored(acc, rows, cols, pid_n, out, M, N, APPLY_GELU=False, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)


@triton.jit
def store_gelu(acc, rows, cols, pid_n, out, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """store_linear with GPT-2's tanh GELU after the bias (mlp.c_fc)."""
    _stored(acc, rows, cols, pid_n, out, M, N, APPLY_GELU=True, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)


@triton.jit
def store_swiglu(acc, rows, cols, pid_n, out, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """silu(gate) * up of the tile's BLOCK_N / 2 features (its columns in weight_rows' SWIGLU order), as
    kernels.ops.swiglu.kernel's epilogue, stored to y's N / 2 columns. out holds y alone."""
    y, _, _, _, _ = out
    Y, stride_ym = y
    gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
    features = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    mask = (rows < M)[:, None] & (features < N // 2)[None, :]
    gated = (gate * tl.sigmoid(gate) * up).to(Y.dtype.element_ty)
    tl.store(Y + rows[:, None] * stride_ym + features[None, :], gated, mask=mask)


@triton.jit
def _stored(acc, rows, cols, pid_n, out, M, N, APPLY_GELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """linear's epilogue (kernels.ops.linear.kernel.bias_gelu_residual), then y. With rope = (log2_theta, turned,
    head_dim), the q and k columns turned by the rows' positions (lengths[b], as the rotary launch turns
    them); with kv = (k_cache, v_cache, lengths, head_dim, k_start, kv_cols, k_strides, v_strides) the new K
    and V rows stored into the caches at lengths[b], K at columns [k_start, k_start + kv_cols) and V after it."""
    y, Bias, res, kv, rope = out
    Y, stride_ym = y
    row_mask = rows < M
    R, stride_rm = None, 0
    if res is not None:
        R, stride_rm = res
    at = weight_rows(cols, N, rope, SWIGLU=False)  # each tile column's output column
    acc = bias_gelu_residual(
        acc,
        rows,
        at,
        Bias,
        R,
        M,
        N,
        stride_rm,
        HAS_BIAS=Bias is not None,
        APPLY_GELU=APPLY_GELU,
        HAS_RESIDUAL=res is not None,
    )
    if kv is not None:
        KC, VC, Lengths, HEAD_DIM, K_START, KV_COLS, k_strides, v_strides = kv
    if rope is not None:  # every tile turns q's or k's columns, or stores V's beside them
        pos = tl.load(Lengths + rows, mask=row_mask, other=0).to(tl.int64)
        log2_theta, turned, head_dim = rope
        # c_attn's output as the rotary launch would read it (rounded to y's dtype), in (i, i + D/2) pairs.
        pairs = acc.to(Y.dtype.element_ty).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(pairs, (BLOCK_M, BLOCK_N // 2, 2)))
        dims = (pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)) % (head_dim // 2)
        y1, y2 = rotate(x1, x2, pos, dims, head_dim, log2_theta)
        turned_acc = tl.reshape(tl.join(y1, y2), (BLOCK_M, BLOCK_N))
        acc = tl.where((cols % N < turned)[None, :], turned_acc, acc)
    mask = row_mask[:, None] & (cols < N)[None, :]
    stored = acc.to(Y.dtype.element_ty)
    tl.store(Y + rows[:, None] * stride_ym + at[None, :], stored, mask=mask)
    if kv is not None:
        if pid_n * BLOCK_N + BLOCK_N > K_START:  # tiles wholly inside q's columns store no cache rows
            if rope is None:
                pos = tl.load(Lengths + rows, mask=row_mask, other=0).to(tl.int64)
            # K's heads at [k_start + h * D, ...), V's KV_COLS further on. 64-bit offsets throughout: a
            # cache can pass 2^31 elements (see kv_write).
            in_kv = (at >= K_START) & (cols < N)
            c = tl.where(in_kv, at - K_START, 0) % KV_COLS  # column within K or V
            h, d = c // HEAD_DIM, c % HEAD_DIM
            is_k = at < K_START + KV_COLS
            k_rows = _cache_rows(KC, k_strides, rows, pos, h, d)
            tl.store(k_rows, stored, mask=row_mask[:, None] & (in_kv & is_k)[None, :])
            v_rows = _cache_rows(VC, v_strides, rows, pos, h, d)
            tl.store(v_rows, stored, mask=row_mask[:, None] & (in_kv & ~is_k)[None, :])


@triton.jit
def _cache_rows(Cache, strides, rows, pos, h, d):
    """Pointers to cache[rows, h, pos, d] of a (B, H, T_max, D) cache with these strides: (rows, columns)."""
    sb, sh, st, sd = strides
    return Cache + rows[:, None] * sb + pos[:, None] * st + (h * sh + d * sd)[None, :]


@triton.jit
def finish(
    acc,
    rows,
    cols,
    pid_n,
    split,
    partial,
    out,
    M,
    N,
    EPILOGUE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """EPILOGUE (one of the store_* above) on this program's fp32 share acc of its (BLOCK_M, BLOCK_N) output
    tile; with several splits (partial = (P, Counters, splits)), after the arrival, by the last arriver alone."""
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
            EPILOGUE(acc, rows, cols, pid_n, out, M, N, BLOCK_M, BLOCK_N)
            tl.store(Counters + pid_n, 0)  # the next launch on this stream finds zeros
    else:
        EPILOGUE(acc, rows, cols, pid_n, out, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def row_stats(x, norm, M, K, RMS: tl.constexpr, ROWS: tl.constexpr, STATS_COLS: tl.constexpr):
    """Each row's mean and rstd over its K columns, one row at a time (STATS_COLS, K rounded up to a power of
    two, loaded at once), as kernels.ops.layer_norm.kernel computes them: (ROWS,) each, rows past M zero. RMS:
    RMSNorm's, as kernels.ops.rms_norm.kernel computes it (mean 0)."""
    X, stride_xm, stride_xk = x
    _, _, eps = norm
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, STATS_COLS)
    mean = tl.zeros((ROWS,), dtype=tl.float32)
    rstd = tl.zeros((ROWS,), dtype=tl.float32)
    for r in tl.static_range(ROWS):  # rows past M (ROWS is M rounded up to a power of two) load zeros
        v = tl.load(X + r * stride_xm + cols * stride_xk, mask=(cols < K) & (cols * 0 + r < M), other=0.0)
        if RMS:
            m, s = 0.0, inverse_rms(v.to(tl.float32), K, eps, 0)
        else:
            m, s, _ = moments(v.to(tl.float32), cols < K, K, eps, 0)
        mean = tl.where(rows == r, m, mean)
        rstd = tl.where(rows == r, s, rstd)
    return mean, rstd


@triton.jit
def _rows_times(x, w, ks, k_mask, stats, norm, M, RMS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """x's rows over columns ks (with norm, normalised with the rows' stats = (mean, rstd), rounded to x's
    dtype as the unfused path stores them) times the weight tile w (len(ks) x BLOCK_N): (ROWS, BLOCK_N) in
    fp32. One row at a time on the vector units: for a handful of rows tl.dot would pad them to 16."""
    X, stride_xm, stride_xk = x
    rows = tl.arange(0, ROWS)
    wf = w.to(tl.float32)
    if norm is not None:
        LnW, LnB, _ = norm
        mean, rstd = stats
        lw = tl.load(LnW + ks, mask=k_mask, other=0.0).to(tl.float32)
        lb = None
        if not RMS:
            lb = tl.load(LnB + ks, mask=k_mask, other=0.0).to(tl.float32)
    out = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for r in tl.static_range(ROWS):
        a = tl.load(X + r * stride_xm + ks * stride_xk, mask=k_mask & (ks * 0 + r < M), other=0.0).to(tl.float32)
        if norm is not None:
            rstd_r = tl.sum(tl.where(rows == r, rstd, 0.0), axis=0)
            if not RMS:  # RMSNorm takes no mean out
                a = a - tl.sum(tl.where(rows == r, mean, 0.0), axis=0)
            a = tl.where(k_mask, normalized(a, rstd_r, lw, lb), 0.0).to(X.dtype.element_ty).to(tl.float32)
        out = tl.where(rows[:, None] == r, tl.sum(a[:, None] * wf, axis=0)[None, :], out)
    return out


@triton.jit
def load_slice(
    pid_n,
    split,
    w,
    N,
    K,
    K_PER_SPLIT,
    rope,
    BLOCK_N: tl.constexpr,
    HEAD_K: tl.constexpr,
    TAIL_K: tl.constexpr,
    SWIGLU: tl.constexpr,
):
    """The slice of the weight w = (W, stride_wn, stride_wk) for (column tile, split): HEAD_K rows of K, then
    TAIL_K more, of the weight's rows in weight_rows' order; returned as (w0, w1), w1 being w0 when TAIL_K is 0."""
    W, stride_wn, stride_wk = w
    cols = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_cols = W + weight_rows(cols, N, rope, SWIGLU)[None, :] * stride_wn
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
def slice_times(
    w_slice,
    split,
    x,
    norm,
    M,
    K,
    K_PER_SPLIT,
    RMS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_K: tl.constexpr,
    TAIL_K: tl.constexpr,
    STATS_COLS: tl.constexpr,
    DOT: tl.constexpr = False,
):
    """The rows of x (with norm, normalised by their statistics over the full row) times the slice w_slice =
    load_slice(...) of this split: the program's fp32 (ROWS, BLOCK_N) share of its output tile. It reads x,
    so it comes after the wait for what earlier work writes. DOT (ROWS 8 or 16): the rows in one tl.dot where a
    part of the slice spans 16 or more of K (_rows_dot)."""
    w0, w1 = w_slice
    k_lo = split * K_PER_SPLIT
    k_hi = min(k_lo + K_PER_SPLIT, K)
    ks0 = k_lo + tl.arange(0, HEAD_K)
    stats = (tl.zeros((ROWS,), dtype=tl.float32), tl.zeros((ROWS,), dtype=tl.float32))
    if norm is not None:  # every program needs the statistics of the full rows, not only of its slice
        stats = row_stats(x, norm, M, K, RMS, ROWS, STATS_COLS)
    if DOT and HEAD_K >= 16:
        acc = _rows_dot(x, w0, ks0, ks0 < k_hi, stats, norm, M, RMS, ROWS, BLOCK_N)
    else:
        acc = _rows_times(x, w0, ks0, ks0 < k_hi, stats, norm, M, RMS, ROWS, BLOCK_N)
    if TAIL_K > 0:
        ks1 = k_lo + HEAD_K + tl.arange(0, TAIL_K)
        if DOT and TAIL_K >= 16:
            acc += _rows_dot(x, w1, ks1, ks1 < k_hi, stats, norm, M, RMS, ROWS, BLOCK_N)
        else:
            acc += _rows_times(x, w1, ks1, ks1 < k_hi, stats, norm, M, RMS, ROWS, BLOCK_N)
    return acc


@triton.jit
def _rows_dot(x, w, ks, k_mask, stats, norm, M, RMS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """_rows_times for ROWS 8 or 16 in one tl.dot: the rows as one tile of 16 (rows past M zero), normalised and
    rounded as _rows_times rounds them, times w in x's dtype, summed in fp32 (fp32 operands at full precision).
    One product where the row loop reduces over K once per row, and fewer registers spilled in the megakernel's
    program (benchmarks/RESULTS.md)."""
    X, stride_xm, stride_xk = x
    R: tl.constexpr = 16
    rows = tl.arange(0, R)
    a = tl.load(
        X + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=(rows < M)[:, None] & k_mask[None, :], other=0.0
    ).to(tl.float32)
    if norm is not None:
        LnW, LnB, _ = norm
        mean, rstd = stats  # (ROWS,) each: spread to the tile's 16 rows
        own = rows[:, None] == tl.arange(0, ROWS)[None, :]
        rstd16 = tl.sum(tl.where(own, rstd[None, :], 0.0), axis=1)
        lw = tl.load(LnW + ks, mask=k_mask, other=0.0).to(tl.float32)
        if RMS:  # RMSNorm takes no mean out and adds no bias
            a = normalized(a, rstd16[:, None], lw[None, :], None)
        else:
            mean16 = tl.sum(tl.where(own, mean[None, :], 0.0), axis=1)
            lb = tl.load(LnB + ks, mask=k_mask, other=0.0).to(tl.float32)
            a = normalized(a - mean16[:, None], rstd16[:, None], lw[None, :], lb[None, :])
        a = tl.where(k_mask[None, :], a, 0.0)
    a = a.to(X.dtype.element_ty)
    if X.dtype.element_ty == tl.float32:
        prod = tl.dot(a, w.to(tl.float32), input_precision="ieee")
    else:
        prod = tl.dot(a, w.to(X.dtype.element_ty), out_dtype=tl.float32)
    if ROWS == R:
        out = prod
    else:  # the tile's first ROWS rows
        out, _ = tl.split(tl.permute(tl.reshape(prod, (2, ROWS, BLOCK_N)), (1, 2, 0)))
    return out
