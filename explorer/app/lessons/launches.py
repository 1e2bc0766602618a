"""Lesson 5: launch overhead and CUDA graphs. A decode step is many small kernels; launched one by one
from Python the GPU waits on the host, replayed as one CUDA graph it does not."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ...measure import launches, metrics
from .. import units
from . import base


def settings(size: str) -> dict:
    common = dict(backend="triton", cache=True)
    if size == "gpu":
        return common | dict(
            model=base.GPT2_SHAPE, dtype="bfloat16", prompt_tokens=16, new_tokens=64, graphs=[False, True]
        )
    return common | dict(model="bundled", dtype="float32", prompt_tokens=8, new_tokens=3, graphs=[False])


def measure(s: dict) -> tuple[dict, dict]:
    model = base.model(s)
    frames, facts = [], {}
    for graph in s["graphs"]:
        steps = base.generation(model, s, graph=graph)
        summary = metrics.summary(steps)
        key = "graph" if graph else "eager"
        facts |= {
            f"{key}_ms": summary["step_ms_p50"],
            f"{key}_tokens_per_s": summary["wall_tokens_per_s"],
            "operations": int(summary["operations_per_step"]),
        }
        if graph:
            facts["capture_ms"] = float(steps[1].warmup_ms)
        frame = metrics.step_frame(steps)[["step", "phase", "position", "latency_ms"]]
        frame.insert(0, "launch", "CUDA graph" if graph else "eager")
        frames.append(frame)
    if True in s["graphs"]:
        counted = launches.decode_step_launches(
            model, [base.prompt(model, s["prompt_tokens"])], cache=True, graph=False
        )
        facts["kernels"] = counted.kernels
        facts["per_launch_us"] = (facts["eager_ms"] - facts["graph_ms"]) * 1e3 / counted.kernels
    facts["per_operation_ms"] = facts["eager_ms"] / facts["operations"]
    return facts, {"steps": pd.concat(frames, ignore_index=True)}


def explain(r) -> str:
    f = r.facts
    if "graph_ms" not in f:
        return (
            f"A decode step here ran **{f['operations']} operations**, each launched from Python, in "
            f"**{base.ms(f['eager_ms'])}** (median): {base.ms(f['per_operation_ms'])} per operation. That time is the "
            "Triton interpreter running each kernel in Python, not a launch: a CPU shows no launch overhead, and CUDA "
            "graphs need a GPU. On a GPU the same operations are as many small kernels, and launching each from "
            "Python costs the host more than many of them take on the GPU, which then waits between them. A CUDA "
            "graph records the step once and replays it as one launch; the GPU recording shows what that buys."
        )
    capture = (
        f"Capturing the graph took {base.ms(f['capture_ms'])}, once."
        if f["capture_ms"] > 0
        else "The graph was captured by an earlier run of this shape and kept with the model: this run replayed it "
        "without capturing."
    )
    return (
        f"A decode step ran **{f['kernels']} GPU kernels** (counted by torch.profiler) from {f['operations']} "
        f"operations. Launched one by one from Python it took **{base.ms(f['eager_ms'])}** (median); replayed as one "
        f"CUDA graph, **{base.ms(f['graph_ms'])}**: {base.speed(f['eager_ms'], f['graph_ms'])}, with the "
        f"same kernels doing the same work. The difference, spread over the kernels, is "
        f"**{base.num(f['per_launch_us'])} µs per kernel**: what launching it from Python cost while the GPU waited. "
        f"{capture} Tokens reached the caller at "
        f"{base.num(f['eager_tokens_per_s'])} tokens/s eager and {base.num(f['graph_tokens_per_s'])} tokens/s "
        "from the graph (wall clock)."
    )


def figure(r) -> go.Figure:
    steps = r.tables["steps"]
    decode = steps[steps.phase == "decode"]
    unit, per = units.time_unit(decode.latency_ms, log=base.log_time(r))
    fig = go.Figure()
    for launch, color in (("eager", "#e45756"), ("CUDA graph", "#4c78a8")):
        part = decode[decode.launch == launch]
        if len(part):
            fig.add_trace(
                go.Scatter(
                    x=part.position, y=part.latency_ms / per, mode="lines+markers", name=launch, line_color=color
                )
            )
    base.time_axis(fig, r)
    fig.update_layout(showlegend=True)  # also when only the eager line could run (no GPU)
    return base.big(fig, "Decode step: eager or CUDA graph", r, "sequence position", f"{unit} per step")


LESSON = base.Lesson(
    name="cuda-graphs",
    title="Launch overhead and CUDA graphs",
    summary="Many small kernels launched from Python, or one CUDA graph replay: what the launches cost.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "On a GPU, untick *CUDA graph* in Generate and compare the summary's decode step and launch count; *Compare* "
        "runs each cache-on length both ways. Raise the batch: the launches stay, the work grows, the gap shrinks."
    ),
    estimate=lambda s: base.generation_estimate(s, runs=[True] * len(s["graphs"])),
    controls=base.generate_controls,
)
