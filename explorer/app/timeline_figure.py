"""The timeline of one decode step on the SMs (explorer.measure.timeline): each program as a bar on the SM that ran
it, coloured by kernel, with the step's idle share (SM-time inside no program) in the title. A pure function of
the intervals."""

from __future__ import annotations

import plotly.graph_objects as go

from ..measure.timeline import idle_share
from .plots import layout

PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d", "#bab0ac"]


# What each of the megakernel's operations waits for before its tasks can start (kernels.ops.decode_step)
WAITS_FOR = {
    "embedding": "nothing",
    "c_attn": "every task of the operation before (a norm needs whole rows)",
    "attention": "the c_attn tiles of its own key/value head",
    "c_proj": "every attention item of the layer",
    "c_fc": "every c_proj task (a norm needs whole rows)",
    "mlp.c_proj": "every c_fc task (all of its input's columns)",
    "lm_head": "the last layer's mlp.c_proj tasks (a norm needs whole rows)",
}
WAITING = "#c7c7c7"


def timeline_figure(frame, sms: int, note: str = "", tasks=None) -> go.Figure:
    """SMs (y) against microseconds from the step's first program (x); one trace per kernel, its programs as
    line segments (one WebGL trace draws thousands). Where a launch's tasks stamped themselves (tasks: the
    megakernel's, explorer.measure.timeline.task_intervals), its programs are drawn as their tasks instead: each
    task's wait in grey, its work coloured by operation, so a bar that looks busy says what it waited for."""
    fig = go.Figure()
    traced = set(tasks.launch) if tasks is not None and len(tasks) else set()
    for i, (kernel, on) in enumerate(frame[~frame.launch.isin(traced)].groupby("kernel", sort=False)):
        text = lambda r, a, b, k=kernel: f"{r.operation or k}: program {r.program} on SM {r.sm}, {a:.2f}-{b:.2f} us"
        fig.add_trace(_segments(on, "start_ns", "end_ns", text, kernel, PALETTE[i % len(PALETTE)]))
    waiting = _tasks(fig, tasks, frame[frame.launch.isin(traced)]) if traced else None
    idle = idle_share(frame, sms)
    launches = frame.launch.nunique() if len(frame) else 0
    span = (frame.end_ns.max() - frame.start_ns.min()) / 1e3 if len(frame) else 0.0
    title = f"One decode step on {sms} SMs: {launches} launches in {span:.1f} us, SMs idle {idle:.0%} of it"
    if waiting is not None:
        title += f"; tasks waiting {waiting:.0%} of their programs' time"
    layout(fig, title, "microseconds from the step's first program", "SM", note, plot_px=360, width=900)
    fig.update_yaxes(range=[-1, sms])
    return fig


def _tasks(fig: go.Figure, tasks, programs) -> float:
    """Each task as two segments on its SM: its wait (start to ready) in grey, its work (ready to end) in its
    operation's colour. Returns the waits' share of the time of `programs`, the traced launches' programs."""

    def waits(t, a, b):
        return (
            f"{_name(t)}, task {t.task} on program {t.program}, SM {t.sm}: waiting {b - a:.2f} us for "
            f"{WAITS_FOR.get(t.operation, 'the tasks before it')}"
        )

    def works(t, a, b):
        return f"{_name(t)}, task {t.task} on program {t.program}, SM {t.sm}: working {a:.2f}-{b:.2f} us"

    fig.add_trace(_segments(tasks, "start_ns", "ready_ns", waits, "waiting", WAITING))
    for i, (operation, on) in enumerate(tasks.groupby("operation", sort=False)):
        fig.add_trace(_segments(on, "ready_ns", "end_ns", works, operation, PALETTE[(i + 1) % len(PALETTE)]))
    held = float((programs.end_ns - programs.start_ns).sum())
    return float((tasks.ready_ns - tasks.start_ns).sum()) / held if held > 0 else 0.0


def _name(t) -> str:
    return t.operation if t.layer < 0 else f"{t.operation} (layer {t.layer})"


def _segments(rows, start: str, end: str, text, name: str, color: str) -> go.Scattergl:
    """One trace: each row a line segment from its `start` to its `end` column (ns, drawn in us) on its SM,
    hovering text(row, a, b)."""
    xs, ys, hover = [], [], []
    for r in rows.itertuples(index=False):
        a, b = getattr(r, start) / 1e3, getattr(r, end) / 1e3
        label = text(r, a, b)
        xs += [a, b, None]
        ys += [r.sm, r.sm, None]
        hover += [label, label, None]
    return go.Scattergl(
        x=xs,
        y=ys,
        mode="lines",
        line=dict(width=4, color=color),
        name=name,
        text=hover,
        hovertemplate="%{text}<extra></extra>",
    )
