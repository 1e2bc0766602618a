"""Lesson 3: the KV cache on and off. With it, each step feeds one token and reads the keys and values
of the others from the cache; without it, each step recomputes the whole sequence, so the time per token
climbs with the length (O(n) per token, O(n^2) over a generation)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ...measure import metrics
from ...measure.profile import profile_run
from .. import units
from . import base


def settings(size: str) -> dict:
    if size == "gpu":
        return dict(
            model=base.GPT2_SHAPE,
            dtype="bfloat16",
            backend="triton",
            prompt_tokens=16,
            new_tokens=768,
            graph=True,
            samples=6,
        )
    # The interpreter's time per step is set by running every kernel program in Python, which hides the
    # recomputation: on CPU the lesson runs the PyTorch backend, whose time is arithmetic.
    return dict(model="bundled", dtype="float32", backend="torch", prompt_tokens=16, new_tokens=96, samples=6)


def measure(s: dict) -> tuple[dict, dict]:
    """Both runs step by step (the time a step took as it ran), and at a few positions the device time of
    the step's kernels alone, launch overhead kept out (what the recomputation costs the GPU)."""
    model = base.model(s)
    ids = base.prompt(model, s["prompt_tokens"])
    steps_frames, kernel_frames, facts = [], [], {}
    for cache in (True, False):
        key = "on" if cache else "off"
        # A CUDA graph needs the cache: every cache-off step has a new shape.
        steps = base.generation(model, s, cache=cache, graph=s.get("graph", False) and cache)
        frame = metrics.step_frame(steps)
        frame = frame[["step", "phase", "position", "context_tokens", "latency_ms", "modeled_gflop"]]
        frame = frame.rename(columns={"modeled_gflop": "gflop"})
        frame.insert(0, "cache", key)
        steps_frames.append(frame)
        profiled = profile_run(model, [ids], steps, cache=cache, backend=s["backend"], samples=s["samples"])
        profiled = profiled[profiled.phase == "decode"]
        kernels = profiled.groupby("position", as_index=False).kernel_ms.sum()
        kernels.insert(0, "cache", key)
        kernel_frames.append(kernels)
        decode = frame[frame.phase == "decode"]
        early, late = base.ends(decode.latency_ms)
        facts |= {
            f"{key}_early_ms": early,
            f"{key}_late_ms": late,
            f"{key}_total_ms": float(frame.latency_ms.sum()),
            f"{key}_first_gflop": float(decode.gflop.iloc[0]),
            f"{key}_last_gflop": float(decode.gflop.iloc[-1]),
            f"{key}_last_context": int(decode.context_tokens.iloc[-1]),
            f"{key}_first_kernel_ms": float(kernels.kernel_ms.iloc[0]),
            f"{key}_last_kernel_ms": float(kernels.kernel_ms.iloc[-1]),
        }
        if cache:
            summary = metrics.summary(steps)
            facts["kv_mb"] = summary["kv_cache_mb"]
            facts["graph"] = bool(summary["cuda_graph"])
    facts["first_position"], facts["last_position"] = int(decode.position.iloc[0]), int(decode.position.iloc[-1])
    facts["profiled_first"], facts["profiled_last"] = int(kernels.position.iloc[0]), int(kernels.position.iloc[-1])
    facts["tokens"] = s["new_tokens"]
    tables = {"steps": pd.concat(steps_frames, ignore_index=True), "kernels": pd.concat(kernel_frames)}
    return facts, tables


def explain(r) -> str:
    f = r.facts
    graph = " (each step replayed from a CUDA graph)" if f.get("graph") else ""
    text = (
        f"Both runs generated {f['tokens']} tokens after the same {r.settings['prompt_tokens']}-token prompt. "
        f"**With the cache**{graph}, a step fed one token and read the other keys and values from the cache: "
        f"{base.num(f['on_first_gflop'] * 1e3)} MFLOP a step, and its time went from "
        f"**{base.ms(f['on_early_ms'])}** near position {f['first_position']} to **{base.ms(f['on_late_ms'])}** "
        f"near {f['last_position']} (medians of the first and last eighth of the steps). **Without it**, every "
        f"step ran the whole sequence again, {f['off_last_context']} tokens by the end: its work grew from "
        f"{base.num(f['off_first_gflop'] * 1e3)} to {base.num(f['off_last_gflop'] * 1e3)} MFLOP a step, and its "
        f"time from **{base.ms(f['off_early_ms'])}** to **{base.ms(f['off_late_ms'])}**.\n\n"
        f"{base.timed_alone(r)} at positions {f['profiled_first']} to {f['profiled_last']}, a step's "
        f"{base.clock(r)} went from {base.ms(f['off_first_kernel_ms'])} to "
        f"**{base.ms(f['off_last_kernel_ms'])}** without the cache, and from {base.ms(f['on_first_kernel_ms'])} to "
        f"**{base.ms(f['on_last_kernel_ms'])}** with it: O(n) work per token against O(1), plus a read of the cache "
        f"that grows by one position a step. "
    )
    kernels_grew = f["off_last_kernel_ms"] > 1.5 * f["off_first_kernel_ms"]
    steps_flat = f["off_late_ms"] < 1.2 * f["off_early_ms"]
    if kernels_grew and steps_flat:
        text += (
            "The cache-off steps themselves barely grew: each spent most of its time launching its kernels from "
            "Python (see *Launch overhead and CUDA graphs*), and the recomputation hid behind the launches. "
        )
    return text + (
        f"Over the whole generation that is {base.ms(f['on_total_ms'])} with the cache and "
        f"{base.ms(f['off_total_ms'])} without ({base.num(f['off_total_ms'] / f['on_total_ms'])}×). The price "
        f"of the cache is memory: it held **{base.mb(f['kv_mb'])}** of keys and values at the end."
    )


def figure(r) -> go.Figure:
    steps, kernels = r.tables["steps"], r.tables["kernels"]
    decode = steps[steps.phase == "decode"]
    unit, per = units.time_unit([*decode.latency_ms, *kernels.kernel_ms], log=base.log_time(r))
    fig = go.Figure()
    for cache, color in (("on", "#4c78a8"), ("off", "#e45756")):
        part = decode[decode.cache == cache]
        fig.add_trace(
            go.Scatter(
                x=part.position, y=part.latency_ms / per, mode="lines", name=f"cache {cache}: step", line_color=color
            )
        )
        timed = kernels[kernels.cache == cache]
        fig.add_trace(
            go.Scatter(
                x=timed.position,
                y=timed.kernel_ms / per,
                mode="lines+markers",
                line=dict(color=color, dash="dot"),
                name=f"cache {cache}: its kernels",
            )
        )
    base.time_axis(fig, r)
    return base.big(fig, "Time per token, KV cache on and off", r, "sequence position", f"{unit} per token")


LESSON = base.Lesson(
    name="kv-cache",
    title="The KV cache on and off",
    summary="Run with the cache and without: per-token time stays flat with it and climbs without it.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "In *Compare*, give several prompt lengths (e.g. 8, 64, 256): cache off starts higher for longer prompts. "
        "In Generate, untick *KV cache* and watch the *Tokens recomputed per step* chart replace the cache's growth."
    ),
    estimate=lambda s: base.generation_estimate(s, runs=(True, False), profiled=s["samples"] + 1),
    controls=lambda s: base.generate_controls(s) | {"cache": False},
)
