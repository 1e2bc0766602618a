"""Lesson 6: prefill and decode. The prompt goes through in one pass, many tokens per weight read
(compute-bound); each new token goes through alone, one token per weight read (memory-bound). Arithmetic
intensity, FLOP per byte, says which."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ...measure import metrics, roofs
from ...measure.profile import profile_run
from .. import units
from . import base


def settings(size: str) -> dict:
    if size == "gpu":
        return dict(
            model=base.GPT2_SHAPE, dtype="bfloat16", backend="triton", prompt_tokens=512, new_tokens=64, graph=True
        )
    # PyTorch on CPU: its time is arithmetic and memory, as on a GPU; the interpreter's is Python per tile.
    return dict(model="bundled", dtype="float32", backend="torch", prompt_tokens=256, new_tokens=32)


def measure(s: dict) -> tuple[dict, dict]:
    model = base.model(s)
    steps = base.generation(model, s)
    # The prefill and one decode step again, kernel by kernel with launch overhead kept out: their device time.
    ids = base.prompt(model, s["prompt_tokens"])
    profiled = profile_run(model, [ids], steps, cache=True, backend=s["backend"], samples=1)
    kernel_ms = profiled.groupby("phase").kernel_ms.sum()
    frame = metrics.step_frame(steps)
    summary = metrics.summary(steps, base.peaks())
    prefill, decode = frame[frame.phase == "prefill"].iloc[0], frame[frame.phase == "decode"]
    middle = decode.iloc[len(decode) // 2]  # one decode step for the bytes and FLOPs
    p = base.peaks()
    facts = dict(
        prompt=s["prompt_tokens"],
        prefill_ms=summary["ttft_ms"],
        decode_ms=summary["step_ms_p50"],
        prefill_gflop=float(prefill.modeled_gflop),
        prefill_mb=float(prefill.hbm_mb),
        decode_gflop=float(middle.modeled_gflop),
        decode_mb=float(middle.hbm_mb),
        decode_position=int(middle.position),
        prefill_kernel_ms=float(kernel_ms["prefill"]),
        decode_kernel_ms=float(kernel_ms["decode"]),
        peak_tflops=p.tflops if p else None,
        peak_gbs=p.bandwidth_gbs if p else None,
        peak_dtype=p.dtype if p else None,
    )
    facts["prefill_per_token_ms"] = facts["prefill_ms"] / facts["prompt"]
    for phase in ("prefill", "decode"):
        facts[f"{phase}_intensity"] = facts[f"{phase}_gflop"] * 1e9 / (facts[f"{phase}_mb"] * metrics.MB)
        facts[f"{phase}_tflops"] = facts[f"{phase}_gflop"] / facts[f"{phase}_kernel_ms"]
    table = frame[["step", "phase", "position", "context_tokens", "latency_ms", "modeled_gflop", "hbm_mb"]]
    return facts, {"steps": table}


def explain(r) -> str:
    f = r.facts
    text = (
        f"The **prefill** ran the {f['prompt']}-token prompt in one pass: **{base.ms(f['prefill_ms'])}**, "
        f"{base.ms(f['prefill_per_token_ms'])} per token. Each **decode** step ran one token: "
        f"**{base.ms(f['decode_ms'])}** (median). Per token, the prefill was "
        f"{cheaper(f['decode_ms'], f['prefill_per_token_ms'])}.\n\n"
        f"Why: the prefill did {base.num(f['prefill_gflop'])} GFLOP on {base.mb(f['prefill_mb'])} of HBM traffic, "
        f"**{base.num(f['prefill_intensity'])} FLOP per byte**: each weight read serves all {f['prompt']} tokens. "
        f"A decode step (position {f['decode_position']}) did {base.num(f['decode_gflop'] * 1e3)} MFLOP on "
        f"{base.mb(f['decode_mb'])}, **{base.num(f['decode_intensity'])} FLOP per byte**: each weight read serves "
        f"one token. {base.timed_alone(r)}, the prefill's kernels took "
        f"{base.ms(f['prefill_kernel_ms'])}, **{base.num(f['prefill_tflops'])} TFLOP/s**, and a decode step's "
        f"{base.ms(f['decode_kernel_ms'])}, **{base.num(f['decode_tflops'])} TFLOP/s**. "
    )
    if f.get("peak_tflops"):
        ridge = roofs.ridge(f["peak_tflops"], f["peak_gbs"])
        side = "above" if f["prefill_intensity"] > ridge else "below"
        text += (
            f"This GPU's ridge, {base.num(f['peak_tflops'])} TFLOP/s ({base.roof(f)}) over {base.num(f['peak_gbs'])} "
            f"GB/s (both measured), is at **{base.num(ridge)} FLOP per byte**: the prefill sits {side} it, decode far "
            "below, so decode is bound by memory and batching (more tokens per weight read) is how it gets faster."
        )
    else:
        text += (
            "Bytes are the kernels' traffic models; times are PyTorch on this CPU, on one thread. Batching (more "
            "tokens per weight read) is how decode gets faster."
        )
    return text


def cheaper(decode_ms: float, prefill_per_token_ms: float) -> str:
    """'**7.2× cheaper**', or dearer where the recording says so."""
    if prefill_per_token_ms <= decode_ms:
        return f"**{base.num(decode_ms / prefill_per_token_ms)}× cheaper**"
    return f"**{base.num(prefill_per_token_ms / decode_ms)}× dearer**"


def figure(r) -> go.Figure:
    f = r.facts
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.2)
    names, colors = ["prefill", "decode"], ["#4c78a8", "#f58518"]
    unit, per = units.time_unit([f["prefill_per_token_ms"], f["decode_ms"]])
    titles = {1: f"{unit} per token", 2: "FLOP per HBM byte"}
    for col, values in (
        (1, [f["prefill_per_token_ms"] / per, f["decode_ms"] / per]),
        (2, [f["prefill_intensity"], f["decode_intensity"]]),
    ):
        labels = [base.num(v) for v in values]
        # A tall bar's label inside its top, where the ridge's line cannot cross it; a short bar's above it.
        bars = go.Bar(x=names, y=values, marker_color=colors, showlegend=False, text=labels, textposition="auto")
        fig.add_trace(bars, 1, col)
        fig.update_yaxes(range=[0, 1.25 * max(values)], title_text=titles[col], row=1, col=col)
    if f.get("peak_tflops"):
        ridge = roofs.ridge(f["peak_tflops"], f["peak_gbs"])
        fig.add_hline(y=ridge, line_dash="dash", row=1, col=2, annotation_text=f"ridge {base.num(ridge)}")
        fig.update_yaxes(range=[0, 1.25 * max(ridge, f["prefill_intensity"])], row=1, col=2)
    return base.big(fig, "Prefill vs decode, per token", r)


LESSON = base.Lesson(
    name="prefill-decode",
    title="Prefill and decode",
    summary="The prompt in one pass against one token a step: compute-bound against memory-bound.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "In Generate, raise *prompt length in tokens* and watch the diamond (time to first token) rise while decode "
        "steps stay put; raise the batch and watch decode's time per token fall. The *Memory hierarchy* tab's roofline "
        "places each kernel under the measured ceilings."
    ),
    estimate=lambda s: base.generation_estimate(s, profiled=2),
    controls=base.generate_controls,
)
