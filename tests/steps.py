"""Steps built by hand for the measurement tests: real Op records, so traffic comes from the models."""

import pandas as pd
import torch

from explorer.measure.clock import TimedStep
from explorer.model.ops import Op
from kernels import TileConfig
from kernels.sizes import AttentionSizes, DecodeAttentionSizes, LinearSizes

CPU = torch.device("cpu")
# An FFN input projection of 4 rows, 16 -> 32, bias and GELU, in fp16, with one 16x32 tile.
FFN = Op(
    "mlp.c_fc",
    "linear",
    "triton",
    LinearSizes(4, 32, 16, bias=True, gelu=True, residual=False),
    torch.float16,
    CPU,
    TileConfig(block_m=16, block_n=32, block_k=16, split_k=1),
)
# Decode attention over a cache of 64 positions, 2 heads of 16, in 16-key splits.
DECODE = Op(
    "attn",
    "decode_attention",
    "triton",
    DecodeAttentionSizes(1, 2, 64, 16, one_launch=False),
    torch.float16,
    CPU,
    TileConfig(block_n=16, split_k=4),
)
PREFILL = Op(
    "attn",
    "attention",
    "triton",
    AttentionSizes(1, 2, 4, 4, 16),
    torch.float16,
    CPU,
    TileConfig(block_m=16, block_n=16),
)


def step(i, ms, *, batch=1, kv=0, ops=None, wall_s=None, peak=None, graph=False, warmup_ms=None) -> TimedStep:
    return TimedStep(
        index=i,
        phase="prefill" if i == 0 else "decode",
        token_ids=[1] * batch,
        texts=[""] * batch,
        positions=[5 + i] * batch,
        context_tokens=batch,
        latency_ms=ms,
        timer="test",
        kv_used_bytes=kv,
        kv_allocated_bytes=100,
        ops=tuple(ops if ops is not None else (FFN, DECODE if i else PREFILL)),
        graph=graph,
        wall_s=wall_s if wall_s is not None else float(i),
        peak_memory_bytes=peak,
        warmup_ms=warmup_ms if warmup_ms is not None else (50.0 if i == 0 else 0.0),
    )


def profile(rows) -> pd.DataFrame:
    """profile_run's rows: (step, phase, position, op, kind, kernel_ms, launch_ms)."""
    cols = ["step", "phase", "position", "op", "kind", "kernel_ms", "launch_ms"]
    return pd.DataFrame([dict(zip(cols, r, strict=True)) for r in rows], columns=cols)
