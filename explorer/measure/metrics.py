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

from kernels.config import Traffic, device_limits
from kernels.ops.attention.kernel import traffic as attention_traffic
from kernels.ops.attention.kernel import traffic_naive
from kernels.ops.layer_norm.kernel import traffic as layer_norm_traffic
from kernels.ops.layer_norm.kernel import traffic_unfused as layer_norm_unfused
from kernels.ops.linear.kernel import traffic as linear_traffic
from kernels.ops.linear.kernel import traffic_unfused as linear_unfused

from ..model.ops import Tiles
from .roofs import ROOFS
from .traffic import step_traffic

MB = 1 << 20


@dataclass(frozen=True)
class Peaks:
    """The device's ceilings, measured once per process."""

    bandwidth_gbs: float  # device-to-device copy, bytes read + written per second
    tflops: float  # a large matrix product in `dtype`
    label: str
    dtype: str = "bfloat16"  # the product's dtype: which units its rate is the peak of (ROOFS)

    @property
    def roof(self) -> str:
        return ROOFS.get(self.dtype, self.dtype)


CPU_LABEL = "CPU: Triton interpreter, timings are not GPU timings"


@functools.cache
def device_peaks(device: str, dtype: torch.dtype = torch.bfloat16) -> Peaks | None:
    """Measured copy bandwidth and matmul rate of a GPU (cached per process); None on CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    bandwidth, tflops = _copy_gbs(dev), _matmul_tflops(dev, dtype)
    name = device_limits(dev).name  # "NVIDIA H200", or "NVIDIA H200 standing for sm_120 (RTX Pro 6000)"
    dtype_name = str(dtype).removeprefix("torch.")
    label = f"{name}: measured {bandwidth:.0f} GB/s copy, {tflops:.0f} TFLOP/s {ROOFS.get(dtype_name, dtype_name)}"
    return Peaks(bandwidth, tflops, label, dtype_name)


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


def kv_why(cfg, itemsize: int) -> str:
    """Why the KV cache grows as fast as it does: one position's K and V, factor by factor, and with grouped-query
    heads how many query heads share each key/value head (the cache that many times smaller)."""
    per = kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, itemsize)
    why = (
        f"per token: 2 (K, V) × {cfg.n_layer} layers × {cfg.n_kv_head} KV heads × {cfg.head_dim} dims × "
        f"{itemsize} B = {per / 1024:.1f} KB"
    )
    if cfg.n_kv_head != cfg.n_head:
        why += f"; {cfg.n_head} query heads share them, {cfg.n_head // cfg.n_kv_head}× less than one each"
    return why


def step_frame(steps) -> pd.DataFrame:
    """One row per step (a token for every sequence in the batch)."""
    rows = []
    for s in steps:
        traffic = step_traffic(s)
        moved = sum(t.bytes for t in traffic.values())
        hbm = sum(t.hbm_bytes for t in traffic.values())
        rows.append(
            dict(
                step=s.index,
                phase=s.phase,
                position=s.position,
                batch=len(s.token_ids),
                context_tokens=s.context_tokens,
                latency_ms=s.latency_ms,
                wall_s=s.wall_s,
                modeled_mb=moved / MB,  # what the SMs request
                hbm_mb=hbm / MB,
                modeled_gflop=sum(t.flops for t in traffic.values()) / 1e9,
                achieved_gbs=hbm / s.latency_ms / 1e6 if s.latency_ms > 0 else math.nan,  # HBM bytes over step time
                kv_used_mb=s.kv_used_bytes / MB,
                kv_allocated_mb=s.kv_allocated_bytes / MB,
                peak_memory_mb=s.peak_memory_bytes / MB if s.peak_memory_bytes is not None else math.nan,
                warmup_ms=s.warmup_ms,
                operations=len(s.ops),
                graph=s.graph,
                timer=s.timer,
            )
        )
    return pd.DataFrame(rows)


KERNEL_COLUMNS = [
    "step",
    "phase",
    "kind",
    "bytes_read",
    "bytes_written",
    "modeled_mb",
    "hbm_read",
    "hbm_written",
    "hbm_mb",
    "floor_mb",
    "gflop",
    "intensity",
    "kernel_ms",
    "launch_ms",
    "profiled_step",
    "achieved_gbs",
    "achieved_tflops",
]


def kernel_frame(steps, profiled: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (step, kernel kind): modeled bytes and FLOPs; with `profiled` (profile.profile_run's
    rows), the device and launch time measured at the nearest profiled step of the same phase, and
    which step that was (`profiled_step`)."""
    times = _times_by_step(profiled)
    rows = []
    for s in steps:
        near = _nearest(times, s.phase, s.index)
        timed = times[(s.phase, near)] if near is not None else {}
        traffic = step_traffic(s)
        # A launch that runs several operations (the megakernel rung's step) has its bytes split by them, and its
        # time, which no operation of it has alone, on a row of its own without bytes.
        alone = {kind: Traffic(0, 0, 0, 0) for kind in timed if kind not in traffic}
        for kind, t in (traffic | alone).items():
            ms, launch = timed.get(kind, (math.nan, math.nan))
            rows.append(
                dict(
                    step=s.index,
                    phase=s.phase,
                    kind=kind,
                    bytes_read=t.bytes_read,
                    bytes_written=t.bytes_written,
                    modeled_mb=t.bytes / MB,  # the SMs' requests: every load and store issued, tile re-reads included
                    hbm_read=t.hbm_read,
                    hbm_written=t.hbm_written,
                    hbm_mb=t.hbm_bytes / MB,  # what the L2 lets through to HBM
                    floor_mb=t.min_bytes / MB,
                    gflop=t.flops / 1e9,
                    intensity=t.flops / t.hbm_bytes if t.hbm_bytes else math.nan,  # FLOP per HBM byte
                    kernel_ms=ms,
                    launch_ms=launch,  # host time launching it (GPU profiling pass)
                    profiled_step=near if near is not None else math.nan,
                    achieved_gbs=t.hbm_bytes / ms / 1e6 if ms and ms > 0 and t.hbm_bytes else math.nan,
                    achieved_tflops=t.flops / ms / 1e9 if ms and ms > 0 and t.flops else math.nan,
                )
            )
    return pd.DataFrame(rows, columns=KERNEL_COLUMNS)


