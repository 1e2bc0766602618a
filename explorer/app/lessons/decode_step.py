"""Lesson 2: the decoder block, and where a decode step's time goes, operation by operation."""

from __future__ import annotations

import plotly.graph_objects as go

from ...measure import metrics
from ...measure.profile import profile_run
from .. import units
from . import base

WEIGHT_KINDS = ("qkv/out proj", "ffn", "lm_head")  # the operations that read a weight matrix


def settings(size: str) -> dict:
    common = dict(backend="triton", cache=True)
    if size == "gpu":
        return common | dict(model=base.GPT2_SHAPE, dtype="bfloat16", prompt_tokens=128, new_tokens=32, samples=3)
    return common | dict(model="bundled", dtype="float32", prompt_tokens=8, new_tokens=2, samples=1)


def measure(s: dict) -> tuple[dict, dict]:
    model = base.model(s)
    steps = base.generation(model, s)
    ids = base.prompt(model, s["prompt_tokens"])
    profiled = profile_run(model, [ids], steps, cache=True, backend=s["backend"], samples=s["samples"])
    decode = profiled[profiled.phase == "decode"]
    n = decode.step.nunique()
    kinds = decode.groupby("kind", as_index=False)[["kernel_ms"]].sum()
    kinds["kernel_ms"] = kinds.kernel_ms / n  # per decode step
    kinds = kinds.sort_values("kernel_ms", ascending=False).reset_index(drop=True)
    total = float(kinds.kernel_ms.sum())
    summary = metrics.summary(steps)
    facts = dict(
        step_ms=summary["step_ms_p50"],
        operations=int(summary["operations_per_step"]),
        layers=model.config.n_layer,
        positions=sorted(int(p) for p in decode.position.unique()),
        kernel_ms=total,
        top=[(str(k), float(v), float(v / total)) for k, v in zip(kinds.kind[:3], kinds.kernel_ms[:3], strict=True)],
        weights_share=float(kinds[kinds.kind.isin(WEIGHT_KINDS)].kernel_ms.sum() / total),
    )
    return facts, {"kinds": kinds}


def explain(r) -> str:
    f = r.facts
    where = ("positions " if len(f["positions"]) > 1 else "position ") + ", ".join(map(str, f["positions"]))
    shares = "; ".join(f"**{k}** {base.ms(v)} ({base.pct(p)})" for k, v, p in f["top"])
    gpu = r.device != "CPU"
    text = (
        f"Each of the {f['layers']} blocks runs LayerNorm, the QKV projection, attention over the cache, the "
        f"output projection, LayerNorm again and the two FFN matmuls; then a last LayerNorm and the LM head: "
        f"**{f['operations']} operations** per decode step. A step took **{base.ms(f['step_ms'])}** (median). "
        f"{base.timed_alone(r)} at {where}, they add up to {base.ms(f['kernel_ms'])}: "
        f"{shares}. The operations that read a weight matrix (projections, FFN, LM head) took "
        f"**{base.pct(f['weights_share'])}**: in decode each streams its whole matrix for one token.\n\n"
    )
    if gpu and f["step_ms"] > 1.5 * f["kernel_ms"]:
        text += (
            f"The step took {base.ms(f['step_ms'])} and its kernels {base.ms(f['kernel_ms'])}: for the other "
            f"{base.ms(f['step_ms'] - f['kernel_ms'])} the GPU waited while Python launched the operations one by one, "
            "which a CUDA graph replay removes (see *Launch overhead and CUDA graphs*)."
        )
    elif not gpu:
        text += (
            "Here each time is the Triton interpreter running the kernel's programs in Python: it grows with the "
            "number of tiles, not with bytes or FLOPs as a GPU's would."
        )
    return text


def figure(r) -> go.Figure:
    kinds = r.tables["kinds"].sort_values("kernel_ms")
    clock = "interpreter time" if r.device == "CPU" else "device time"
    unit, per = units.time_unit(kinds.kernel_ms)
    bars = go.Bar(y=kinds.kind, x=kinds.kernel_ms / per, orientation="h", name=clock, marker_color="#4c78a8")
    fig = go.Figure(bars)
    fig.update_yaxes(ticklabelstandoff=10)  # kind names clear of the bars they name
    return base.big(fig, f"Where a decode step goes ({clock})", r, f"{unit} per decode step", "")


LESSON = base.Lesson(
    name="decode-step",
    title="The decoder block: where a step's time goes",
    summary="One decode step timed operation by operation: the matmuls that stream weights dominate.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "In Generate, open *tiles* and change linear_decode's block_n or split_k, then Generate: the chart *Where a "
        "decode step goes* moves with them. Pick a larger model to see the FFN's share grow with the width."
    ),
    estimate=lambda s: base.generation_estimate(s, profiled=s["samples"] + 1),
    controls=base.generate_controls,
)
