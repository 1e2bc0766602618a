"""Sweeps over tiles, sequence lengths, cache on/off and backends (explorer.cli prints them).

Every sweep returns a tidy DataFrame (one row per observation) and reports progress while it runs.
Tile sweeps keep every config, the impossible ones with the reason, not only the winner.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import fields

import pandas as pd
import torch

import kernels
from kernels import timing
from kernels.attn.decode import decode_traffic
from kernels.attn.grouped import traffic as grouped_traffic
from kernels.attn.kernel import traffic as attention_traffic
from kernels.config import TileConfig
from kernels.matmul.kernel import traffic as linear_traffic
from kernels.matmul.swiglu import traffic as swiglu_traffic
from kernels.norm.kernel import traffic as layer_norm_traffic
from kernels.norm.rms import traffic as rms_norm_traffic

from ..model.ops import Tiles
from . import metrics
from .clock import timed

Progress = Callable[[int, int, str], None]

# Grids the tile sweep walks by default (the UI and CLI can pass their own).
GRIDS = {
    "attention": dict(block_m=[16, 32, 64, 128], block_n=[16, 32, 64, 128], num_warps=[4, 8], num_stages=[1, 2, 3]),
    "decode_attention": dict(block_n=[16, 32, 64, 128, 256], split_k=[1, 4, 16, 64], num_warps=[2, 4]),
    "linear": dict(block_m=[16, 32, 64, 128], block_n=[32, 64, 128, 256], block_k=[32, 64], num_stages=[2, 3, 4]),
    "layer_norm": dict(block_m=[1, 2, 4, 8, 16], num_warps=[1, 2, 4, 8]),
    # the Llama family's: RMSNorm holds rows as LayerNorm does; SwiGLU's tiles hold two weight tiles (gate and up)
    "rms_norm": dict(block_m=[1, 2, 4, 8, 16], num_warps=[1, 2, 4, 8]),
    "swiglu": dict(block_m=[16, 32, 64, 128], block_n=[32, 64, 128], block_k=[32, 64], num_stages=[2, 3, 4]),
    "grouped_decode_attention": dict(block_n=[32, 64, 128], split_k=[1, 4, 16, 64]),
}
DEFAULT_SHAPES = {
    "attention": dict(B=1, H=12, T=1024, D=64),
    "decode_attention": dict(B=1, H=12, T=8192, D=64),
    "linear": dict(M=1024, K=768, N=3072),
    "layer_norm": dict(M=4096, C=768),
    "rms_norm": dict(M=4096, C=576),  # SmolLM2-135M's width
    "swiglu": dict(M=1024, K=576, F=1536),
    "grouped_decode_attention": dict(B=1, H=9, KV=3, T=8192, D=64),
}


def grid_configs(kernel: str, grid: dict | None = None) -> list[TileConfig]:
    grid = grid or GRIDS[kernel]
    names = list(grid)
    return [TileConfig(**dict(zip(names, values, strict=True))) for values in itertools.product(*grid.values())]


def _inputs(kernel: str, shape: dict, dtype, device):
    """For one kernel at one shape: make() -> a fresh set of random inputs, call(config, *inputs), and
    its traffic model per config."""
    r = lambda *s: torch.randn(*s, device=device, dtype=dtype)
    item = torch.empty((), dtype=dtype).element_size()
    if kernel == "attention":
        B, H, T, D = (shape[k] for k in "BHTD")
        make = lambda: (r(B, H, T, D), r(B, H, T, D), r(B, H, T, D))
        call = lambda c, q, k, v: kernels.attention(q, k, v, config=c)
        model = lambda c: attention_traffic(B, H, T, T, D, item, config=c, dtype=dtype, device=device)
    elif kernel == "decode_attention":
        B, H, T, D = (shape[k] for k in "BHTD")
        make = lambda: (
            r(B, H, 1, D),
            r(B, H, T, D),
            r(B, H, T, D),
            torch.full((B,), T, device=device, dtype=torch.int32),
        )
        call = lambda c, q, kc, vc, n: kernels.decode_attention(q, kc, vc, n, config=c)
        model = lambda c: decode_traffic([T] * B, H, T, D, item, config=c, dtype=dtype, device=device)
    elif kernel == "linear":
        M, K, N = (shape[k] for k in "MKN")
        make = lambda: (r(M, K), r(N, K) / K**0.5, r(N))
        call = lambda c, x, w, b: kernels.linear(x, w, b, activation="gelu", config=c)
        model = lambda c: linear_traffic(M, N, K, item, activation="gelu", config=c, dtype=dtype, device=device)
    elif kernel == "layer_norm":
        M, C = shape["M"], shape["C"]
        make = lambda: (r(M, C), r(M, C), r(C), r(C))
        call = lambda c, x, res, w, b: kernels.layer_norm(x, w, b, residual=res, config=c)
        model = lambda c: layer_norm_traffic(M, C, item, residual=True, config=c)
    elif kernel == "rms_norm":
        M, C = shape["M"], shape["C"]
        make = lambda: (r(M, C), r(M, C), r(C))
        call = lambda c, x, res, w: kernels.rms_norm(x, w, residual=res, config=c)
        model = lambda c: rms_norm_traffic(M, C, item, residual=True, config=c)
    elif kernel == "swiglu":
        M, K, F = (shape[k] for k in "MKF")
        make = lambda: (r(M, K), r(2 * F, K) / K**0.5)
        call = lambda c, x, w: kernels.swiglu(x, w, config=c)
        model = lambda c: swiglu_traffic(M, F, K, item, config=c, dtype=dtype, device=device)
    elif kernel == "grouped_decode_attention":
        B, H, KV, T, D = (shape[k] for k in ("B", "H", "KV", "T", "D"))
        if KV < 1 or H % KV:
            raise ValueError(f"grouped_decode_attention: H={H} must be a multiple of KV={KV} (query heads per group)")
        make = lambda: (
            r(B, H, 1, D),
            r(B, KV, T, D),
            r(B, KV, T, D),
            torch.full((B,), T, device=device, dtype=torch.int32),
        )
        call = lambda c, q, kc, vc, n: kernels.grouped_decode_attention(
            q, kc, vc, n, block_n=c.block_n, split_k=c.split_k
        )
        model = lambda c: grouped_traffic([T] * B, H, KV, D, item, device=device, block_n=c.block_n, split_k=c.split_k)
    else:
        raise ValueError(f"kernel {kernel!r} is not known (allowed: {', '.join(GRIDS)})")
    return make, call, model


def tile_sweep(
    kernel: str,
    shape: dict | None = None,
    *,
    dtype=torch.float16,
    device="cpu",
    grid=None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Time every config of the grid for one kernel and shape (see tile_sweep_rows) into one frame."""
    shape = {**DEFAULT_SHAPES[kernel], **(shape or {})}
    rows = []
    for i, n, row in tile_sweep_rows(kernel, shape, dtype=dtype, device=device, grid=grid):
        if progress:
            progress(i, n, f"{kernel} {row}")
        rows.append(row)
    if progress:
        progress(len(rows), len(rows), "done")
    return sweep_frame(kernel, shape, rows)


