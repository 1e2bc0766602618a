"""y = act(x @ weight.T + bias) + residual, with weight (out, in) like F.linear.

Prefill-shaped inputs use a tiled matmul: each program keeps a (BLOCK_M, BLOCK_N) fp32 accumulator in
registers and streams BLOCK_K-wide slices of x and weight through shared memory. Row tiles are
visited in groups of GROUP_M so neighbouring programs reuse the same weight tiles from L2. The
epilogue adds the bias, applies GPT-2's tanh GELU and adds the residual before the single store,
so the FFN's hidden activation is written to memory once and never read back for a separate GELU.
On Hopper and datacenter Blackwell (config.tma_matmul), 16-bit inputs take a persistent form of the same
kernel: one program per SM walks the output tiles, and the tiles of x, the weight and y are copied by the TMA
unit (tensor descriptors).

Decode-shaped inputs (M <= 16 rows) cannot fill a square tile, and one row tile over the output
columns gives too few programs to keep every SM streaming. There the reduction is split across
SPLIT_K programs that each read a distinct slice of the weight (the weight is read exactly once),
write fp32 partial sums, and a small second kernel adds the partials and applies the epilogue.
"""

import contextlib
import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from ... import autotune, launch, stamps
from ...config import (
    TileConfig,
    Traffic,
    as_config,
    buffered_stages,
    cdiv,
    check_dtype,
    check_fields,
    check_shared_memory,
    device_limits,
    explain_resources,
    fit_defaults,
    hbm_reads,
    l2_miss,
    mma_barrier_bytes,
    new_output,
    next_pow2,
    pipeline_stages,
    tma_matmul,
)

DECODE_ROWS = 16  # at most this many rows take the split-K path (tl.dot needs 16 rows)


@triton.jit
def gelu_tanh(x):
    # GPT-2's 0.5 * x * (1 + tanh(u)) with u = sqrt(2/pi) * (x + 0.044715 x^3), written as the exact
    # identity x * sigmoid(2u), which needs no tanh.
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return x * tl.sigmoid(2.0 * u)


