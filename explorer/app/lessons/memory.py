"""Lesson 1: the memory hierarchy and bandwidth. Where a decode step's bytes come from (HBM, L2, the
floor), how fast they moved, and where that puts decode on the roofline."""

from __future__ import annotations

import plotly.graph_objects as go

from ...measure import metrics, roofs
from . import base


def settings(size: str) -> dict:
    if size == "gpu":
        return dict(
            model=base.GPT2_SHAPE,
            dtype="bfloat16",
            backend="triton",
            prompt_tokens=128,
            new_tokens=64,
            cache=True,
            graph=True,
        )
    return dict(model="bundled", dtype="float32", backend="triton", prompt_tokens=8, new_tokens=3, cache=True)


def measure(s: dict) -> tuple[dict, dict]:
    model = base.model(s)
    steps = base.generation(model, s)
    peaks = base.peaks()
    summary = metrics.summary(steps, peaks)
    kernels = metrics.kernel_frame(steps)
    last = kernels[kernels.step == kernels.step.max()]  # the last decode step, per kernel kind
    kinds = last[["kind", "modeled_mb", "hbm_mb", "floor_mb", "gflop"]].reset_index(drop=True)
    frame = metrics.step_frame(steps)[["step", "phase", "position", "latency_ms", "hbm_mb", "modeled_mb"]]
    top = kinds.loc[kinds.hbm_mb.idxmax()]
    facts = dict(
        step_ms=summary["step_ms_p50"],
        hbm_mb=summary["mb_per_token"],
        l2_mb=summary["l2_mb_per_token"],
        achieved_gbs=summary["achieved_gbs"],
        position=int(steps[-1].position),
        last_hbm_mb=float(kinds.hbm_mb.sum()),
        last_floor_mb=float(kinds.floor_mb.sum()),
        last_gflop=float(kinds.gflop.sum()),
        weights_mb=base.weights_mb(model),
        top_kind=str(top.kind),
        top_share=float(top.hbm_mb / kinds.hbm_mb.sum()),
        peak_gbs=peaks.bandwidth_gbs if peaks else None,
        peak_tflops=peaks.tflops if peaks else None,
        peak_dtype=peaks.dtype if peaks else None,
    )
    facts["intensity"] = facts["last_gflop"] * 1e9 / (facts["last_hbm_mb"] * metrics.MB)
    return facts, {"kinds": kinds, "steps": frame}


def explain(r) -> str:
    f = r.facts
    text = (
        f"A decode step ran one token through {base.MODEL_LABELS[r.settings['model']]}, whose weights are "
        f"**{base.mb(f['weights_mb'])}**. By the kernels' traffic models at the tiles they ran with, the step "
        f"read and wrote **{base.mb(f['hbm_mb'])} in HBM** (median over the run's decode steps), while the SMs' "
        f"tile loads requested **{base.mb(f['l2_mb'])}** (what they ask of L1 and L2, re-reads included): "
        + (
            "tiles re-read some bytes, and the L2 keeps those re-reads away from HBM. "
            if f["l2_mb"] > 1.01 * f["hbm_mb"]
            else "almost nothing is loaded twice, since one token is one row of tiles and each weight tile is "
            "loaded once. "
        )
        + f"At the last step (position {f['position']}) the floor, every input read once and every output written "
        f"once, was {base.mb(f['last_floor_mb'])}; **{f['top_kind']}** alone moved {base.pct(f['top_share'])} of the "
        "HBM bytes. Every token reads every weight once: that is why decode is about bytes.\n\n"
        f"The step took **{base.ms(f['step_ms'])}** (median). "
    )
    if f.get("peak_gbs"):
        ridge = roofs.ridge(f["peak_tflops"], f["peak_gbs"])
        text += (
            f"Its HBM bytes over that time are **{base.num(f['achieved_gbs'])} GB/s**, "
            f"{base.pct(f['achieved_gbs'] / f['peak_gbs'])} of the {base.num(f['peak_gbs'])} GB/s copy bandwidth "
            f"measured on this GPU. It did {base.num(f['last_gflop'] * 1e3)} MFLOP on those bytes: "
            f"**{base.num(f['intensity'])} FLOP per byte**, where this GPU needs "
            f"{base.num(ridge)} FLOP per byte ({base.num(f['peak_tflops'])} TFLOP/s {base.roof(f)}, measured, ÷ its "
            "bandwidth) "
            "before arithmetic becomes the limit: decode sits "
            + ("left of the roofline's ridge, memory-bound." if f["intensity"] < ridge else "right of the ridge.")
        )
    else:
        text += (
            f"Its arithmetic intensity is **{base.num(f['intensity'])} FLOP per byte** "
            f"({base.num(f['last_gflop'] * 1e3)} MFLOP on {base.mb(f['last_hbm_mb'])}). There is no HBM on a CPU: "
            "the bytes are the models' and the time is the interpreter running each kernel in Python, so bytes "
            "over time here would not be a bandwidth."
        )
    return text


def figure(r) -> go.Figure:
    kinds = r.tables["kinds"].sort_values("hbm_mb")
    fig = go.Figure()
    for column, name, color in (
        ("modeled_mb", "SM requests (tile loads)", "#4c78a8"),
        ("hbm_mb", "HBM (what the L2 lets through)", "#e45756"),
        ("floor_mb", "floor (each byte once)", "#bab0ac"),
    ):
        fig.add_trace(go.Bar(y=kinds.kind, x=kinds[column], name=name, orientation="h", marker_color=color))
    fig.update_layout(barmode="group")
    fig.update_yaxes(ticklabelstandoff=10)  # kind names clear of the bars they name
    return base.big(fig, "Bytes of one decode step, by kernel", r, "MB (modeled)", "")


LESSON = base.Lesson(
    name="memory",
    title="Memory hierarchy and bandwidth",
    summary="HBM, L2 and SRAM: the bytes of one decode step, how fast they moved, and the roofline.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "Open the *Memory hierarchy* tab after a Generate run for the same table per kernel, next to the hardware "
        "counters recorded on an H200. Raise the batch in Generate: the weights are read once per step for every "
        "sequence in it, so bytes per token fall."
    ),
    estimate=base.generation_estimate,
    controls=base.generate_controls,
)
