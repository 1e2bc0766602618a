"""Pure functions from tidy DataFrames (explorer.metrics, explorer.bench) to plotly figures.

Every figure sets a constant uirevision so a live update keeps the zoom a person chose, and every
axis names its unit. A `run` column, when present, overlays runs for comparison.
"""

from __future__ import annotations

import math
import textwrap

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from ..measure import roofs
from .units import digits3, time_unit

KIND_COLORS = {
    "embedding": "#9e9e9e",
    "layer_norm": "#8e6c8a",
    "qkv/out proj": "#4c78a8",
    "attention": "#e45756",
    "decode attention": "#f58518",
    "decode layer": "#eeca3b",
    "decode step": "#d8b5a5",
    "ffn": "#54a24b",
    "lm_head": "#b279a2",
    "kv write": "#72b7b2",
    "rotary": "#ff9da6",
    "counters": "#7f7f7f",
}
PHASE_SYMBOLS = {"prefill": "diamond", "decode": "circle"}
# Plotly copies a figure's template whole into every figure it makes: a stock template costs about 15 ms a
# figure, a dozen per chart update, time a GPU run's tokens wait for. Every figure here uses this lean one
# instead: plotly_white's layout and its styles for the four kinds of trace drawn here, copied in 0.3 ms.
_WHITE = pio.templates["plotly_white"]
pio.templates["explorer"] = go.layout.Template(
    layout=_WHITE.layout,
    data=dict(bar=_WHITE.data.bar, scatter=_WHITE.data.scatter, heatmap=_WHITE.data.heatmap, pie=_WHITE.data.pie),
)
pio.templates.default = "explorer"
# The Generate tab sets two charts side by side in two thirds of the page, about 380 px each on a laptop,
# and plotly never wraps a title: a note under one is wrapped to what its small type fits in there.
NARROW_PX = 380
NOTE_CHARS = 64
# Under the plot: its tick labels and the x axis's title, then the legend, one row of entries at a time.
BELOW_PLOT_PX = 60
LEGEND_ROW_PX = 22