def _times_by_step(profiled: pd.DataFrame | None) -> dict:
    """{(phase, step): {kind: (kernel_ms, launch_ms)}} from profile rows (one per operation name)."""
    if profiled is None or profiled.empty:
        return {}
    g = profiled.groupby(["phase", "step", "kind"])[["kernel_ms", "launch_ms"]].sum(min_count=1)
    out: dict = {}
    for (phase, step, kind), r in g.iterrows():
        out.setdefault((phase, int(step)), {})[kind] = (r.kernel_ms, r.launch_ms)
    return out


def _nearest(times: dict, phase: str, index: int) -> int | None:
    candidates = [step for p, step in times if p == phase]
    return min(candidates, key=lambda step: (abs(step - index), step)) if candidates else None


def profiled_note(profiled: pd.DataFrame | None) -> str:
    """Which positions a profile measured, for the charts that use it."""
    if profiled is None or profiled.empty:
        return ""
    decode = sorted(set(profiled[profiled.phase == "decode"].position))
    where = f"decode positions {', '.join(map(str, decode))}" if decode else "the prefill"
    return f"timed at {where}; other steps use the nearest"


def summary(steps, peaks: Peaks | None = None, launches=None) -> dict:
    """What a person decoding cares about, each number under its own name: time to first token; the
    decode step on the device clock (p50, p90); the rate at which tokens reached the caller by the
    wall clock (first token to last); the warm-up apart; modeled bytes per token; achieved bandwidth
    against the measured peak; peak memory (torch.cuda.max_memory_allocated over the run); and, when
    counted (launches.StepLaunches), the kernels a decode step runs."""
    if not steps:
        return {}
    decode = [s for s in steps if s.phase == "decode"]
    batch = len(steps[0].token_ids)
    decode_ms = [s.latency_ms for s in decode]
    traffic = [step_traffic(s).values() for s in decode]
    moved = [sum(t.hbm_bytes for t in kinds) for kinds in traffic]
    issued = [sum(t.bytes for t in kinds) for kinds in traffic]
    achieved = [m / s.latency_ms / 1e6 for m, s in zip(moved, decode, strict=True) if s.latency_ms > 0]
    wall = steps[-1].wall_s - steps[0].wall_s
    memory = [s.peak_memory_bytes for s in steps if s.peak_memory_bytes is not None]
    out = dict(
        timer=steps[0].timer,
        tokens=len(steps) * batch,
        warmup_ms=sum(s.warmup_ms for s in steps),  # compilation before step 0, graph capture before step 1
        ttft_ms=steps[0].latency_ms,
        step_ms_p50=percentile(decode_ms, 50),
        step_ms_p90=percentile(decode_ms, 90),
        wall_tokens_per_s=len(decode) * batch / wall if decode and wall > 0 else math.nan,
        mb_per_token=statistics.median(moved) / batch / MB if moved else math.nan,  # HBM
        l2_mb_per_token=statistics.median(issued) / batch / MB if issued else math.nan,
        achieved_gbs=percentile(achieved, 50),
        kv_cache_mb=steps[-1].kv_used_bytes / MB,
        peak_memory_mb=max(memory) / MB if memory else math.nan,
        stop_reason=steps[-1].stop_reason,
        cuda_graph=any(s.graph for s in decode),
        operations_per_step=statistics.median(len(s.ops) for s in decode) if decode else math.nan,
    )
    out["device_tokens_per_s"] = 1e3 * batch / out["step_ms_p50"] if decode else math.nan
    if launches is not None:
        out["kernels_per_step"] = launches.kernels
        out["memory_ops_per_step"] = launches.memory_ops
    if peaks is not None:
        out["peak_gbs"] = peaks.bandwidth_gbs
        out["bandwidth_fraction"] = out["achieved_gbs"] / peaks.bandwidth_gbs
    return out


