"""The decode step's linear as one launch: y = act(LN(x) @ weight.T + bias) + residual, for x of at most 16 rows.

The epilogue rung's decode path is two launches (split-K partials, then a reduce that applies the epilogue), a third
for the LayerNorm before it and a fourth for the KV-cache write after c_attn. Here one grid of
(column tiles, splits) does all of it:

    prologue   with norm=(w, b, eps): each program computes every row's mean and rstd over the full row in
               fp32 (mean, then the variance as the mean of squared differences, as kernels.ops.layer_norm.kernel),
               normalises its own K slice, applies w and b and rounds to x's dtype: that is its dot operand.
    body       the split-K kernel's loop: the program's x rows times its weight slice, fp32 accumulator.
    arrival    with several splits, each program stores its fp32 partial, then increments its column tile's
               counter (kernels.arrival). The program that sees splits - 1 arrived last: it adds all the
               partials in split order, so the result does not depend on which program ran when.
    epilogue   the last arriver (or the only program, with one split) adds the bias, applies GPT-2's tanh
               GELU, adds the residual and stores y; with kv=(k_cache, v_cache, lengths) it also stores
               columns [C, 2C) and [2C, 3C) of row b at k_cache[b, h, lengths[b], d] / v_cache[...], then
               sets the counter back to 0 for the next launch (and for CUDA-graph replays).

Two forms of the same job. The K loop (block_k up to 256) steps through each split's slice in block_k
tiles with tl.dot on a 16-row tile. The prefetch form (block_k 512 and up, the GPU default) loads the
program's whole weight slice at once, then multiplies it by each row on the vector units; launched with
pdl=True (kernels.pdl) it does that load before waiting for the kernel ahead, so the weights stream in
while that kernel finishes. Both give the same result up to the order of the fp32 sums. The device functions
of their work items are in items.py beside it; the tile rules and traffic model in tiles.py.

Memory traffic: the weight is read exactly once, as in the split-K path. The LayerNorm output never goes
to memory: each program re-reads x's rows for the statistics instead (a few KB, from L2), so the cost of
fusing the norm grows with the number of programs, not with the weight. The partials make one round trip
through L2, as before, but the launch that reads them is gone, and so are the separate y and KV-row
reads of the cache write.
"""

import math

import torch
import triton
import triton.language as tl

from ... import arrival, autotune, launch, pdl, stamps
from ...config import (
    cdiv,
    explain_resources,
    new_output,
    next_pow2,
    overlaps_launches,
)
from ...parts.stats import normalized
from ..linear.kernel import DECODE_ROWS, check_args
from .items import (
    finish,
    load_slice,
    row_stats,
    slice_times,
    store_gelu,
    store_linear,
    store_swiglu,
    weight_rows,
)
from .tiles import (
    prefetches,
    resolve_config,
    slice_tiles,
    splits_of,
    traffic,  # noqa: F401 (decode_linear's traffic model, named beside it)
)

NAME = "decode_linear"


