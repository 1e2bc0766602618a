"""The timeline of one decode step on the SMs (explorer.measure.timeline): each program as a bar on the SM that ran
it, coloured by kernel, with the step's idle share (SM-time inside no program) in the title. A pure function of
the intervals."""

from __future__ import annotations

import plotly.graph_objects as go

from ..measure.timeline import idle_share
from .plots import layout

PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"]


def timeline_figure(frame, sms: int, note: str = "") -> go.Figure:
    """SMs (y) against microseconds from the step's first program (x); one trace per kernel, its programs as
    line segments (one WebGL trace draws thousands)."""
    fig = go.Figure()
    for i, (kernel, on) in enumerate(frame.groupby("kernel", sort=False)):
        xs, ys, hover = [], [], []
        for r in on.itertuples(index=False):
            a, b = r.start_ns / 1e3, r.end_ns / 1e3
            text = f"{r.operation or kernel}: program {r.program} on SM {r.sm}, {a:.2f}-{b:.2f} us"
            xs += [a, b, None]
            ys += [r.sm, r.sm, None]
            hover += [text, text, None]
        fig.add_trace(
            go.Scattergl(
                x=xs,
                y=ys,
                mode="lines",
                line=dict(width=4, color=PALETTE[i % len(PALETTE)]),
                name=kernel,
                text=hover,
                hovertemplate="%{text}<extra></extra>",
            )
        )
    idle = idle_share(frame, sms)
    launches = frame.launch.nunique() if len(frame) else 0
    span = (frame.end_ns.max() - frame.start_ns.min()) / 1e3 if len(frame) else 0.0
    title = f"One decode step on {sms} SMs: {launches} launches in {span:.1f} us, SMs idle {idle:.0%} of it"
    layout(fig, title, "microseconds from the step's first program", "SM", note, plot_px=360, width=900)
    fig.update_yaxes(range=[-1, sms])
    return fig
