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

from kernels import ahead, timing
from kernels.config import TileConfig
from kernels.operations import SWEEPS, sweep

from ..model.ops import Tiles
from . import metrics
from .clock import timed

Progress = Callable[[int, int, str], None]

# Grids the tile sweep walks by default (the UI and CLI can pass their own), and its default shapes (a GPU's):
# each sweepable kernel's own (kernels.operations).
GRIDS = {kernel: sw.grid for kernel, sw in SWEEPS.items()}
DEFAULT_SHAPES = {kernel: sw.shape for kernel, sw in SWEEPS.items()}


def grid_configs(kernel: str, grid: dict | None = None) -> list[TileConfig]:
    grid = grid or GRIDS[kernel]
    names = list(grid)
    return [TileConfig(**dict(zip(names, values, strict=True))) for values in itertools.product(*grid.values())]


def _inputs(kernel: str, shape: dict, dtype, device):
    """For one kernel at one shape: make() -> a fresh set of random inputs, call(config, *inputs), and
    its traffic model per config."""
    sw = sweep(kernel)
    sw.check(shape)
    item = torch.empty((), dtype=dtype).element_size()
    make = lambda: sw.inputs(shape, dtype, device)
    model = lambda c: sw.traffic(shape, item, c, dtype, device)
    return make, sw.run, model


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


def placed(run, arch: int) -> dict:
    """The first kernel `run()` launches (recorded, not run), compiled for `arch` and placed on its SMs
    (kernels.occupancy): its registers, programs per SM and what limits them, and its waves. Needs Triton's
    compiler, not its interpreter."""
    from kernels import launch
    from kernels.occupancy import place

    with launch.recording() as got:
        run()
    res, occ = place(*got[0], arch)
    return dict(registers=res.registers, per_sm=occ.resident, limiter=occ.limiter, waves=round(occ.waves, 3))


def sweep_launches(kernel: str, shape: dict, *, dtype=torch.float16, device="cpu", grid=None) -> list[tuple]:
    """Every config's launches at one shape, recorded on one set of inputs, none run (kernels.ahead.recorded):
    what a GPU compiles for the sweep, to compile ahead of timing it. Configs refused before launch add none."""
    make, call, _ = _inputs(kernel, shape, dtype, torch.device(device))
    inputs = make()
    return ahead.recorded([lambda c=c: call(c, *inputs) for c in grid_configs(kernel, grid)])


def tile_sweep_rows(kernel: str, shape: dict, *, dtype=torch.float16, device="cpu", grid=None, arch=None):
    """Yield (index, count, row) for each config of the grid, as it is timed, by the one method of
    kernels.timing: on a GPU, CUDA-graph replays over random inputs rotated past L2 (made once, shared
    by every config); on CPU, one interpreter call. An impossible config's row has valid=False and the
    reason. With `arch` (a GPU's, compiled for by Triton, not run in its interpreter), each timed config's
    first kernel is also placed on that GPU's SMs (placed). Closing the generator stops the sweep after the
    config being timed."""
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
        where = placed(lambda c=cfg: call(c, *sets[0]), arch) if arch is not None else {}
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
                **where,
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