@triton.jit
def bias_gelu_residual(
    acc,
    rows,
    cols,
    Bias,
    R,
    M,
    N,
    stride_rm,
    HAS_BIAS: tl.constexpr,
    APPLY_GELU: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    """The epilogue's arithmetic on the fp32 tile acc at (rows, cols), in the order every linear applies it;
    rows should be 64-bit where the residual can pass 2^31 elements."""
    if HAS_BIAS:
        acc += tl.load(Bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if APPLY_GELU:
        acc = gelu_tanh(acc)
    if HAS_RESIDUAL:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        acc += tl.load(R + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _epilogue_store(
    acc,
    rows,
    cols,
    Bias,
    R,
    Y,
    M,
    N,
    stride_rm,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    APPLY_GELU: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    acc = bias_gelu_residual(acc, rows, cols, Bias, R, M, N, stride_rm, HAS_BIAS, APPLY_GELU, HAS_RESIDUAL)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def tile_coords(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of output tile number `tile`, visited in groups of GROUP_M row tiles."""
    group_size = GROUP_M * tiles_n
    first_m = (tile // group_size) * GROUP_M
    group_m = min(tiles_m - first_m, GROUP_M)
    return first_m + (tile % group_size) % group_m, (tile % group_size) // group_m


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("M",))
def _linear_kernel(
    X,
    W,
    Bias,
    R,
    Y,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_rm,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    APPLY_GELU: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge wrap onto valid memory instead of being masked, so the loads in
    # the loop stay unmasked along M and N; the wrapped results are dropped by the masked store.
    x_ptrs = X + (rows % M)[:, None] * stride_xm + ks[None, :] * stride_xk
    w_ptrs = W + (cols % N)[None, :] * stride_wn + ks[:, None] * stride_wk  # (BLOCK_K, BLOCK_N) of weight.T

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=ks[None, :] < k_left, other=0.0)
        b = tl.load(w_ptrs, mask=ks[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    _epilogue_store(acc, rows, cols, Bias, R, Y, M, N, stride_rm, stride_ym, HAS_BIAS, APPLY_GELU, HAS_RESIDUAL)
    stamps.end(Stamps)


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("M",))
def _linear_persistent_kernel(
    XDesc,
    WDesc,
    YDesc,
    Bias,
    R,
    M,
    N,
    K,
    stride_rm,
    HAS_BIAS: tl.constexpr,
    APPLY_GELU: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
    Stamps,
):
    """_linear_kernel for Hopper and datacenter Blackwell: one program per SM walks the output tiles (the same
    grouped order), and x, the weight and y move through tensor descriptors (the TMA unit copies whole tiles,
    filling zeros past the edges and clipping the store); the residual, read once, is loaded straight into
    registers (through shared memory it would take a third tile's worth of it). The loop over tiles and the loop
    over K are pipelined as one, so the next tile's first loads are in flight while this tile's epilogue runs."""
    stamps.begin(Stamps)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = XDesc.load([off_m, k * BLOCK_K])
            b = WDesc.load([off_n, k * BLOCK_K])
            acc = tl.dot(a, b.T, acc, input_precision=PRECISION)
        rows = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)
        cols = off_n + tl.arange(0, BLOCK_N)
        acc = bias_gelu_residual(acc, rows, cols, Bias, R, M, N, stride_rm, HAS_BIAS, APPLY_GELU, HAS_RESIDUAL)
        YDesc.store([off_m, off_n], acc.to(YDesc.dtype))
    stamps.end(Stamps)


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("M",))
def _linear_split_k_kernel(
    X,
    W,
    P,
    M,
    N,
    K,
    K_PER_SPLIT,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = tl.arange(0, BLOCK_M)  # all M <= BLOCK_M rows in one tile
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * K_PER_SPLIT
    k_hi = min(k_lo + K_PER_SPLIT, K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        ks = k + tl.arange(0, BLOCK_K)
        a = tl.load(
            X + rows[:, None] * stride_xm + ks[None, :] * stride_xk,
            mask=(rows < M)[:, None] & (ks < k_hi)[None, :],
            other=0.0,
        )
        b = tl.load(W + (cols % N)[None, :] * stride_wn + ks[:, None] * stride_wk, mask=(ks < k_hi)[:, None], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(P + split * M * N + rows[:, None] * N + cols[None, :], acc, mask=mask)
    stamps.end(Stamps)


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("M",))
def _split_k_reduce_kernel(
    P,
    Bias,
    R,
    Y,
    M,
    N,
    SPLIT_K,
    stride_rm,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    APPLY_GELU: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    rows = tl.arange(0, BLOCK_M)
    cols = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for split in range(0, SPLIT_K):
        acc += tl.load(P + split * M * N + rows[:, None] * N + cols[None, :], mask=mask, other=0.0)
    _epilogue_store(acc, rows, cols, Bias, R, Y, M, N, stride_rm, stride_ym, HAS_BIAS, APPLY_GELU, HAS_RESIDUAL)
    stamps.end(Stamps)


def default_config(
    rows: int, out_features: int, in_features: int, dtype: torch.dtype, device, residual: bool = False
) -> TileConfig:
    limits = device_limits(device)
    if limits.is_cpu:
        return tile_rule(rows, dtype, device)
    stages = pipeline_stages(device)
    if rows <= DECODE_ROWS:
        block_n, block_k = 64, 128
        # Enough programs to give every SM two weight slices to stream, but no split shorter than BLOCK_K.
        split_k = max(1, min(2 * limits.num_sms // cdiv(out_features, block_n), cdiv(in_features, block_k)))
        split_k = 1 << (split_k.bit_length() - 1)  # tiles are powers of two: round down
        return TileConfig(
            block_m=16, block_n=block_n, block_k=block_k, group_m=1, split_k=split_k, num_warps=4, num_stages=stages + 1
        )
    if persistent_form(rows, dtype, device):  # sm_90/sm_100, 16-bit, unless forced_form says otherwise
        # The fastest of 9 tile rules on an H200 (linear_sweep in experiments/README.md): 128x256 in
        # 8 warps, 3 stages, for c_fc + GELU at M = 1024-8192. With a residual that tile leaves room for only
        # 2 stages (the residual's layout change needs shared memory too), and 128x128 in 4 stages won.
        if residual:
            return TileConfig(block_m=128, block_n=128, block_k=64, group_m=8, split_k=1, num_warps=8, num_stages=4)
        return TileConfig(block_m=128, block_n=256, block_k=64, group_m=8, split_k=1, num_warps=8, num_stages=3)
    return tile_rule(rows, dtype, device)


def tile_rule(rows: int, dtype: torch.dtype, device) -> TileConfig:
    """The tile kernel's tiles, one split (the rule swiglu.py halves for its two weight tiles)."""
    if device_limits(device).is_cpu:
        # The interpreter runs a grid's programs one after another, and its cost is per program and per
        # operation, not per element: the widest column tiles, row tiles up to 128 (a prompt of up to 128 tokens
        # in one), one split, and the longest K step the shared memory allows (resolve_config shrinks block_k to
        # fit: 64 in fp32, 128 in fp16, at 128 x 256).
        block_m, group_m = max(16, min(128, next_pow2(rows))), 1 if rows <= DECODE_ROWS else 8
        return TileConfig(
            block_m=block_m, block_n=256, block_k=256, group_m=group_m, split_k=1, num_warps=4, num_stages=1
        )
    # 64x128 tiles in 4 warps: the fastest of 48 configs at M=1024, K=768, N=3072 on an H200
    # (benchmarks/RESULTS.md), ahead of 128x128 in 8 warps.
    block_k = 32 if dtype == torch.float32 else 64
    return TileConfig(
        block_m=64, block_n=128, block_k=block_k, group_m=8, split_k=1, num_warps=4, num_stages=pipeline_stages(device)
    )


_forced: bool | None = None  # see forced_form


@contextlib.contextmanager
def forced_form(persistent: bool | None):
    """Within this block prefill-shaped inputs take _linear_persistent_kernel wherever the layout allows, the
    interpreter included (persistent=True: tests), or never (False: sweeps that time the tile kernel); None
    is the default, where the GPU takes it (config.tma_matmul: sm_90 and sm_100) and the dtype is 16-bit.
    Either way, rows whose layout TMA cannot describe fall back to the tile kernel."""
    global _forced
    before, _forced = _forced, persistent
    try:
        yield
    finally:
        _forced = before


_taken: list[str] | None = None  # see forms_taken


@contextlib.contextmanager
def forms_taken():
    """Within this block each call of linear appends the form it launched to the list yielded: "persistent"
    (TMA, one program per SM), "tile" or "split-k" (decode-shaped rows)."""
    global _taken
    before, _taken = _taken, []
    try:
        yield _taken
    finally:
        _taken = before


def persistent_form(rows: int, dtype: torch.dtype, device) -> bool:
    if rows <= DECODE_ROWS:
        return False
    if _forced is not None:
        return _forced
    return dtype in (torch.float16, torch.bfloat16) and tma_matmul(device_limits(device).capability)


def _describable(*tensors) -> bool:
    """Whether TMA can copy tiles of these 2-D tensors: rows contiguous, base and row stride 16-byte aligned."""
    return all(
        t.stride(1) == 1 and t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0 for t in tensors
    )


def shared_memory(cfg: TileConfig, itemsize: int, device, persistent: bool = False, residual: bool = False) -> int:
    """Bytes of shared memory the matmul needs: one x tile and one weight tile per pipeline buffer
    (exact on Hopper; Ampere keeps one buffer fewer), and on sm_100 the MMA's barriers (config.mma_barrier_bytes).
    The persistent form adds the output tile that the TMA store copies from, the bias row and the pipeline's
    barriers, and with a residual a tile-sized scratch for changing the accumulator's layout to the residual's
    (at most: Triton 3.9 uses half)."""
    tiles = buffered_stages(cfg.num_stages, device) * (cfg.block_m + cfg.block_n) * cfg.block_k * itemsize
    tiles += mma_barrier_bytes(device)
    if not persistent:
        return tiles
    out = cfg.block_m * cfg.block_n * itemsize
    return tiles + out * (2 if residual else 1) + cfg.block_n * 4 + 256


@functools.lru_cache(maxsize=1024)  # called on every launch: resolve each shape once
def resolve_config(config, rows, out_features, in_features, dtype, device, persistent=False, residual=False):
    user = as_config("linear", config)
    check_fields("linear", user)
    itemsize = torch.empty((), dtype=dtype).element_size()
    cfg = user.merged(default_config(rows, out_features, in_features, dtype, device, residual))
    if user.split_k is None and user.block_m not in (None, 16):
        cfg = replace(cfg, split_k=1)  # a row tile of the user's own: the one-split path (split-K needs block_m 16)
    need = lambda c: shared_memory(c, itemsize, device, persistent, residual)
    cfg = fit_defaults("linear", cfg, user, need, device)
    if cfg.split_k > 1 and rows > DECODE_ROWS:
        raise ValueError(
            f"linear: split_k={cfg.split_k} is only for decode-shaped inputs of at most {DECODE_ROWS} rows, got {rows}"
        )
    if cfg.split_k > 1 and cfg.block_m != 16:
        raise ValueError(
            f"linear: the split-K path keeps all rows in one tile, so block_m must be 16 (got {cfg.block_m})"
        )
    what = f"{cfg.num_stages} stages of a {cfg.block_m}x{cfg.block_k} and a {cfg.block_k}x{cfg.block_n} tile"
    if persistent:
        what += f", the {cfg.block_m}x{cfg.block_n} output tile" + (" and the residual's" if residual else "")
    check_shared_memory("linear", cfg, need(cfg), device, what)
    return cfg


def check_args(name: str, x, weight, bias, activation, residual) -> tuple[int, int, tuple]:
    """The checks every linear launcher makes (this one and fused_linear's), messages named after `name`;
    returns (in_features, out_features, the output's shape)."""
    check_dtype(name, x)
    if activation not in (None, "gelu"):
        raise ValueError(f"{name}: activation={activation!r} is not supported (allowed: None, 'gelu')")
    in_features = x.shape[-1]
    if weight.dim() != 2 or weight.shape[1] != in_features:
        raise ValueError(f"{name}: weight must be (out, {in_features}), got {tuple(weight.shape)}")
    out_features = weight.shape[0]
    if bias is not None and bias.shape != (out_features,):
        raise ValueError(f"{name}: bias must be ({out_features},), got {tuple(bias.shape)}")
    out_shape = (*x.shape[:-1], out_features)
    if residual is not None and tuple(residual.shape) != out_shape:
        raise ValueError(f"{name}: residual must have shape {out_shape}, got {tuple(residual.shape)}")
    return in_features, out_features, out_shape


def linear(x, weight, bias=None, *, activation=None, residual=None, config=None):
    """act(x @ weight.T + bias) + residual for x (..., in) and weight (out, in)."""
    in_features, out_features, out_shape = check_args("linear", x, weight, bias, activation, residual)
    flat = x.dim() == 2  # the common case keeps its tensors: a view costs the host more than the check
    x2 = x if flat else x.reshape(-1, in_features)
    rows = x2.shape[0]
    if config == "autotune":
        config = tuned_config(x, weight, bias, activation=activation, residual=residual)
    device = x.device  # once: each read builds a torch.device, which costs the host more than a check
    persistent = persistent_form(rows, x.dtype, device)
    cfg = resolve_config(config, rows, out_features, in_features, x.dtype, device, persistent, residual is not None)
    y = new_output(x, (rows, out_features))
    if rows == 0:
        return y if flat else y.view(out_shape)
    r2 = residual.reshape(rows, out_features).contiguous() if residual is not None else y
    b = bias if bias is not None else weight  # placeholder pointer, unused when HAS_BIAS is False
    flags = dict(HAS_BIAS=bias is not None, APPLY_GELU=activation == "gelu", HAS_RESIDUAL=residual is not None)
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    sx, sw = x2.stride(), weight.stride()  # y is contiguous: its rows are out_features apart
    # r2 is contiguous: the residual, or y
    form = "persistent" if persistent and _describable(x2, weight, y) else "tile" if cfg.split_k == 1 else "split-k"
    if _taken is not None:
        _taken.append(form)
    with explain_resources("linear", cfg):
        if form == "persistent":
            _launch_persistent(x2, weight, b, r2, y, cfg, flags, precision)
        elif form == "tile":
            grid = (cdiv(rows, cfg.block_m) * cdiv(out_features, cfg.block_n),)
            launch.fast(_linear_kernel)[grid](
                x2,
                weight,
                b,
                r2,
                y,
                rows,
                out_features,
                in_features,
                sx[0],
                sx[1],
                sw[0],
                sw[1],
                r2.stride(0),
                out_features,
                **flags,
                PRECISION=precision,
                BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k,
                GROUP_M=cfg.group_m,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
        else:
            k_per_split = cdiv(cdiv(in_features, cfg.split_k), cfg.block_k) * cfg.block_k
            splits = cdiv(in_features, k_per_split)
            partial = new_output(x, (splits, rows, out_features), torch.float32)
            launch.fast(_linear_split_k_kernel)[(cdiv(out_features, cfg.block_n), splits)](
                x2,
                weight,
                partial,
                rows,
                out_features,
                in_features,
                k_per_split,
                sx[0],
                sx[1],
                sw[0],
                sw[1],
                PRECISION=precision,
                BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
            launch.fast(_split_k_reduce_kernel)[(cdiv(out_features, 128),)](
                partial,
                b,
                r2,
                y,
                rows,
                out_features,
                splits,
                r2.stride(0),
                out_features,
                **flags,
                BLOCK_M=cfg.block_m,
                BLOCK_N=128,
                num_warps=4,
            )
    return y if flat else y.view(out_shape)


def _launch_persistent(x2, weight, b, r2, y, cfg, flags, precision):
    from triton.tools.tensor_descriptor import TensorDescriptor

    (rows, in_features), out_features = x2.shape, weight.shape[0]
    tiles = cdiv(rows, cfg.block_m) * cdiv(out_features, cfg.block_n)
    # One program per SM, fewer where there are fewer tiles; the walk's stride is the SM count either way (with
    # fewer tiles than SMs each program takes just its own tile), so the compiled kernel does not depend on rows.
    sms = device_limits(x2.device).num_sms
    programs = min(tiles, sms)
    xd = TensorDescriptor.from_tensor(x2, [cfg.block_m, cfg.block_k])
    wd = TensorDescriptor.from_tensor(weight, [cfg.block_n, cfg.block_k])
    yd = TensorDescriptor.from_tensor(y, [cfg.block_m, cfg.block_n])
    # Bound as the other kernels are (kernels.launch keys a descriptor by its dtype and block): through the
    # JITFunction each launch cost the host about 58 µs more, which an eager 16-bit step with the cache off pays
    # on most of its launches.
    launch.fast(_linear_persistent_kernel)[(programs,)](
        xd,
        wd,
        yd,
        b,
        r2,
        rows,
        out_features,
        in_features,
        r2.stride(0),
        **flags,
        PRECISION=precision,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        PROGRAMS=sms,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def tuned_config(x, weight, bias=None, *, activation=None, residual=None):
    """The fastest candidate tiles for inputs like these (timed once per shape on a GPU, over random copies
    rotated past L2; defaults on CPU)."""
    rows = x.numel() // x.shape[-1]
    key = (rows, *weight.shape, x.dtype, bias is not None, activation, residual is not None)
    run = lambda c, x, w, b, r: linear(x, w, b, activation=activation, residual=r, config=c)
    kind = "linear_decode" if rows <= DECODE_ROWS else "linear"
    return autotune.pick(kind, key, run, x.device, inputs=(x, weight, bias, residual))


def traffic(
    rows,
    out_features,
    in_features,
    itemsize,
    *,
    bias=True,
    activation=None,
    residual=False,
    config=None,
    dtype=torch.float16,
    device="cpu",
) -> Traffic:
    """Modeled traffic of the fused launch(es) at these tiles.

    SM requests: every program loads its rows of x and its columns of the weight over the whole reduction
    (rows past the edge wrap onto rows the same program already covers), so each column tile re-reads
    x and each row tile re-reads the weight: larger tiles mean fewer re-reads. (The H200's 72.3 MB at
    M=1024 768->3072 matches the 128x128 tiles that were the default before 64x128, 75.5 MB here, not
    today's 113.3: re-measure with kernels.ncu_check, which prints the tiles each row ran with.)
    HBM: x and the weight come from HBM once. Within a group of GROUP_M row tiles, the programs that
    share a weight column tile run side by side and stream it at the same time: L2 hits. The row band
    of x that a group shares is re-read by every column tile, and the whole weight by every later
    group: those re-reads are L2 hits while the band (and the weight with it) fit the usable L2
    (config.l2_miss). The split-K partials are written (reaching HBM eventually) and read back by the
    reduce kernel from L2 while they fit. The persistent form (Hopper) loads the same tiles in the same
    grouped order, from one program per SM instead of one per tile."""
    cfg = resolve_config(
        config, rows, out_features, in_features, dtype, device, persistent_form(rows, dtype, device), residual
    )
    x_bytes, w_bytes, y_bytes, b_bytes, r_bytes = operand_bytes(
        rows, out_features, in_features, itemsize, bias, residual
    )
    flops = 2 * rows * out_features * in_features + rows * out_features * (
        (1 if bias else 0) + (1 if residual else 0) + (10 if activation else 0)
    )
    floor = x_bytes + w_bytes + b_bytes + r_bytes + y_bytes
    tiles_n = cdiv(out_features, cfg.block_n)
    w_loaded = tiles_n * min(cfg.block_n, out_features) * in_features * itemsize  # columns wrap, never masked
    if cfg.split_k == 1:
        tiles_m = cdiv(rows, cfg.block_m)
        tile_rows = min(cfg.block_m, rows)
        x_loaded = tiles_m * tiles_n * tile_rows * in_features * itemsize
        reads = x_loaded + w_loaded * tiles_m + b_bytes * tiles_m + r_bytes
        band = min(cfg.group_m, tiles_m) * tile_rows * in_features * itemsize
        groups = cdiv(tiles_m, cfg.group_m)
        w_hbm = hbm_reads(w_bytes, w_loaded * groups, w_bytes + band, device)  # one pass per group
        hbm = hbm_reads(x_bytes, x_loaded, band, device) + w_hbm
        return Traffic(reads, y_bytes, flops, floor, hbm + b_bytes + r_bytes, y_bytes)
    splits = cdiv(in_features, cdiv(cdiv(in_features, cfg.split_k), cfg.block_k) * cfg.block_k)
    partial = splits * rows * out_features * 4
    reads = x_bytes * tiles_n + w_loaded + partial + b_bytes + r_bytes  # x: its rows only (masked, no wrap)
    hbm = x_bytes + w_bytes + round(partial * l2_miss(partial, device)) + b_bytes + r_bytes
    return Traffic(reads, partial + y_bytes, flops, floor, hbm, partial + y_bytes)


def operand_bytes(rows, out_features, in_features, itemsize, bias, residual) -> tuple[int, int, int, int, int]:
    """Bytes of a linear's operands, each counted once: x, the weight, y, the bias (0 without) and the residual
    (0 without): the traffic models' floors start from these."""
    y_bytes = rows * out_features * itemsize
    return (
        rows * in_features * itemsize,
        out_features * in_features * itemsize,
        y_bytes,
        out_features * itemsize if bias else 0,
        y_bytes if residual else 0,
    )


def traffic_unfused(
    rows, out_features, in_features, itemsize, *, bias=True, activation=None, residual=False, device="cpu"
) -> Traffic:
    """F.linear (at its floor: inputs read once, output written once), then F.gelu and the residual
    add as separate launches, each reading and writing the whole activation. At the HBM level each
    launch reads the activation the previous one wrote from L2 when it fits there."""
    x_bytes, w_bytes, y_bytes, b_bytes, _ = operand_bytes(rows, out_features, in_features, itemsize, bias, False)
    mm = 2 * rows * out_features * in_features + (rows * out_features if bias else 0)
    total = Traffic(x_bytes + w_bytes + b_bytes, y_bytes, mm, x_bytes + w_bytes + b_bytes + y_bytes)
    reread = round(y_bytes * l2_miss(y_bytes, device))  # the activation, as the next launch reads it
    if activation:
        total = total + Traffic(y_bytes, y_bytes, 10 * rows * out_features, 2 * y_bytes, reread, y_bytes)
    if residual:
        total = total + Traffic(2 * y_bytes, y_bytes, rows * out_features, 3 * y_bytes, reread + y_bytes, y_bytes)
    return total
