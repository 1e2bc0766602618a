"""A CPU run's charts with the GPU's answer beside them (counterpart.py): the GPU first, since that is what
the lesson is about, and the interpreter's own clock after it, named for what it measures: Python
running each program of every kernel, not the speed of any GPU."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..measure import metrics
from . import plots
from .counterpart import Counterpart

INTERPRETER = "this CPU: Python running each program (the Triton interpreter), not GPU time"
PALETTE = ("#4c78a8", "#e45756", "#54a24b", "#f58518", "#b279a2", "#72b7b2", "#9d755d", "#eeca3b", "#ff9da6", "#bab0ac")


def side_by_side(left: go.Figure, right: go.Figure, titles: tuple[str, str], note: str) -> go.Figure:
    """Two figures' traces as two panels, each keeping its axes' titles and types; a trace named as one
    already shown is not listed twice."""
    title = left.layout.title.text.split("<br>")[0]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.14)
    colors: dict[str, str] = {}  # a series keeps its colour in both panels
    for col, part in ((1, left), (2, right)):
        for trace in part.data:
            trace.showlegend = trace.name not in colors
            colors.setdefault(trace.name, PALETTE[len(colors) % len(PALETTE)])
            if trace.type == "scatter":
                trace.line.color = trace.marker.color = colors[trace.name]
            fig.add_trace(trace, 1, col)
        fig.update_xaxes(title_text=part.layout.xaxis.title.text, type=part.layout.xaxis.type, row=1, col=col)
        fig.update_yaxes(title_text=part.layout.yaxis.title.text, type=part.layout.yaxis.type, row=1, col=col)
    plots.layout(fig, title, left.layout.xaxis.title.text or "", left.layout.yaxis.title.text or "", note, width=900)
    # The title and its note from the top down, and the panels' titles under them: plotly would centre the
    # title in the top margin, over the panels' titles.
    fig.update_layout(
        title=dict(yref="container", y=1, yanchor="top", pad=dict(t=16)),
        margin_t=fig.layout.margin.t + 28,
        height=fig.layout.height + 28,
    )
    return fig


def short(gpu: Counterpart) -> str:
    return f"{gpu.gpu}, {'recorded' if gpu.recorded else 'modeled'}"


def latency(steps: pd.DataFrame, gpu: Counterpart) -> go.Figure:
    left = plots.latency_figure(gpu.tables["steps"])
    right = plots.latency_figure(steps)
    return side_by_side(left, right, (short(gpu), "this CPU (interpreter)"), f"{gpu.label}. Right: {INTERPRETER}.")


def share(gpu: Counterpart) -> go.Figure:
    name = gpu.gpu.removeprefix("NVIDIA ")  # the chart is narrow: its title must fit in one line
    clock = f"{name}, recorded" if gpu.recorded else f"{name}, modeled"
    note = f"{gpu.label}. This CPU's time per kernel is in the Memory hierarchy tab."
    return plots.kernel_share_figure(gpu.tables["kernels"], note, clock)


def bandwidth(gpu: Counterpart) -> go.Figure:
    note = f"{gpu.label}. This CPU moves no bytes through HBM: the interpreter has none to measure."
    if not gpu.recorded:
        note = f"{gpu.label}. No achieved bandwidth here: it needs a measured time, and this setting's is modeled."
    return plots.bandwidth_figure(gpu.tables["steps"], gpu.bandwidth_gbs, note, width=plots.NARROW_PX)


def roofline(gpu: Counterpart, profiled: str = "") -> go.Figure:
    peaks = metrics.Peaks(gpu.bandwidth_gbs, gpu.tflops, gpu.label, gpu.tflops_dtype)
    points = metrics.roofline(gpu.tables["kernels"], peaks)
    note = gpu.label + ("" if gpu.recorded else ": each point on the roof by construction (a modeled time)")
    return plots.roofline_figure(points, peaks, "; ".join(n for n in (note, profiled) if n))


def compare(frame: pd.DataFrame, gpu: Counterpart, status: str) -> go.Figure:
    left = plots.compare_figure(gpu.tables["compare"])
    right = plots.compare_figure(frame)
    note = f"{gpu.label}. Right: {INTERPRETER}. {status}".strip()
    return side_by_side(left, right, (short(gpu), "this CPU (interpreter)"), note)