def _title(title: str, note: str, width: int = NARROW_PX) -> tuple[dict, int]:
    """The title with its note wrapped under it to `width` px, and the top margin that holds them: the lines hang
    from the figure's top edge (plotly would otherwise centre the first on a line of the margin and let the rest
    run down over the plot), each as tall as a line of the title's own size."""
    lines = textwrap.wrap(note, NOTE_CHARS * width // NARROW_PX) if note else []
    text = "<br>".join([title, *(f"<sup>{line}</sup>" for line in lines)])
    top = dict(y=1, yref="container", yanchor="top", pad=dict(t=16))
    return dict(text=text, x=0.01, **top), max(50, 36 + 22 * len(lines))


def _legend(fig: go.Figure, width: int) -> tuple[dict, int]:
    """A legend under the plot whose entries share one width (that of the longest name), so that they
    line up in columns, and how many rows it takes at `width` px. Plotly takes a legend's room from the
    plot, never adds it to the figure: the caller grows the figure by those rows."""
    names = [t.name or "" for t in fig.data if t.showlegend is not False]
    if len(names) < 2 and fig.layout.showlegend is not True:  # plotly shows no legend for one trace
        return {}, 0
    entry = 6 * max(map(len, names)) + 4  # text at 12 px, about 6 px a character
    columns = max(1, (width - 80) // (entry + 45))  # the plot's width; the symbol and gaps take 45 px
    return dict(entrywidth=entry, entrywidthmode="pixels"), math.ceil(len(names) / columns)


def layout(
    fig: go.Figure, title: str, x: str, y: str, note: str = "", plot_px: int = 280, width: int = NARROW_PX
) -> go.Figure:
    """Title, axes and legend; the figure as tall as the plot (`plot_px`) plus what sits above and under
    it, the legend laid out for a column `width` px wide, so that no number of entries squeezes the plot."""
    title, top = _title(title, note, width)
    legend, rows = _legend(fig, width)
    bottom = BELOW_PLOT_PX + LEGEND_ROW_PX * rows if rows else 40
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        uirevision="keep",  # live updates keep the user's zoom
        margin=dict(l=60, r=20, t=top, b=bottom),
        legend=dict(orientation="h", yanchor="top", y=-BELOW_PLOT_PX / plot_px, xanchor="left", x=0, **legend),
        height=top + plot_px + bottom,
        uniformtext=dict(minsize=10, mode="hide"),  # labels too small to read are dropped, not overlapped
    )
    if x in ("generated token", "sequence position"):  # whole tokens only, however few
        fig.update_xaxes(tickformat="d", dtick=None if fig.data and _max_x(fig) > 12 else 1)
    return fig


def _max_x(fig: go.Figure) -> float:
    return max((max(t.x) for t in fig.data if t.x is not None and len(t.x)), default=0)


# A line through one point draws nothing: a run this short (Generate's one new token, Compare's two) shows its
# points as well as the line between them.
FEW_POINTS = 16


def line_mode(points: int) -> str:
    return "lines+markers" if points < FEW_POINTS else "lines"


def _runs(frame: pd.DataFrame):
    if "run" in frame.columns:
        yield from frame.groupby("run", sort=False)
    else:
        yield "", frame


def latency_figure(steps: pd.DataFrame, note: str = "") -> go.Figure:
    """Per-token latency; the prefill (time to first token) marked apart from the decode steps."""
    unit, per = time_unit(steps.latency_ms)
    fig = go.Figure()
    for run, frame in _runs(steps):
        for phase, part in frame.groupby("phase", sort=False):
            fig.add_trace(
                go.Scatter(
                    x=part.step,
                    y=part.latency_ms / per,
                    mode="lines+markers" if phase == "decode" else "markers",
                    marker=dict(symbol=PHASE_SYMBOLS.get(phase, "circle"), size=10 if phase == "prefill" else 5),
                    name=f"{run} {phase}".strip(),
                )
            )
    return layout(fig, "Latency per token", "generated token", unit, note)


def traffic_figure(kernels: pd.DataFrame, note: str = "") -> go.Figure:
    """Modeled HBM traffic per step, stacked by kernel kind, under the line of what the SMs request
    (tile re-reads included): the gap between the two is what the L2 absorbs (one run)."""
    fig = go.Figure()
    if not kernels.empty:
        for kind, part in kernels.groupby("kind", sort=False):
            if part.hbm_mb.sum() > 0:  # not a launch's time-only row, nor counters that stay in L2
                fig.add_trace(go.Bar(x=part.step, y=part.hbm_mb, name=kind, marker_color=KIND_COLORS.get(kind)))
        issued = kernels.groupby("step", sort=True).modeled_mb.sum()
        fig.add_trace(
            go.Scatter(
                x=issued.index,
                y=issued.values,
                mode=line_mode(len(issued)),
                line=dict(color="black", dash="dot"),
                name="SM requests (tiles)",  # every tile load, re-reads included; short, to share a row
            )
        )
    fig.update_layout(barmode="stack")
    return layout(fig, "HBM traffic per step by kernel (modeled)", "generated token", "MB moved", note)


def bandwidth_figure(steps: pd.DataFrame, peak_gbs: float | None = None, note: str = "", width: int = 900) -> go.Figure:
    """Achieved bandwidth per step (modeled bytes over measured time) against the measured peak; `width`, the
    column's, to which the note is wrapped (the whole row on a GPU's page, half of it beside a CPU run)."""
    fig = go.Figure()
    for run, frame in _runs(steps):
        fig.add_trace(
            go.Scatter(x=frame.step, y=frame.achieved_gbs, mode="lines+markers", name=f"{run} achieved".strip())
        )
    if peak_gbs:
        fig.add_hline(y=peak_gbs, line_dash="dash", annotation_text=f"measured peak {peak_gbs:.0f} GB/s")
    fig.update_yaxes(rangemode="tozero")  # a share of the peak reads from zero
    return layout(fig, "Achieved bandwidth", "generated token", "GB/s", note, width=width)


def kv_figure(steps: pd.DataFrame, note: str = "") -> go.Figure:
    """KV cache used and allocated vs tokens; with the cache off, the context recomputed each step."""
    fig = go.Figure()
    for run, frame in _runs(steps):
        if frame.kv_allocated_mb.max() > 0:
            lines = [("kv_used_mb", None, "used"), ("kv_allocated_mb", "dot", "allocated")]
            if frame.peak_memory_mb.notna().any():
                lines.append(("peak_memory_mb", "dash", "GPU memory, peak so far"))
            for column, dash, label in lines:
                fig.add_trace(
                    go.Scatter(
                        x=frame.position,
                        y=frame[column],
                        mode=line_mode(len(frame)),
                        line_dash=dash,
                        name=f"{run} {label}".strip(),
                    )
                )
        else:
            fig.add_trace(
                go.Scatter(
                    x=frame.position,
                    y=frame.context_tokens,
                    mode="lines+markers",
                    yaxis="y2",
                    name=f"{run} cache off: tokens recomputed".strip(),
                )
            )
    cached = (steps.kv_allocated_mb > 0).any()
    fig.update_layout(
        yaxis2=dict(
            title="tokens recomputed per step", overlaying="y", side="right", showgrid=False, rangemode="tozero"
        )
    )
    fig.update_yaxes(rangemode="tozero")
    title = "KV cache growth" if cached else "Tokens recomputed per step (KV cache off)"
    return layout(fig, title, "sequence position", "MB" if cached else "", note)


ONE_LAUNCH = "one launch runs every operation, so its time is not theirs to split"


def kernel_share_figure(kernels: pd.DataFrame, note: str = "", clock: str = "device time") -> go.Figure:
    """Share of a decode step per kernel kind: measured time when profiled (`clock` names it: device time
    on a GPU, interpreter time on CPU), else modeled bytes, as also where one launch ran every operation."""
    stepped = (kernels.phase == "decode").any()  # a run of one token has only its prefill to show
    decode = kernels[kernels.phase == "decode"] if stepped else kernels
    timed = decode.kernel_ms > 0
    column, what = ("kernel_ms", clock) if timed.any() else ("hbm_mb", "modeled HBM bytes")
    if timed.any() and (decode.hbm_mb[timed] == 0).all() and (decode.hbm_mb > 0).any():
        # one launch ran every operation (the megakernel rung): its time is one piece, its bytes are split
        column, what = "hbm_mb", "modeled HBM bytes"
        note = "; ".join(n for n in (ONE_LAUNCH, note) if n)
    share = decode.groupby("kind", sort=False)[column].sum() if not decode.empty else pd.Series(dtype=float)
    share = share[share > 0]
    fig = go.Figure(
        go.Pie(
            labels=share.index,
            values=share.values,
            hole=0.45,
            sort=False,
            textposition="inside",
            marker=dict(colors=[KIND_COLORS.get(k) for k in share.index]),
        )
    )
    where = "a decode step" if stepped or kernels.empty else "the prefill"
    fig = layout(fig, f"Where {where} goes ({what})", "", "", note)
    # Nine kinds listed under a pie in a narrow column leave it a thumbnail: beside it, they leave it half.
    fig.update_layout(
        height=fig.layout.margin.t + 240,
        margin=dict(l=10, r=10, b=10),  # no axes to leave room for
        legend=dict(orientation="v", yanchor="middle", y=0.5, xanchor="left", x=1.02),
    )
    return fig


def sweep_heatmap(sweep: pd.DataFrame, x: str, y: str, value: str = "ms", note: str = "") -> go.Figure:
    """Best (lowest ms, or highest rate) of `value` over the other axes, per (x, y) tile pair; cells
    where no config is valid say why."""
    lower_is_better = value == "ms"
    # Times in the unit they call for (the interpreter's are seconds); rates as they are.
    unit, per = time_unit(sweep[sweep.valid].ms if "valid" in sweep else sweep.ms) if value == "ms" else (value, 1.0)
    xs = sorted(sweep[x].dropna().unique())
    ys = sorted(sweep[y].dropna().unique())
    valid_rows = sweep[sweep.valid] if "valid" in sweep else sweep
    valid_rows = valid_rows[valid_rows[value].notna()]
    best = None  # the (x, y) cell of the fastest config
    if not valid_rows.empty:
        at = valid_rows[value].idxmin() if lower_is_better else valid_rows[value].idxmax()
        best = (valid_rows.loc[at, x], valid_rows.loc[at, y])
    z, text, hover = [], [], []
    for yv in ys:
        row_z, row_t, row_h = [], [], []
        for xv in xs:
            cell = sweep[(sweep[x] == xv) & (sweep[y] == yv)]
            valid = cell[cell.valid] if "valid" in cell else cell
            if valid.empty or valid[value].isna().all():
                row_z.append(None)
                reason = cell.reason.iloc[0] if len(cell) and "reason" in cell else ""
                row_t.append("✗ " + _short(reason))
                row_h.append(reason)
            else:
                at = valid[value].idxmin() if lower_is_better else valid[value].idxmax()
                cell_best = valid.loc[at, value] / per
                row_z.append(cell_best)
                row_t.append(("★ " if best == (xv, yv) else "") + digits3(cell_best))
                row_h.append(_hover(valid.loc[at]))
        z.append(row_z)
        text.append(row_t)
        hover.append(row_h)
    fig = go.Figure(
        go.Heatmap(
            x=[str(v) for v in xs],
            y=[str(v) for v in ys],
            z=z,
            text=text,
            texttemplate="%{text}",
            customdata=hover,
            hovertemplate=f"{x}=%{{x}}, {y}=%{{y}}: %{{z:.3g}} {unit}<br>%{{customdata}}<extra></extra>",
            colorscale="Viridis",
            reversescale=lower_is_better,
            colorbar=dict(title=unit),
        )
    )
    if best is not None and best[0] in xs and best[1] in ys:  # the fastest config's cell, outlined
        i, j = xs.index(best[0]), ys.index(best[1])
        fig.add_shape(type="rect", x0=i - 0.5, x1=i + 0.5, y0=j - 0.5, y1=j + 0.5, line=dict(color="#e45756", width=3))
    title = f"Tile sweep: {unit} ({'lower' if lower_is_better else 'higher'} is better; ★ the fastest)"
    return layout(fig, title, x, y, note, plot_px=320, width=900)


TILE_FIELDS = ("block_m", "block_n", "block_k", "split_k", "group_m", "num_warps", "num_stages")


def _hover(row: pd.Series) -> str:
    """The fastest config of a cell, and where it sat on the SMs where the sweep recorded that."""
    tiles = ", ".join(f"{f}={int(row[f])}" for f in TILE_FIELDS if f in row and pd.notna(row[f]))
    if "per_sm" not in row or pd.isna(row.get("per_sm")):
        return tiles
    return (
        f"{tiles}<br>{int(row['registers'])} registers a thread, {int(row['per_sm'])} programs per SM "
        f"(limited by {row['limiter']}), {row['waves']:.2f} waves"
    )


def _short(reason: str) -> str:
    if "shared memory" in reason:
        return "shared memory"
    if "smaller than the row width" in reason:
        return "row does not fit"
    return reason[:24]


def compare_figure(seq: pd.DataFrame, note: str = "") -> go.Figure:
    """Decode latency against sequence position for every (backend, cache, prompt) run of a sweep:
    O(n) growth with the cache on, O(n^2) total work with it off."""
    fig = go.Figure()
    unit, per = time_unit(seq[seq.phase == "decode"].latency_ms, log=True)
    keys = [k for k in ("backend", "cache", "launch_mode", "prompt_tokens") if k in seq.columns]
    for key, part in seq.groupby(keys, sort=False):
        values = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        label = " · ".join(_short_run(k, v) for k, v in values.items())
        part = part[part.phase == "decode"]
        fig.add_trace(go.Scatter(x=part.position, y=part.latency_ms / per, mode=line_mode(len(part)), name=label))
    # Runs differ by 10-100x: on a linear axis the fast ones lie flat at zero.
    fig.update_yaxes(type="log", exponentformat="none", dtick="D2")  # 1, 2, 5, 10: not every digit between
    return layout(
        fig, "Decode latency vs sequence position", "sequence position", f"{unit} per token (log)", note, width=650
    )


def _short_run(key: str, value) -> str:
    if key == "prompt_tokens":
        return f"prompt {int(value)}"  # a recording read back from JSON holds 8.0
    return {"cache": f"cache {value}", "launch_mode": str(value)}.get(key, str(value))


def fusion_figure(lessons: pd.DataFrame, note: str = "") -> go.Figure:
    """Bytes of each fused kernel next to its unfused alternative, with the floor marked."""
    fig = go.Figure()
    for variant, part in lessons.groupby("variant", sort=False):
        fig.add_trace(go.Bar(x=part.lesson, y=part.mb, name=variant, text=[digits3(v) for v in part.mb]))
    floors = lessons.groupby("lesson", sort=False).floor_mb.min()
    fig.add_trace(
        go.Scatter(
            x=floors.index,
            y=floors.values,
            mode="markers",
            marker_symbol="line-ew-open",
            marker_size=40,
            name="floor: inputs once, outputs once",
        )
    )
    fig.update_layout(barmode="group")
    return layout(fig, "What fusion saves (one layer, modeled)", "", "MB moved", note, width=650)


def ladder_figure(ladder: pd.DataFrame, note: str = "", gpu_ms=None, gpu_title: str = "") -> go.Figure:
    """One decode step per rung of the fusion ladder (explorer.measure.ladder): launches, bytes at both
    levels and time, side by side, so fewer launches and fewer bytes can be read against the time. On CPU,
    `gpu_ms` (per rung) puts a GPU's time for the same step beside the interpreter's."""
    from plotly.subplots import make_subplots

    gpu = ladder.kernels.notna().any() if "kernels" in ladder else False
    launches = ladder.kernels if gpu else ladder.launches_modeled
    launch_title = "kernels per step (torch.profiler)" if gpu else "launches per step (modeled: no GPU)"
    unit, per = time_unit(ladder.step_ms)
    clock = f"{unit} per step " + ("(CUDA-graph replay)" if gpu else "(interpreter, CPU)")
    titles = [launch_title, "MB per step (modeled)", clock]
    if gpu_ms is not None:
        gpu_unit, gpu_per = time_unit(gpu_ms)
        titles.insert(2, f"{gpu_unit} per step: {gpu_title}")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    names = list(ladder.rung)
    fig.add_trace(go.Bar(x=names, y=launches, marker_color="#4c78a8", name="launches", showlegend=False), 1, 1)
    fig.add_trace(go.Bar(x=names, y=ladder.hbm_mb, marker_color="#54a24b", name="HBM"), 1, 2)
    fig.add_trace(go.Bar(x=names, y=ladder.l2_mb, marker_color="#9ecae9", name="SM requests"), 1, 2)
    if gpu_ms is not None:
        bar = go.Bar(x=names, y=pd.Series(gpu_ms).to_numpy() / gpu_per, marker_color="#b279a2", showlegend=False)
        fig.add_trace(bar, 1, 3)
    step = go.Bar(x=names, y=ladder.step_ms / per, marker_color="#e45756", name="step", showlegend=False)
    fig.add_trace(step, 1, len(titles))
    context = int(ladder.context.iloc[0]) if len(ladder) else 0
    layout(fig, f"The fusion ladder: one decode step at context {context}", "", "", note, plot_px=300, width=900)
    # The subplots' titles sit just over their plots, in the top margin, under the figure's title and note.
    fig.update_layout(barmode="group", margin_t=fig.layout.margin.t + 24, height=fig.layout.height + 24)
    return fig


# FLOP rates in the unit that keeps the largest under 1000: a GPU's in TFLOP/s, the interpreter's, which are
# 1e-7 to 1e-5 TFLOP/s, in MFLOP/s (where plotly's own ticks would read 100n, 1µ, 10µ).
FLOP_RATES = (("TFLOP/s", 1.0), ("GFLOP/s", 1e-3), ("MFLOP/s", 1e-6), ("kFLOP/s", 1e-9))


def roofline_figure(points: pd.DataFrame, peaks, note: str = "") -> go.Figure:
    """Achieved FLOP rate against arithmetic intensity per kernel kind, under the measured ceilings (`peaks`, a
    metrics.Peaks or None), whose dtype (tensor cores or not) and ridge the title names. Kinds with no
    arithmetic (the cache write) have no place on log axes and are left out. Without ceilings (a CPU, where the
    rates are the interpreter's) the chart says it is no roofline."""
    fig = go.Figure()
    points = points[(points.intensity > 0) & (points.achieved_tflops > 0)] if not points.empty else points
    peak_tflops, peak_gbs = (peaks.tflops, peaks.bandwidth_gbs) if peaks else (None, None)
    roof = bool(peak_tflops and peak_gbs)
    top = max([*points.achieved_tflops, *([peak_tflops] if roof else [])], default=1.0)
    unit, per = next(((u, p) for u, p in FLOP_RATES if top >= p), FLOP_RATES[-1])
    if not points.empty:
        lo, hi = points.intensity.min() / 2, points.intensity.max() * 2
        if roof:
            hi = max(hi, roofs.ridge(peak_tflops, peak_gbs) * 4)  # past the ridge, where the roof turns flat
            xs = [lo * (hi / lo) ** (i / 50) for i in range(51)]
            ceiling = [min(peak_tflops, x * peak_gbs / 1e3) / per for x in xs]
            dashed = dict(color="black", dash="dash")
            fig.add_trace(go.Scatter(x=xs, y=ceiling, mode="lines", line=dashed, name=f"ceiling, {peaks.roof}"))
        fig.update_xaxes(range=[math.log10(lo), math.log10(hi)])
    for (phase, kind), part in points.groupby(["phase", "kind"], sort=False):
        fig.add_trace(
            go.Scatter(
                x=part.intensity,
                y=part.achieved_tflops / per,
                mode="markers",
                name=f"{kind} ({phase})",
                marker=dict(size=12, color=KIND_COLORS.get(kind), symbol=PHASE_SYMBOLS.get(phase)),
            )
        )
    fig.update_xaxes(type="log", exponentformat="none", dtick="D2")  # 1, 2, 5, 10: not every digit between
    fig.update_yaxes(type="log", exponentformat="none")
    if roof:
        title = (
            f"Roofline, {peaks.roof}: {peak_tflops:,.0f} TFLOP/s and {peak_gbs:,.0f} GB/s measured, "
            f"ridge {roofs.ridge(peak_tflops, peak_gbs):,.0f} FLOP/byte"
        )
        return layout(fig, title, "arithmetic intensity (FLOP/byte)", unit, note, width=900)
    cpu = (
        "No GPU here, so no ceiling: each rate is the Triton interpreter running a kernel in Python, "
        "far below any GPU's."
    )
    title = "FLOP rate by arithmetic intensity (CPU: no roofline)"
    return layout(fig, title, "arithmetic intensity (FLOP/byte)", unit, f"{cpu} {note}".strip(), width=900)
