"""Lesson 3: the KV cache on and off. With it, each step feeds one token and reads the keys and values
of the others from the cache; without it, each step recomputes the whole sequence, so the work per token
grows with the length (O(n) per token, O(n^2) over a generation), and its time with it once that work
outweighs what a step costs whatever its length."""

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
    text += why_flat(f, r.device)
    return text + (
        f"Over the whole generation that is {base.ms(f['on_total_ms'])} with the cache and "
        f"{base.ms(f['off_total_ms'])} without ({base.num(f['off_total_ms'] / f['on_total_ms'])}×). The price "
        f"of the cache is memory: it held **{base.mb(f['kv_mb'])}** of keys and values at the end."
    )


CLIMBS = 1.5  # a cache-off curve "climbs" where its last step takes this many times its first


def climbs(first: float, last: float) -> bool:
    return last > CLIMBS * first


def why_flat(f: dict, device: str) -> str:
    """What the cache-off curves did, in words chosen by their numbers: they climb, or why they do not at this
    size. A cache-off step's recompute is a prefill of the whole prefix; while its FLOPs take less time than the
    step's fixed part (its kernels' own floor: their launches on the device, a weight read each), it barely grows.
    The crossover, where the recompute's time equals that floor, follows from the recorded device times: the
    growth per position between the first and last profiled positions, against the first's time."""
    steps_climb = climbs(f["off_early_ms"], f["off_late_ms"])
    kernels_climb = climbs(f["off_first_kernel_ms"], f["off_last_kernel_ms"])
    if steps_climb and kernels_climb:
        return "Without the cache the time per token climbed with the context, as its work did. "
    span = f["profiled_last"] - f["profiled_first"]
    growth = (f["off_last_kernel_ms"] - f["off_first_kernel_ms"]) / span if span else 0.0
    text = ""
    if not kernels_climb:
        text += (
            f"So the cache-off step's time barely grew ({base.num(f['off_last_kernel_ms'] / f['off_first_kernel_ms'])}"
            f"× from the first to the last position) while its work grew "
            f"{base.num(f['off_last_gflop'] / f['off_first_gflop'])}×: recomputing a prefix of a few hundred tokens "
            "is one prefill of that many rows, which on this device costs little more than the step's fixed part "
            f"(its kernels' floor, {base.ms(f['off_first_kernel_ms'])} here). "
        )
        if growth > 0:
            double = f["profiled_first"] + f["off_first_kernel_ms"] / growth
            text += (
                f"At the growth measured ({base.num(growth * 1e3)} µs per position) the recompute would match that "
                f"floor, and the step's time double, only near **{base.num(double)} positions**: the point past which "
                "the cache-off steps climb. "
            )
    if not steps_climb:
        text += (
            f"The steps as they ran stayed near {base.ms(f['off_early_ms'])}: each cache-off step launched its "
            "kernels one by one from Python (a new shape every step, so no CUDA graph), and the launches, not the "
            "recomputation, set its time (see *Launch overhead and CUDA graphs*). "
        )
    return text


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
    summary="Run with the cache and without: per-token work stays flat with it and grows with the context "
    "without it, and the time follows once that work outweighs a step's fixed cost.",
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
