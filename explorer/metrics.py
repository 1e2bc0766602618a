"""Numbers a GPU engineer can trust: Steps -> tidy DataFrames, summaries, device ceilings, roofline.

Conventions everywhere: medians and percentiles, never means of noisy timings; warm-up (Triton's
compile) reported apart from steady state; modeled bytes come from each kernel's own traffic model;
on CPU every figure is labelled as a Triton-interpreter figure, not a GPU one.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass

import pandas as pd
import torch

from kernels.attention import traffic as attention_traffic
from kernels.attention import traffic_naive
from kernels.layer_norm import traffic as layer_norm_traffic
from kernels.layer_norm import traffic_unfused as layer_norm_unfused
from kernels.linear import traffic as linear_traffic
from kernels.linear import traffic_unfused as linear_unfused

MB = 1 << 20


@dataclass(frozen=True)
class Peaks:
    """The device's ceilings, measured once per process."""

    bandwidth_gbs: float  # device-to-device copy, bytes read + written per second
    tflops: float  # a large matrix product in the run's dtype
    label: str


CPU_LABEL = "CPU: Triton interpreter, timings are not GPU timings"


@functools.cache
def device_peaks(device: str, dtype: torch.dtype = torch.bfloat16) -> Peaks | None:
    """Measured copy bandwidth and matmul rate of a GPU (cached per process); None on CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    bandwidth, tflops = _copy_gbs(dev), _matmul_tflops(dev, dtype)
    name = torch.cuda.get_device_name(dev)
    return Peaks(bandwidth, tflops, f"{name}: measured {bandwidth:.0f} GB/s copy, {tflops:.0f} TFLOP/s {dtype}")


def _copy_gbs(dev) -> float:
    from triton.testing import do_bench

    src = torch.randn(1 << 28, device=dev)  # 1 GiB of fp32: far past any L2
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=10, rep=50, return_mode="median")
    return 2 * src.numel() * 4 / ms / 1e6


def _matmul_tflops(dev, dtype, n: int = 8192) -> float:
    from triton.testing import do_bench

    a, b = torch.randn(n, n, device=dev, dtype=dtype), torch.randn(n, n, device=dev, dtype=dtype)
    ms = do_bench(lambda: a @ b, warmup=10, rep=50, return_mode="median")
    return 2 * n**3 / ms / 1e9


def percentile(values, q: float) -> float:
    """q-th percentile (0-100) with linear interpolation between order statistics; NaN when empty."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def kv_bytes_per_token(n_layer: int, n_head: int, head_dim: int, itemsize: int) -> int:
    """K and V of one position: 2 x layers x heads x head_dim x bytes per element."""
    return 2 * n_layer * n_head * head_dim * itemsize


def step_frame(steps) -> pd.DataFrame:
    """One row per step (a token for every sequence in the batch)."""
    rows = []
    for s in steps:
        moved = sum(t.bytes for t in s.traffic.values())
        rows.append(
            dict(
                step=s.index,
                phase=s.phase,
                position=s.position,
                batch=len(s.token_ids),
                context_tokens=s.context_tokens,
                latency_ms=s.latency_ms,
                modeled_mb=moved / MB,
                modeled_gflop=sum(t.flops for t in s.traffic.values()) / 1e9,
                achieved_gbs=moved / s.latency_ms / 1e6 if s.latency_ms > 0 else math.nan,
                kv_used_mb=s.kv_used_bytes / MB,
                kv_allocated_mb=s.kv_allocated_bytes / MB,
                memory_mb=s.memory_bytes / MB if s.memory_bytes is not None else math.nan,
                warmup_ms=s.warmup_ms,
                launches=s.launches,
                graph=s.graph,
                timer=s.timer,
            )
        )
    return pd.DataFrame(rows)


def kernel_frame(steps) -> pd.DataFrame:
    """One row per (step, kernel kind): modeled bytes and FLOPs, and measured time when profiled."""
    rows = []
    for s in steps:
        for kind, t in s.traffic.items():
            ms = s.kernel_ms.get(kind, math.nan)
            launch = s.launch_ms.get(kind, math.nan)
            rows.append(
                dict(
                    step=s.index,
                    phase=s.phase,
                    kind=kind,
                    bytes_read=t.bytes_read,
                    bytes_written=t.bytes_written,
                    modeled_mb=t.bytes / MB,
                    floor_mb=t.min_bytes / MB,
                    gflop=t.flops / 1e9,
                    intensity=t.flops / t.bytes if t.bytes else math.nan,  # FLOP per byte
                    kernel_ms=ms,
                    launch_ms=launch,  # host time launching it (GPU profiling pass)
                    achieved_gbs=t.bytes / ms / 1e6 if ms and ms > 0 else math.nan,
                    achieved_tflops=t.flops / ms / 1e9 if ms and ms > 0 else math.nan,
                )
            )
    return pd.DataFrame(rows)


