"""Lesson 7: fusion, the ladder. The same decode step with every operation its own kernel, with the
bias, GELU and residual add in the matmul's epilogue, with the LayerNorms and the cache write fused
too (fewer launches, fewer round trips of activations through memory), with those kernels launched
so that each starts while the one before finishes (overlap), with each block in one launch (persistent), and with
the whole step in one launch (megakernel)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kernels.config import overlaps_launches

from ...measure.ladder import ladder_rows
from .. import estimate, units
from . import base

RUNG_NAMES = {
    "none": "no fusion",
    "epilogue": "epilogue",
    "decode": "decode",
    "overlap": "overlap",
    "persistent": "persistent",
    "megakernel": "megakernel",
    "torch": "PyTorch",
}


def settings(size: str) -> dict:
    if size == "gpu":
        return dict(model=base.GPT2_SHAPE, dtype="bfloat16", backend="triton", context=1000, replays=100)
    return dict(model="bundled", dtype="float32", backend="triton", context=16, replays=1)


def measure(s: dict) -> tuple[dict, dict]:
    model = base.model(s)
    rows = pd.DataFrame(ladder_rows(model, context=s["context"], replays=s["replays"]))
    counted = rows.kernels.notna().all()
    rows["launches"] = rows.kernels if counted else rows.launches_modeled
    by = rows.set_index("rung")
    facts = dict(counted=bool(counted), context=s["context"], pdl=overlaps_launches(model.device))
    for rung in by.index:
        facts |= {
            f"{rung}_ms": float(by.step_ms[rung]),
            f"{rung}_launches": None if pd.isna(by.launches[rung]) else int(by.launches[rung]),
            f"{rung}_hbm_mb": float(by.hbm_mb[rung]),
            f"{rung}_l2_mb": float(by.l2_mb[rung]),
        }
    return facts, {"ladder": rows[["rung", "launches", "hbm_mb", "l2_mb", "step_ms"]]}


def explain(r) -> str:
    f = r.facts
    how = (
        "GPU kernels (counted by torch.profiler)"
        if f["counted"]
        else "launches (modeled: the interpreter runs no GPU kernels)"
    )
    text = (
        f"One decode step at context {f['context']}, rung by rung. With **no fusion** every operation is its own "
        f"kernel: {f['none_launches']} {how}, {base.mb(f['none_hbm_mb'])} to and from HBM, "
        f"**{base.ms(f['none_ms'])}**. Moving the bias, GELU and residual add into the matmul's **epilogue** "
        f"leaves {f['epilogue_launches']} and {base.mb(f['epilogue_hbm_mb'])}: each of those was a separate pass "
        f"that read and wrote the whole activation; the step takes **{base.ms(f['epilogue_ms'])}**. The **decode "
        f"step** rung folds each LayerNorm into the projection after it, writes the new keys and values into the "
        f"cache from c_attn's epilogue, and lets the last split of each split-K launch add the partial sums itself: "
        f"{f['decode_launches']} launches, {base.mb(f['decode_hbm_mb'])}, **{base.ms(f['decode_ms'])}**: "
        f"{base.num(f['none_ms'] / f['decode_ms'])}× the speed of the unfused step."
    )
    if "overlap_ms" in f:  # recordings from before the overlap rung have no such row
        if f["pdl"]:
            text += (
                f" The **overlap** rung launches the same {f['overlap_launches']} kernels with programmatic dependent "
                "launch: each starts while the one before it finishes and streams its weights in before it waits "
                f"for that kernel's output, so the memory system no longer idles between them: "
                f"**{base.ms(f['overlap_ms'])}**, {base.num(f['none_ms'] / f['overlap_ms'])}× the unfused step."
            )
        else:
            text += (
                " The **overlap** rung needs programmatic dependent launch (compute capability 9.0, Hopper, or "
                f"later), which this device lacks: it runs as the decode rung here (**{base.ms(f['overlap_ms'])}**)."
            )
    if "persistent_ms" in f:  # recordings from before the persistent rung have no such row
        text += (
            f" The **persistent** rung runs each block in one launch ({f['persistent_launches']} per step): one "
            "program per SM takes the five stages in turn, and the programs wait for each other at counters in "
            "device memory where the other rungs wait at kernel boundaries; a waiting program's next weights are "
            f"already on their way: **{base.ms(f['persistent_ms'])}**."
        )
        if f["persistent_ms"] > f["overlap_ms"] and r.device != "CPU":  # the reasons are a GPU's
            text += (
                " Fewer launches did not make it faster: one program per SM keeps fewer bytes in flight than the "
                "decode rung's hundreds of programs per kernel, and every stage ends at a barrier that each "
                "program waits at, where under overlap only the next kernel's wait stands between stages."
            )
    if "megakernel_ms" in f:  # recordings from before the megakernel rung have no such row
        n = f["megakernel_launches"]
        launches = {None: "", 1: " (one launch a step)"}.get(
            n, f" ({n} launches a step, the cache's length update too)"
        )
        text += (
            f" The **megakernel** rung runs every operation of the step in one kernel{launches}: every operation "
            "a list of tasks taken in turn by one program per SM, each task waiting at a counter only for the tiles "
            "it reads (an attention head for the c_attn tiles holding its q, k and v), its weights already loaded: "
            f"**{base.ms(f['megakernel_ms'])}**."
        )
        if f["megakernel_ms"] > f["overlap_ms"] and r.device != "CPU":
            text += (
                f" That is {base.num(f['megakernel_ms'] / f['overlap_ms'])}× overlap's time: waiting at counters "
                "did not yet beat kernels that overlap, since most operations still wait for every tile of the one "
                "before (a norm needs whole rows) and one program per SM keeps few bytes in flight."
            )
    saved = f["none_hbm_mb"] - f["decode_hbm_mb"]
    torch_launches = "" if f["torch_launches"] is None else f"{f['torch_launches']} launches, "
    text += (
        f" The bytes saved are few ({base.mb(saved)}): in a decode step the weights dominate, and every rung reads "
        "each weight once. What fusion removes here is mostly launches, each a gap in which the memory system "
        f"idles. PyTorch on the same step: {torch_launches}**{base.ms(f['torch_ms'])}**."
    )
    if r.device == "CPU":
        text += (
            " These times are the Triton interpreter running each kernel in Python: fewer launches is fewer "
            "Python calls here, not fewer gaps on a GPU."
        )
    return text


def figure(r) -> go.Figure:
    ladder = r.tables["ladder"]
    names = [RUNG_NAMES.get(n, n) for n in ladder.rung]
    unit, per = units.time_unit(ladder.step_ms)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=ladder.step_ms / per, marker_color="#e45756", name="time per step", yaxis="y"))
    fig.add_trace(
        go.Scatter(
            x=names, y=ladder.launches, mode="lines+markers", name="launches per step", yaxis="y2", line_color="#4c78a8"
        )
    )
    fig.update_layout(
        yaxis=dict(title=f"{unit} per step", rangemode="tozero"),
        # Its own round ticks: lined up with the time axis's gridlines they read 20.1, 40.2, 60.3.
        yaxis2=dict(
            title="launches", overlaying="y", side="right", rangemode="tozero", showgrid=False, tickmode="auto"
        ),
    )
    return base.big(fig, f"One decode step per rung, context {r.facts['context']}", r)


def _estimate(s: dict) -> float:
    # A decode step per Triton rung (the torch backend's costs next to nothing): the ladder's own estimate.
    device = base.models.device().type
    units = estimate.ladder_units(s["model"], 1, device, rungs=len(RUNG_NAMES) - 1)
    return estimate.seconds(device, s["backend"], units)


LESSON = base.Lesson(
    name="fusion",
    title="Fusion: the ladder",
    summary="The same decode step with fewer, fuller kernels: what each rung of fusion saves.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "In Generate, pick *fusion* none, epilogue, decode, overlap, persistent and megakernel in turn with the same "
        "prompt and "
        "compare the summary's decode step and kernel count; the *traffic* chart shows where the separate passes' "
        "bytes went. *Compare* → *Climb the fusion ladder* runs this at your model and batch."
    ),
    estimate=_estimate,
    controls=base.model_controls,
)