def roofline(kernels: pd.DataFrame, peaks: Peaks | None) -> pd.DataFrame:
    """Per kernel kind, over the steps that were profiled themselves (bytes and time at the same
    position): arithmetic intensity (FLOP per HBM byte) and achieved TFLOP/s, with the ceiling at that
    intensity, min(peak FLOP/s, intensity x peak HBM bandwidth)."""
    timed = kernels[kernels.step == kernels.profiled_step].dropna(subset=["kernel_ms"])
    if timed.empty:
        return pd.DataFrame(columns=["phase", "kind", "intensity", "achieved_tflops", "ceiling_tflops", "bound"])
    g = timed.groupby(["phase", "kind"], as_index=False).agg(
        bytes=("hbm_mb", "sum"), gflop=("gflop", "sum"), kernel_ms=("kernel_ms", "sum")
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
    tiles = tiles or Tiles()
    cfg_attn, cfg_lin, cfg_ln = tiles.fixed("attention"), tiles.fixed("linear"), tiles.fixed("layer_norm")
    C, H, D = cfg.n_embd, cfg.n_head, cfg.head_dim
    on = dict(dtype=dtype, device=device)
    pairs = [
        (
            "attention",
            attention_traffic(1, H, tokens, tokens, D, itemsize, config=cfg_attn, **on),
            traffic_naive(1, H, tokens, tokens, D, itemsize),
        ),
        (
            "residual add + LayerNorm",
            layer_norm_traffic(tokens, C, itemsize, residual=True, config=cfg_ln, device=device),
            layer_norm_unfused(tokens, C, itemsize, residual=True),
        ),
        (
            "linear + GELU (FFN in)",
            linear_traffic(tokens, 4 * C, C, itemsize, activation="gelu", config=cfg_lin, **on),
            linear_unfused(tokens, 4 * C, C, itemsize, activation="gelu"),
        ),
    ]
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