def summary(steps, peaks: Peaks | None = None) -> dict:
    """What a person decoding cares about: time to first token, ms/token (p50, p90), tokens/s, the
    warm-up apart, modeled bytes per token and achieved bandwidth against the measured peak."""
    if not steps:
        return {}
    decode = [s for s in steps if s.phase == "decode"]
    batch = len(steps[0].token_ids)
    decode_ms = [s.latency_ms for s in decode]
    total_decode_s = sum(decode_ms) / 1e3
    per_token_bytes = [sum(t.bytes for t in s.traffic.values()) / batch for s in decode]
    achieved = [sum(t.bytes for t in s.traffic.values()) / s.latency_ms / 1e6 for s in decode if s.latency_ms > 0]
    memory = [s.memory_bytes for s in steps if s.memory_bytes is not None]
    out = dict(
        timer=steps[0].timer,
        tokens=len(steps) * batch,
        warmup_ms=sum(s.warmup_ms for s in steps),  # compilation before step 0, graph capture before step 1
        ttft_ms=steps[0].latency_ms,
        ms_per_token_p50=percentile(decode_ms, 50),
        ms_per_token_p90=percentile(decode_ms, 90),
        tokens_per_s=len(decode) * batch / total_decode_s if total_decode_s > 0 else math.nan,
        mb_per_token=statistics.median(per_token_bytes) / MB if per_token_bytes else math.nan,
        achieved_gbs=percentile(achieved, 50),
        kv_cache_mb=steps[-1].kv_used_bytes / MB,
        peak_memory_mb=max(memory) / MB if memory else math.nan,
        stop_reason=steps[-1].stop_reason,
        cuda_graph=any(s.graph for s in decode),
        launches_per_step=statistics.median(s.launches for s in decode) if decode else math.nan,
    )
    if peaks is not None:
        out["peak_gbs"] = peaks.bandwidth_gbs
        out["bandwidth_fraction"] = out["achieved_gbs"] / peaks.bandwidth_gbs
    return out


def roofline(kernels: pd.DataFrame, peaks: Peaks | None) -> pd.DataFrame:
    """Per kernel kind, over profiled decode steps: arithmetic intensity (FLOP/byte) and achieved
    TFLOP/s, with the ceiling at that intensity, min(peak FLOP/s, intensity x peak bandwidth)."""
    timed = kernels.dropna(subset=["kernel_ms"])
    if timed.empty:
        return pd.DataFrame(columns=["phase", "kind", "intensity", "achieved_tflops", "ceiling_tflops", "bound"])
    g = timed.groupby(["phase", "kind"], as_index=False).agg(
        bytes=("modeled_mb", "sum"), gflop=("gflop", "sum"), kernel_ms=("kernel_ms", "sum")
    )
    g["intensity"] = g.gflop * 1e9 / (g.bytes * MB)
    g["achieved_tflops"] = g.gflop / g.kernel_ms
    if peaks is not None:
        ridge = peaks.tflops * 1e12 / (peaks.bandwidth_gbs * 1e9)
        g["ceiling_tflops"] = [min(peaks.tflops, i * peaks.bandwidth_gbs / 1e3) for i in g.intensity]
        g["bound"] = ["memory" if i < ridge else "compute" for i in g.intensity]
    return g


def fusion_lessons(cfg, tokens: int, itemsize: int, tiles=None, dtype=torch.float16, device="cpu") -> pd.DataFrame:
    """What fusion saves for one layer at `tokens` prompt tokens: modeled bytes of the fused launch
    next to the unfused alternative (naive attention's score matrix, a separate residual add before
    LayerNorm, a separate GELU)."""
    from .ops import Tiles

    tiles = tiles or Tiles()
    cfg_attn, cfg_lin, cfg_ln = tiles.fixed("attention"), tiles.fixed("linear"), tiles.fixed("layer_norm")
    C, H, D = cfg.n_embd, cfg.n_head, cfg.head_dim
    on = dict(dtype=dtype, device=device)
    pairs = [
        ("attention", attention_traffic(1, H, tokens, tokens, D, itemsize, config=cfg_attn, **on),
         traffic_naive(1, H, tokens, tokens, D, itemsize)),
        ("residual add + LayerNorm", layer_norm_traffic(tokens, C, itemsize, residual=True, config=cfg_ln),
         layer_norm_unfused(tokens, C, itemsize, residual=True)),
        ("linear + GELU (FFN in)", linear_traffic(tokens, 4 * C, C, itemsize, activation="gelu", config=cfg_lin, **on),
         linear_unfused(tokens, 4 * C, C, itemsize, activation="gelu")),
    ]  # fmt: skip
    rows = []
    for lesson, fused, unfused in pairs:
        rows.append(dict(lesson=lesson, variant="fused (ours)", mb=fused.bytes / MB, floor_mb=fused.min_bytes / MB))
        rows.append(dict(lesson=lesson, variant="unfused", mb=unfused.bytes / MB, floor_mb=unfused.min_bytes / MB))
    return pd.DataFrame(rows)


def export(frame: pd.DataFrame, path: str) -> str:
    """Write CSV or JSON (records) by the file's extension; returns the path."""
    if path.endswith(".json"):
        with open(path, "w") as f:
            json.dump(json.loads(frame.to_json(orient="records")), f, indent=1)
    else:
        frame.to_csv(path, index=False)
    return path
