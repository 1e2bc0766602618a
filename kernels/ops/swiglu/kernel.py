"""The gated feed-forward's first half (SwiGLU, the Llama family's): the gate and up projections as one
matmul, SiLU(gate) * up in its epilogue.

    y = silu(x @ W_gate.T) * (x @ W_up.T)        gate_up = [W_gate; W_up]: one (2F, K) weight

Each program holds two accumulators for the same BLOCK_N features, one over the gate's rows of the weight
and one over the up projection's, and feeds both from the same x tile: x is read once for the two
projections, and the (M, 2F) pair of activations a separate gate and up would write and read back never
leaves the registers. The tiles follow the tile kernel's (kernel.py) with half its columns, since a program
loads two weight tiles of BLOCK_N.
"""

from dataclasses import replace

import torch
import triton
import triton.language as tl

from ... import launch, stamps
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
    mma_barrier_bytes,
    new_output,
)
from ..linear.kernel import DECODE_ROWS, tile_coords, tile_rule


# Not specialised on its lengths (rows, tokens): a new prompt length reuses the kernel compiled for another.
@triton.jit(do_not_specialize=("M",))
def _swiglu_kernel(
    X,
    W,
    Y,
    M,
    F,
    K,
    x_strides,  # (row, k)
    w_strides,  # (row, k) of gate_up; the up projection's rows start F rows down
    stride_ym,
    PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    Stamps,
):
    stamps.begin(Stamps)
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(F, BLOCK_N), GROUP_M)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    stride_xm, stride_xk = x_strides
    stride_wn, stride_wk = w_strides
    # As in the tile kernel, rows and columns past the edge wrap onto valid memory; the store drops them.
    x_ptrs = X + (rows % M)[:, None] * stride_xm + ks[None, :] * stride_xk
    g_ptrs = W + (cols % F)[None, :] * stride_wn + ks[:, None] * stride_wk  # (BLOCK_K, BLOCK_N) of W_gate.T
    u_ptrs = g_ptrs + F * stride_wn  # the same features' rows of W_up

    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=ks[None, :] < k_left, other=0.0)
        gate = tl.dot(a, tl.load(g_ptrs, mask=ks[:, None] < k_left, other=0.0), gate, input_precision=PRECISION)
        up = tl.dot(a, tl.load(u_ptrs, mask=ks[:, None] < k_left, other=0.0), up, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        g_ptrs += BLOCK_K * stride_wk
        u_ptrs += BLOCK_K * stride_wk
    y = gate * tl.sigmoid(gate) * up
    mask = (rows < M)[:, None] & (cols < F)[None, :]
    tl.store(Y + rows[:, None] * stride_ym + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    stamps.end(Stamps)


def default_config(rows: int, features: int, dtype: torch.dtype, device) -> TileConfig:
    """The tile kernel's rule (kernel.tile_rule) with half its columns, since a program loads two weight tiles;
    on a GPU, decode-shaped rows in one 16-row tile."""
    rule = tile_rule(rows, dtype, device)
    small = rows <= DECODE_ROWS and not device_limits(device).is_cpu
    return replace(rule, block_m=16 if small else rule.block_m, block_n=rule.block_n // 2)


def shared_memory(cfg: TileConfig, itemsize: int, device) -> int:
    """One x tile and two weight tiles per pipeline buffer, and on sm_100 the barriers of its two MMAs."""
    tiles = buffered_stages(cfg.num_stages, device) * (cfg.block_m + 2 * cfg.block_n) * cfg.block_k * itemsize
    return tiles + mma_barrier_bytes(device, dots=2)


def resolve_config(config, rows: int, features: int, in_features: int, dtype: torch.dtype, device) -> TileConfig:
    user = as_config("linear", config)
    check_fields("linear", user)
    itemsize = torch.empty((), dtype=dtype).element_size()
    need = lambda c: shared_memory(c, itemsize, device)
    cfg = fit_defaults("linear", user.merged(default_config(rows, features, dtype, device)), user, need, device)
    if cfg.split_k != 1:
        raise ValueError(f"swiglu: split_k={cfg.split_k} is not supported (one split: the epilogue needs whole sums)")
    what = f"{cfg.num_stages} stages of a {cfg.block_m}x{cfg.block_k} and two {cfg.block_k}x{cfg.block_n} tiles"
    check_shared_memory("swiglu", cfg, need(cfg), device, what)
    return cfg


def swiglu(x, gate_up, *, config=None):
    """silu(x @ W_gate.T) * (x @ W_up.T) for x (..., K) and gate_up = [W_gate; W_up] (2F, K): (..., F)."""
    check_dtype("swiglu", x)
    in_features = x.shape[-1]
    if gate_up.dim() != 2 or gate_up.shape[0] % 2 or gate_up.shape[1] != in_features:
        raise ValueError(
            f"swiglu: gate_up must be (2F, {in_features}), the gate's F rows over the up projection's, "
            f"got {tuple(gate_up.shape)}"
        )
    if gate_up.dtype != x.dtype:
        raise ValueError(f"swiglu: gate_up is {gate_up.dtype} but x is {x.dtype}")
    features = gate_up.shape[0] // 2
    x2 = x.reshape(-1, in_features)
    rows = x2.shape[0]
    cfg = resolve_config(config, rows, features, in_features, x.dtype, x.device)
    y = new_output(x2, (rows, features))
    if rows > 0:
        grid = (cdiv(rows, cfg.block_m) * cdiv(features, cfg.block_n),)
        with explain_resources("swiglu", cfg):
            launch.fast(_swiglu_kernel)[grid](
                x2,
                gate_up,
                y,
                rows,
                features,
                in_features,
                x2.stride(),
                gate_up.stride(),
                features,
                PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k,
                GROUP_M=cfg.group_m,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
    return y.view(*x.shape[:-1], features)


def traffic(
    rows: int, features: int, in_features: int, itemsize: int, *, config=None, dtype=torch.float16, device="cpu"
):
    """Modeled traffic of one launch. SM requests: every program loads its rows of x and its columns of both
    weight halves over the whole reduction, so each column tile re-reads x and each row tile re-reads the
    weight (rows and columns past the edge wrap, never masked). HBM: x, the weight and y once (their re-reads
    are L2 hits while a group's band and the weight fit, as the tile kernel's model says)."""
    cfg = resolve_config(config, rows, features, in_features, dtype, device)
    tiles_m, tiles_n = cdiv(rows, cfg.block_m), cdiv(features, cfg.block_n)
    x_loaded = tiles_m * tiles_n * min(cfg.block_m, rows) * in_features * itemsize
    w_loaded = tiles_m * 2 * tiles_n * min(cfg.block_n, features) * in_features * itemsize
    y_bytes = rows * features * itemsize
    floor = (rows * in_features + 2 * features * in_features) * itemsize + y_bytes
    flops = 4 * rows * features * in_features + 5 * rows * features
    return Traffic(x_loaded + w_loaded, y_bytes, flops, floor, floor - y_bytes, y_bytes)