def tile_sweep_rows(kernel: str, shape: dict, *, dtype=torch.float16, device="cpu", grid=None):
    """Yield (index, count, row) for each config of the grid, as it is timed, by the one method of
    kernels.timing: on a GPU, CUDA-graph replays over random inputs rotated past L2 (made once, shared
    by every config); on CPU, one interpreter call. An impossible config's row has valid=False and the
    reason. Closing the generator stops the sweep after the config being timed."""
    device = torch.device(device)
    make, call, model = _inputs(kernel, shape, dtype, device)
    sets = timing.rotated_inputs(make) if device.type == "cuda" else [make()]
    configs = grid_configs(kernel, grid)
    for i, cfg in enumerate(configs):
        row = {f.name: getattr(cfg, f.name) for f in fields(cfg) if getattr(cfg, f.name) is not None}
        try:
            traffic = model(cfg)
            timed = timing.measure(lambda *a, c=cfg: call(c, *a), sets, device)
        except Exception as e:  # refused by validation or by the compiler: recorded, and the sweep goes on
            yield i, len(configs), dict(row, valid=False, reason=_reason(e), ms=math.nan)
            continue
        ms = timed.ms
        yield (
            i,
            len(configs),
            dict(
                row,
                valid=True,
                reason="",
                ms=ms,
                modeled_mb=traffic.bytes / metrics.MB,
                gbs=traffic.bytes / ms / 1e6,
                tflops=traffic.flops / ms / 1e9,
                timer=timed.regime,
            ),
        )


