"""The picture of a prefill's tiles (explorer.measure.tile_reads): which program computes each output tile of the
matmul, in what order, and which key tiles each query tile of the attention reads, with how many times each
input byte is requested from L2. A pure function of the walks to one plotly figure."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..measure.tile_reads import MASKED, WHOLE, AttentionReads, LinearReads
from .plots import layout

KIND_NAMES = {0: "not read", WHOLE: "read whole", MASKED: "read, masked"}
KIND_SCALE = [
    [0, "#f2f2f2"],
    [0.33, "#f2f2f2"],
    [0.34, "#4c78a8"],
    [0.66, "#4c78a8"],
    [0.67, "#f58518"],
    [1, "#f58518"],
]
TEXT_CELLS = 400  # numbers in the cells up to this many tiles; past it they would not be readable


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} KB"


def linear_trace(r: LinearReads, itemsize: int) -> tuple[go.Heatmap, str]:
    tiles_m, tiles_n = len(r.order), len(r.order[0])
    hover = [
        [
            f"output tile ({m}, {n}): program {r.program[m][n]}, step {r.order[m][n]} of the walk<br>"
            f"x rows {m * r.block_m}-{min((m + 1) * r.block_m, r.rows) - 1}, weight rows "
            f"{n * r.block_n}-{min((n + 1) * r.block_n, r.out) - 1}, each over {r.inp} columns"
            for n in range(tiles_n)
        ]
        for m in range(tiles_m)
    ]
    trace = go.Heatmap(
        z=r.order,
        text=r.program if tiles_m * tiles_n <= TEXT_CELLS else None,
        texttemplate="%{text}" if tiles_m * tiles_n <= TEXT_CELLS else None,
        customdata=hover,
        hovertemplate="%{customdata}<extra></extra>",
        colorscale="Blues",
        reversescale=True,
        showscale=False,
    )
    x_times = sum(r.x_requests) / r.rows
    w_times = sum(r.w_requests) / r.out
    walk = f"{r.programs} programs" + (
        " (persistent, tile t on program t mod the programs)" if r.programs < tiles_m * tiles_n else ""
    )
    summary = (
        f"{tiles_m} x {tiles_n} output tiles of {r.block_m} x {r.block_n}, {walk}, walked {r.group_m} row tiles "
        f"at a time (darker: earlier). Each x row is requested {x_times:.3g} times, each weight row {w_times:.3g}: "
        f"{_mb(r.requested(itemsize))} requested from L2 for {_mb(r.unique(itemsize))} of x and weight"
    )
    return trace, summary


def attention_trace(a: AttentionReads) -> tuple[go.Heatmap, str]:
    hover = [
        [
            f"query tile {i} (positions {i * a.positions}-{min((i + 1) * a.positions, a.tq) - 1}), key tile {j} "
            f"(keys {j * a.block_n}-{min((j + 1) * a.block_n, a.tk) - 1}): {KIND_NAMES[kind]}"
            for j, kind in enumerate(row)
        ]
        for i, row in enumerate(a.kinds)
    ]
    trace = go.Heatmap(
        z=a.kinds,
        zmin=0,
        zmax=2,
        customdata=hover,
        hovertemplate="%{customdata}<extra></extra>",
        colorscale=KIND_SCALE,
        showscale=False,
    )
    masked = sum(row.count(MASKED) for row in a.kinds)
    whole = sum(row.count(WHOLE) for row in a.kinds)
    mean = a.requested_keys() / a.tk if a.tk else 0
    summary = (
        f"{len(a.kinds)} query tiles of {a.positions} positions x {len(a.kinds[0]) if a.kinds else 0} key tiles of "
        f"{a.block_n}, per head{' (causal)' if a.causal else ''}: {whole} read whole (blue), {masked} masked "
        f"(orange), the rest skipped. Each key and its value are requested {mean:.3g} times on average"
    )
    return trace, summary


def tile_reads_figure(
    linear: LinearReads | None, attention: AttentionReads | None, itemsize: int, names: dict, note: str = ""
) -> go.Figure:
    """The matmul's output tiles by program and walk order beside the attention's (query tile, key tile) reads;
    names: the operations' names ({"linear": "attn.c_attn", ...})."""
    panels = [(k, v) for k, v in (("linear", linear), ("attention", attention)) if v is not None]
    titles = []
    for kind, _ in panels:
        titles.append(
            f"{names.get(kind, kind)}: output tiles (row tile x column tile)"
            if kind == "linear"
            else f"{names.get(kind, kind)}: query tile x key tile"
        )
    fig = make_subplots(rows=1, cols=max(1, len(panels)), subplot_titles=titles, horizontal_spacing=0.12)
    lines = []
    for col, (kind, reads) in enumerate(panels, start=1):
        trace, summary = linear_trace(reads, itemsize) if kind == "linear" else attention_trace(reads)
        fig.add_trace(trace, row=1, col=col)
        lines.append(f"{names.get(kind, kind)}: {summary}.")
    title = "Which program reads which tile (the SM-request model, tile by tile)"
    layout(fig, title, "", "", " ".join(lines) + (f" {note}" if note else ""), plot_px=340, width=900)
    for col, (kind, _) in enumerate(panels, start=1):  # after layout(), which titles the first axes
        axis = ("row tile", "column tile") if kind == "linear" else ("query tile", "key tile")
        fig.update_yaxes(autorange="reversed", title_text=axis[0], row=1, col=col)
        fig.update_xaxes(title_text=axis[1], row=1, col=col)
    return fig