@triton.jit
def _decode_linear_kernel(
    x,
    w,
    norm,
    y,
    Bias,
    res,
    kv,
    rope,
    partial,
    M,
    N,
    K,
    K_PER_SPLIT,
    EPILOGUE: tl.constexpr,
    SWIGLU: tl.constexpr,
    RMS: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr,
    STATS_COLS: tl.constexpr,
    PDL: tl.constexpr,
    Stamps,
):
    """The K-loop form, its groups (x, w, norm, y, res, kv, rope, partial) as kernels.ops.decode_linear.items names
    them, each None where the launch has none."""
    stamps.begin(Stamps)
    pdl.launch_dependents(PDL)
    pdl.wait(PDL)  # the loop reads x with every weight tile: nothing to load before the wait
    X, stride_xm, stride_xk = x
    W, stride_wn, stride_wk = w
    out = (y, Bias, res, kv, rope)  # built here: no tuple the host hands a kernel holds a None
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M).to(tl.int64)  # all M <= BLOCK_M rows in one tile
    row_mask = rows < M
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * K_PER_SPLIT
    k_hi = min(k_lo + K_PER_SPLIT, K)

    if norm is not None:
        LnW, LnB, _ = norm
        # Every program needs the statistics of the full rows, not only of its slice; from ROWS rows to the
        # dot's 16-row tile: row i takes row i's statistics.
        mean_r, rstd_r = row_stats(x, norm, M, K, RMS, ROWS, STATS_COLS)
        pick = rows[:, None] == tl.arange(0, ROWS)[None, :]
        mean = tl.sum(tl.where(pick, mean_r[None, :], 0.0), axis=1)
        rstd = tl.sum(tl.where(pick, rstd_r[None, :], 0.0), axis=1)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        mask = row_mask[:, None] & (ks < k_hi)[None, :]
        a = tl.load(X + rows[:, None] * stride_xm + ks[None, :] * stride_xk, mask=mask, other=0.0)
        if norm is not None:
            # Rounded to x's dtype: the operand the unfused path reads.
            lw = tl.load(LnW + ks, mask=ks < k_hi, other=0.0).to(tl.float32)[None, :]
            lb = None
            centred = a.to(tl.float32)
            if not RMS:  # RMSNorm takes no mean out
                lb = tl.load(LnB + ks, mask=ks < k_hi, other=0.0).to(tl.float32)[None, :]
                centred = tl.where(mask, centred - mean[:, None], 0.0)
            a = tl.where(mask, normalized(centred, rstd[:, None], lw, lb), 0.0).to(X.dtype.element_ty)
        w_rows = weight_rows(cols, N, rope, SWIGLU)
        b = tl.load(W + w_rows[None, :] * stride_wn + ks[:, None] * stride_wk, mask=(ks < k_hi)[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)

    finish(acc, rows, cols, pid_n, split, partial, out, M, N, EPILOGUE=EPILOGUE, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    stamps.end(Stamps)


@triton.jit
def _decode_prefetch_kernel(
    x,
    w,
    norm,
    y,
    Bias,
    res,
    kv,
    rope,
    partial,
    M,
    N,
    K,
    K_PER_SPLIT,
    EPILOGUE: tl.constexpr,
    SWIGLU: tl.constexpr,
    RMS: tl.constexpr,
    PDL: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_K: tl.constexpr,
    TAIL_K: tl.constexpr,
    STATS_COLS: tl.constexpr,
    Stamps,
):
    """The same job as _decode_linear_kernel when each split is one K step: the program loads its whole
    weight slice (HEAD_K columns of K, then TAIL_K more, both powers of two, TAIL_K possibly 0) before it
    reads anything an earlier kernel writes, so under PDL the weights are in flight while that kernel ends."""
    stamps.begin(Stamps)
    pdl.launch_dependents(PDL)
    out = (y, Bias, res, kv, rope)  # built here: no tuple the host hands a kernel holds a None
    pid_n, split = tl.program_id(0), tl.program_id(1)
    w_slice = load_slice(pid_n, split, w, N, K, K_PER_SPLIT, rope, BLOCK_N, HEAD_K, TAIL_K, SWIGLU=SWIGLU)
    pdl.wait(PDL)  # from here on x, the residual, the caches and the partials: what earlier kernels write
    acc = slice_times(w_slice, split, x, norm, M, K, K_PER_SPLIT, RMS, ROWS, BLOCK_N, HEAD_K, TAIL_K, STATS_COLS)
    rows = tl.arange(0, ROWS).to(tl.int64)
    cols = tl.cast(pid_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    finish(acc, rows, cols, pid_n, split, partial, out, M, N, EPILOGUE=EPILOGUE, BLOCK_M=ROWS, BLOCK_N=BLOCK_N)
    stamps.end(Stamps)


def _check(x, weight, bias, activation, residual, norm, kv, rope=None):
    """Validate everything before any launch; returns (rows, key/value heads of the cache write, 0 without)."""
    if activation not in (None, "gelu", "swiglu"):
        raise ValueError(f"{NAME}: activation={activation!r} is not supported (allowed: None, 'gelu', 'swiglu')")
    swiglu = activation == "swiglu"
    in_features, out_features, _ = check_args(NAME, x, weight, bias, None if swiglu else activation, residual)
    rows = math.prod(x.shape[:-1])
    if rows > DECODE_ROWS:
        raise ValueError(
            f"{NAME}: x has {rows} rows, more than the {DECODE_ROWS} one decode launch holds in its single row "
            "tile; use kernels.linear (after kernels.layer_norm) for prefill-shaped inputs"
        )
    if swiglu and (out_features % 2 or bias is not None or residual is not None or kv is not None):
        raise ValueError(
            f"{NAME}: activation='swiglu' takes gate_up = [W_gate; W_up] (2F, {in_features}), no bias, residual or "
            f"kv; got weight {tuple(weight.shape)}"
            + "".join(
                f", a {name}" for name, t in (("bias", bias), ("residual", residual), ("kv", kv)) if t is not None
            )
        )
    tensors = {"weight": weight, "bias": bias, "residual": residual}
    if norm is not None:
        if not isinstance(norm, tuple | list) or len(norm) != 3:
            raise ValueError(
                f"{NAME}: norm must be (weight, bias, eps), bias None for RMSNorm, got {type(norm).__name__}"
            )
        ln_w, ln_b, eps = norm
        if ln_w.shape != (in_features,) or (ln_b is not None and ln_b.shape != (in_features,)):
            got = ", ".join(str(tuple(t.shape)) for t in (ln_w, ln_b) if t is not None)
            raise ValueError(f"{NAME}: norm weight and bias must have shape ({in_features},), got {got}")
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not (0 <= eps < math.inf):
            raise ValueError(f"{NAME}: norm eps must be a finite number >= 0, got {eps!r}")
        tensors |= {"norm weight": ln_w, "norm bias": ln_b}
    if rope is not None and kv is None:
        raise ValueError(f"{NAME}: rope turns q and k at the cache's lengths, so it needs kv")
    if rope is not None and (isinstance(rope, bool) or not isinstance(rope, int | float) or not 1 < rope < math.inf):
        raise ValueError(f"{NAME}: rope must be rotary's theta, a finite number above 1, got {rope!r}")
    heads = 0
    if kv is not None:
        if not isinstance(kv, tuple | list) or len(kv) != 3:
            raise ValueError(f"{NAME}: kv must be (k_cache, v_cache, lengths), got {type(kv).__name__}")
        k_cache, v_cache, lengths = kv
        if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
            raise ValueError(
                f"{NAME}: caches must be (B, H_kv, T_max, D) alike, got {tuple(k_cache.shape)} and "
                f"{tuple(v_cache.shape)}"
            )
        batch, heads, t_max, head_dim = k_cache.shape
        q_cols = out_features - 2 * heads * head_dim
        if batch != rows or not heads or not t_max or not head_dim or q_cols <= 0 or q_cols % head_dim:
            raise ValueError(
                f"{NAME}: with kv the weight holds q's heads, then K's and V's ((H + 2 H_kv) D, in) rows) and the "
                f"caches are (B={rows}, H_kv, T_max >= 1, D); got weight {tuple(weight.shape)} and caches "
                f"{tuple(k_cache.shape)}"
            )
        if rope is not None and head_dim % 2:
            raise ValueError(f"{NAME}: rope turns pairs of dims, so the head size must be even, got {head_dim}")
        if lengths.shape != (rows,) or lengths.dtype not in (torch.int32, torch.int64) or lengths.device != x.device:
            raise ValueError(
                f"{NAME}: lengths must be a ({rows},) int32 or int64 tensor on {x.device}, got "
                f"{tuple(lengths.shape)} {lengths.dtype} on {lengths.device}"
            )
        tensors |= {"k_cache": k_cache, "v_cache": v_cache}
    for name, t in tensors.items():
        if t is not None and (t.dtype != x.dtype or t.device != x.device):
            raise ValueError(
                f"{NAME}: {name} is {t.dtype} on {t.device}, but x is {x.dtype} on {x.device}; they must match"
            )
    return rows, heads


def decode_linear(
    x, weight, bias=None, *, activation=None, residual=None, norm=None, kv=None, rope=None, config=None, pdl=False
):
    """y = act(LN(x) @ weight.T + bias) + residual for decode-shaped x (..., in) with at most 16 rows, one launch.

    norm=(ln_weight, ln_bias, eps): x is layer-normed in the prologue (as kernels.layer_norm would, rounded to
    x's dtype before the dot); ln_bias None: RMSNorm (as kernels.rms_norm). activation: None, "gelu", or
    "swiglu": weight is gate_up = [W_gate; W_up] (2F, in) and y = silu(x W_gate^T) * (x W_up^T), (..., F).
    kv=(k_cache, v_cache, lengths): weight is c_attn's, q's H heads over K's and V's H_kv ((H + 2 H_kv) D, in);
    K's and V's columns of each row b are also stored into k_cache[b, h, lengths[b], d] / v_cache[...] (caches
    (B, H_kv, T_max, D), one layer's views, lengths (B,) int32/int64 on the device, 0 <= lengths[b] < T_max,
    which the caller guarantees: the kernel reads them on the device and cannot check them); y (all the columns)
    is still returned. rope=theta (with kv): q's and k's columns turned by rotary positions at lengths[b] (as
    kernels.rotary), before the cache write.

    Tiles whose block_k covers a split's K slice (the GPU default) take the prefetch form: each program loads
    its whole weight slice first. pdl=True launches with programmatic dependent launch (kernels.pdl) where
    the GPU has it (sm_90 on), so that load overlaps the end of the kernel before; elsewhere it is ignored."""
    rows, heads = _check(x, weight, bias, activation, residual, norm, kv, rope)
    in_features, out_features = x.shape[-1], weight.shape[0]
    swiglu = activation == "swiglu"
    y_features = out_features // 2 if swiglu else out_features
    out_shape = (*x.shape[:-1], y_features)
    if config == "autotune":
        config = tuned_config(x, weight, bias, activation=activation, residual=residual, norm=norm, kv=kv, rope=rope)
    cfg = resolve_config(config, rows, out_features, in_features, x.dtype, x.device)
    y = new_output(x, (rows, y_features))
    if rows == 0:
        return y.view(out_shape)
    flat = x.dim() == 2  # the common case keeps its tensors: a view costs the host more than the check
    x2 = x if flat else x.reshape(rows, in_features)
    k_per_split, splits = splits_of(cfg, in_features)
    tiles_n = cdiv(out_features, cfg.block_n)
    # The kernels' groups (kernels.ops.decode_linear.items): a tensor with its strides, None for each part this
    # launch has none of.
    # RMSNorm has no bias: its weight stands in the tuple, never read as one (RMS), since Triton 3.6 compiles no
    # None inside a tuple that a device function is handed.
    norm_, rms = None, norm is not None and norm[1] is None
    if norm is not None:
        norm_ = (norm[0].contiguous(), (norm[0] if rms else norm[1]).contiguous(), float(norm[2]))
    res = None
    if residual is not None:
        r2 = residual.reshape(rows, out_features).contiguous()
        res = (r2, r2.stride(0))
    partial = None
    if splits > 1:  # the split partials and the arrival counters of the column tiles
        partial = (
            new_output(x, (splits, rows, out_features), torch.float32),
            arrival.counters(x.device, tiles_n),
            splits,
        )
    kv_ = rope_ = None
    if kv is not None:
        k_cache, v_cache, lengths = kv
        head_dim = k_cache.shape[-1]
        k_start, kv_cols = out_features - 2 * heads * head_dim, heads * head_dim
        kv_ = (k_cache, v_cache, lengths, head_dim, k_start, kv_cols, k_cache.stride(), v_cache.stride())
        if rope is not None:  # q's heads and k's are turned: every column before V's
            rope_ = (math.log2(rope), k_start + kv_cols, head_dim)
    bias_ = bias.contiguous() if bias is not None else None
    groups = (
        (x2, x2.stride(0), x2.stride(1)),
        (weight, weight.stride(0), weight.stride(1)),
        norm_,
        (y, y.stride(0)),
        bias_,
        res,
        kv_,
        rope_,
        partial,
        rows,
        out_features,
        in_features,
        k_per_split,
    )
    epilogue = store_swiglu if swiglu else store_gelu if activation == "gelu" else store_linear
    pdl = bool(pdl) and overlaps_launches(x.device)
    with explain_resources(NAME, cfg):
        if prefetches(cfg):
            head_k, tail_k = slice_tiles(k_per_split)
            launch.fast(_decode_prefetch_kernel)[(tiles_n, splits)](
                *groups,
                EPILOGUE=epilogue,
                SWIGLU=swiglu,
                RMS=rms,
                PDL=pdl,
                ROWS=next_pow2(rows),
                BLOCK_N=cfg.block_n,
                HEAD_K=head_k,
                TAIL_K=tail_k,
                STATS_COLS=next_pow2(in_features),
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
                launch_pdl=pdl,
            )
        else:
            launch.fast(_decode_linear_kernel)[(tiles_n, splits)](
                *groups,
                EPILOGUE=epilogue,
                SWIGLU=swiglu,
                RMS=rms,
                PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                BLOCK_M=16,
                BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k,
                ROWS=next_pow2(rows),
                STATS_COLS=next_pow2(in_features),
                PDL=pdl,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
                launch_pdl=pdl,
            )
    return y if flat else y.view(out_shape)


def tuned_config(x, weight, bias=None, *, activation=None, residual=None, norm=None, kv=None, rope=None):
    """The fastest of linear's decode candidates for inputs like these (timed once per shape on a GPU, over
    random copies rotated past L2, the caches' lengths kept valid; defaults on CPU)."""
    rows = x.numel() // x.shape[-1]
    key = (
        "fused",
        rows,
        *weight.shape,
        x.dtype,
        bias is not None,
        activation,
        residual is not None,
        None if norm is None else norm[1] is None,
        None if kv is None else tuple(kv[0].shape),
        rope,
    )
    ln_w, ln_b, eps = norm if norm is not None else (None, None, None)
    k_cache, v_cache, lengths = kv if kv is not None else (None, None, None)

    def run(c, x, w, b, r, ln_w, ln_b, kc, vc, lens):
        return decode_linear(
            x,
            w,
            b,
            activation=activation,
            residual=r,
            norm=None if ln_w is None else (ln_w, ln_b, eps),
            kv=None if kc is None else (kc, vc, lens),
            rope=rope,
            config=c,
        )

    inputs = (x, weight, bias, residual, ln_w, ln_b, k_cache, v_cache, lengths)
    return autotune.pick("linear_decode", key, run, x.device, inputs=inputs)
