"""The fusion ladder: one decode step of the same model at the same context, rung by rung.

For each rung (explorer.model.ops.FUSIONS, then the PyTorch backend for comparison) one row says:
- kernels per step: on a GPU counted by torch.profiler (CUPTI) over one CUDA-graph replay of the step;
  without a GPU nothing launches, so the column is empty and `launches_modeled` gives the number of
  launches the step's operations make (two for a split-K projection under "none" and "epilogue"; none
  given for the torch backend, whose kernels per operation are PyTorch's choice);
- bytes per step at both levels of the memory model (explorer.measure.traffic), the SMs' requests and HBM;
- device time per step: on a GPU the median of CUDA-graph replays timed by CUDA events, the cache
  lengths reset to `context` between replays (outside the timed span), so every replay is the same
  step; on a CPU the Triton interpreter's wall time of one eager step, labelled as such.

The KV cache holds random keys and values (never zeros) up to `context`; no prefill is needed to time
a decode step there.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import torch

from kernels.operations import operation

from ..model.cache import KVCache
from ..model.graphs import DecodeGraph
from ..model.ops import FUSIONS, Trace
from .launches import device_activity
from .metrics import MB
from .traffic import total_traffic

RUNGS = (*FUSIONS, "torch")  # "torch": the PyTorch backend, whatever the rung


def launches_of(op) -> int | None:
    """Launches one Triton operation makes: split-K projections and two-launch decode attention make two.
    None for the torch backend, whose operations launch as many kernels as PyTorch chooses (counted on a GPU)."""
    if op.backend != "triton":
        return None
    return operation(op.kernel).launches(op.sizes, op.config, op.dtype, op.device)


def _total(counts) -> int | None:
    counts = list(counts)
    return None if None in counts else sum(counts)


def _model_for(model, rung: str):
    if rung == "torch":
        return model.with_backend("torch")
    return model.with_backend("triton").with_fusion(rung)


def random_cache(model, batch: int, context: int, generator) -> KVCache:
    """A cache with room for one more position, holding random keys and values up to `context`."""
    cache = KVCache.for_model(model, batch, context + 1)
    for buf in (cache.k, cache.v):
        buf.copy_(torch.randn(buf.shape, generator=generator, dtype=torch.float32).to(buf.dtype))
    cache.set_lengths([context] * batch)
    return cache


def rung_row(model, rung: str, *, context: int, batch: int = 1, replays: int = 50, seed: int = 0) -> dict:
    """One rung's decode step at `context` keys per sequence."""
    if not 1 <= context < model.config.n_positions:
        raise ValueError(
            f"context={context} must be between 1 and {model.config.n_positions - 1} (the model's positions)"
        )
    m = _model_for(model, rung)
    cache, ids, ops, first_ms = traced_step(m, context, batch, seed)  # on a GPU, timed again below
    total = step_total(ops, context, batch)
    row = dict(
        rung=rung,
        context=context,
        batch=batch,
        operations=len(ops),
        launches_modeled=_total(launches_of(op) for op in ops),
        l2_mb=total.bytes / MB,
        hbm_mb=total.hbm_bytes / MB,
    )
    if m.device.type != "cuda":  # the interpreter compiles nothing: its first step is as long as any other
        return row | dict(kernels=None, memory_ops=None, step_ms=first_ms, timer="cpu perf_counter (interpreter)")
    graph = DecodeGraph(m, cache)
    kernels, memory_ops = device_activity(graph.graph.replay)
    reset(cache, context)
    step_ms = replay_ms(graph.graph.replay, lambda: reset(cache, context), replays)
    timer = f"cuda events, median of {replays} CUDA-graph replays"
    return row | dict(kernels=kernels, memory_ops=memory_ops, step_ms=step_ms, timer=timer)


def traced_step(model, context: int, batch: int = 1, seed: int = 0):
    """One decode step of `model` (at its rung) over a random cache at `context` positions, traced: (the cache,
    put back to `context` after the step, the step's ids, its operations, and the milliseconds it took, which on
    a GPU include compiling the rung's kernels the first time)."""
    generator = torch.Generator().manual_seed(seed)
    cache = random_cache(model, batch, context, generator)
    ids = torch.randint(0, model.config.vocab_size, (batch,), generator=generator).to(model.device)
    trace = Trace()
    t0 = time.perf_counter()
    model.decode(ids, cache, observer=trace)
    first_ms = (time.perf_counter() - t0) * 1e3
    reset(cache, context)
    return cache, ids, trace.ops, first_ms


def step_total(ops, context: int, batch: int):
    """Modeled traffic of a decode step's operations at `context`: each sequence attends over its cache and the
    new token."""
    return total_traffic(ops, (context + 1,) * batch)


def replay_ms(replay, reset_state, replays: int) -> float:
    """Median device time of `replay()` (a CUDA-graph replay) over `replays` calls, each timed by CUDA
    events, with `reset_state()` after each, outside the timed span."""
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replay()
        end.record()
        reset_state()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def reset(cache: KVCache, context: int) -> None:
    """Every sequence back at `context` positions, on the device without a host copy."""
    cache.lengths.fill_(context)
    cache.host_lengths = [context] * len(cache.host_lengths)


def ladder_rows(model, *, context: int, batch: int = 1, rungs=RUNGS, replays: int = 50) -> Iterator[dict]:
    """One row per rung, as each is measured (for progress in the app and the CLI)."""
    for rung in rungs:
        if rung not in RUNGS:
            raise ValueError(f"rung {rung!r} is not known (allowed: {', '.join(RUNGS)})")
        yield rung_row(model, rung, context=context, batch=batch, replays=replays)