def sweep_frame(kernel: str, shape: dict, rows: list[dict]) -> pd.DataFrame:
    """The rows of a tile sweep (all of them, or those timed so far) as one tidy frame."""
    out = pd.DataFrame(rows)
    out.insert(0, "kernel", kernel)
    out["shape"] = ",".join(f"{k}={v}" for k, v in shape.items())
    out["timer"] = out["timer"].fillna("") if "timer" in out else ""  # rows that could not run were not timed
    return out


def _reason(e: Exception) -> str:
    """The message validation or the compiler gave; a CaptureError says what failed inside the capture."""
    if isinstance(e, ValueError):
        return str(e)
    cause = e.__cause__ if isinstance(e, timing.CaptureError) and e.__cause__ else e
    if isinstance(cause, ValueError):
        return str(cause)
    return f"{type(cause).__name__}: {str(cause).splitlines()[0][:200]}"


def best_config(sweep: pd.DataFrame) -> TileConfig:
    """The fastest valid row of a tile sweep, as a TileConfig."""
    valid = sweep[sweep.valid]
    if valid.empty:
        raise ValueError("no valid config in this sweep")
    row = valid.loc[valid.ms.idxmin()]
    names = {f.name for f in fields(TileConfig)}
    return TileConfig(**{k: int(v) for k, v in row.items() if k in names and not pd.isna(v)})


def run_frame(steps, **labels) -> pd.DataFrame:
    """Steps of one generation as rows, with the run's settings as columns."""
    frame = metrics.step_frame(steps)
    for key, value in labels.items():
        frame.insert(0, key, value)
    return frame


def sequence_sweep(model, prompt_lengths, new_tokens: int, *, progress: Progress | None = None, **options):
    """Per-step latency and modeled bytes for every (backend, cache, prompt length), in one frame;
    `options` are sequence_runs' (caches, backends, tiles, seed, graphs)."""
    frames = []
    for i, n, frame in sequence_runs(model, prompt_lengths, new_tokens, **options):
        if progress:
            progress(
                i, n, f"{frame.backend.iloc[0]}, cache {frame.cache.iloc[0]}, prompt {frame.prompt_tokens.iloc[0]}"
            )
        frames.append(frame)
    if progress:
        progress(len(frames), len(frames), "done")
    return pd.concat(frames, ignore_index=True)


def sequence_runs(
    model,
    prompt_lengths,
    new_tokens: int,
    *,
    caches=(True, False),
    backends=("triton", "torch"),
    tiles: Tiles | None = None,
    seed: int = 0,
    graphs=(None,),
):
    """Yield (index, count, frame) per (backend, cache, graph, prompt length) run, as it finishes: cache
    on grows O(n) per token in bytes read, cache off O(n^2) in recomputation. `graphs` holds generate's
    graph choices (None: CUDA graphs wherever they apply); a graph with the cache off is skipped.
    Closing the generator stops the sweep after the run in progress."""
    runs = [
        (backend, cache, graph, length)
        for backend, cache, graph, length in itertools.product(backends, caches, graphs, prompt_lengths)
        if cache or not graph
    ]
    gen = torch.Generator().manual_seed(seed)
    for i, (backend, cache, graph, length) in enumerate(runs):
        prompt = torch.randint(0, model.config.vocab_size, (length,), generator=gen).tolist()
        steps = list(
            timed(
                model,
                prompt,
                max_new_tokens=new_tokens,
                cache=cache,
                backend=backend,
                tiles=tiles,
                eos_token_id=-1,
                graph=graph,
            )
        )
        mode = "CUDA graph" if any(s.graph for s in steps) else "eager"
        labels = dict(backend=backend, cache="on" if cache else "off", launch_mode=mode, prompt_tokens=length)
        yield i, len(runs), run_frame(steps, **labels)
