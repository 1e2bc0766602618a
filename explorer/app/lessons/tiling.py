"""Lesson 4: tiling and shared memory. A small tile sweep of one matmul: bytes the SMs request fall
as tiles grow (each tile is re-read fewer times), while time depends on more than bytes."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kernels.config import TileConfig
from kernels.ops.linear.kernel import traffic as linear_traffic

from ...measure import metrics, sweeps
from .. import estimate, models, units
from . import base


def settings(size: str) -> dict:
    if size == "gpu":  # GPT-2 small's c_fc over a 1024-token prompt
        grid = dict(block_m=[16, 32, 64, 128], block_n=[32, 64, 128, 256], block_k=[64], num_stages=[3])
        return dict(kernel="linear", shape=dict(M=1024, K=768, N=3072), dtype="bfloat16", grid=grid)
    grid = dict(block_m=[16, 32, 64], block_n=[32, 64, 128], block_k=[32], num_stages=[1])
    return dict(kernel="linear", shape=dict(M=64, K=256, N=256), dtype="float32", grid=grid)


def measure(s: dict) -> tuple[dict, dict]:
    dtype, device = models.DTYPES[s["dtype"]], models.device()
    M, K, N = (s["shape"][k] for k in "MKN")
    rows = [
        row for _, _, row in sweeps.tile_sweep_rows("linear", s["shape"], dtype=dtype, device=device, grid=s["grid"])
    ]
    frame = pd.DataFrame(rows)
    frame["tile"] = [f"{m}×{n}" for m, n in zip(frame.block_m, frame.block_n, strict=True)]
    frame["area"] = frame.block_m * frame.block_n
    hbm, floor = [], None
    for row in frame.itertuples():
        cfg = TileConfig(block_m=row.block_m, block_n=row.block_n, block_k=row.block_k, num_stages=row.num_stages)
        try:
            t = linear_traffic(M, N, K, dtype.itemsize, activation="gelu", config=cfg, dtype=dtype, device=device)
            hbm.append(t.hbm_bytes / metrics.MB)
            floor = t.min_bytes / metrics.MB
        except ValueError:  # a tile this device cannot hold: the sweep row says why
            hbm.append(float("nan"))
    frame["hbm_mb"] = hbm
    frame["us"] = frame.ms * 1e3
    frame = frame.sort_values(["area", "block_m"]).reset_index(drop=True)
    table = frame[["tile", "area", "valid", "reason", "modeled_mb", "hbm_mb", "us"]]
    valid = frame[frame.valid]
    small, large = valid.iloc[0], valid.iloc[-1]
    fast, slow = valid.loc[valid.us.idxmin()], valid.loc[valid.us.idxmax()]
    facts = dict(
        M=M,
        K=K,
        N=N,
        configs=len(frame),
        invalid=int((~frame.valid).sum()),
        invalid_reason=str(frame[~frame.valid].reason.iloc[0]) if (~frame.valid).any() else "",
        small_tile=small.tile,
        small_mb=float(small.modeled_mb),
        small_hbm_mb=float(small.hbm_mb),
        large_tile=large.tile,
        large_mb=float(large.modeled_mb),
        large_hbm_mb=float(large.hbm_mb),
        floor_mb=floor,
        fast_tile=fast.tile,
        fast_us=float(fast.us),
        slow_tile=slow.tile,
        slow_us=float(slow.us),
        timer=str(valid.timer.iloc[0]),
    )
    return facts, {"sweep": table}


def explain(r) -> str:
    f = r.facts
    text = (
        f"One matmul with GELU, ({f['M']}×{f['K']}) by ({f['K']}×{f['N']}), run with {f['configs']} tile shapes "
        f"(rows × columns of the output each program computes). Every program loads its rows of the input and its "
        f"columns of the weight, so the input is re-read once per column of tiles and the weight once per row of "
        f"tiles. With **{f['small_tile']}** tiles the SMs requested **{base.mb(f['small_mb'])}**; with "
        f"**{f['large_tile']}**, **{base.mb(f['large_mb'])}**, {base.num(f['small_mb'] / f['large_mb'])}× fewer. "
        f"The floor, each input read once and the output written once, is {base.mb(f['floor_mb'])}. "
        + (
            f"HBM sees {base.mb(f['small_hbm_mb'])} and {base.mb(f['large_hbm_mb'])} (modeled): the L2 keeps most "
            "re-reads away from it.\n\n"
            if f["small_hbm_mb"] > 1.01 * f["floor_mb"]
            else "The whole problem fits in L2, so HBM sees only the floor, whatever the tile (modeled).\n\n"
        )
        + f"Time is another matter: fastest was **{f['fast_tile']} at {base.duration(f['fast_us'])}**, slowest "
        f"{f['slow_tile']} at {base.duration(f['slow_us'])}. "
    )
    largest_won = f["fast_tile"] == f["large_tile"]
    if r.device == "CPU":
        text += "In the interpreter, time follows the number of programs, each run in Python" + (
            ", so the largest tile won. " if largest_won else ". "
        )
        text += "On a GPU a tile must also fit shared memory and registers, and fewer tiles can leave SMs idle."
    else:
        text += (
            "A larger tile needs more shared memory and registers per program, so fewer programs fit on an SM at "
            "once, and it leaves fewer programs to spread over the SMs: "
            + ("here the largest tile still won." if largest_won else "here the largest tile did not win.")
        )
    if f["invalid"]:
        text += f" {f['invalid']} of the shapes could not run here: {f['invalid_reason']}"
    return text


def figure(r) -> go.Figure:
    sweep = r.tables["sweep"]
    ok = sweep[sweep.valid]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    fig.add_trace(go.Bar(x=ok.tile, y=ok.modeled_mb, name="MB SM requests", marker_color="#4c78a8"), row=1, col=1)
    fig.add_trace(go.Bar(x=ok.tile, y=ok.hbm_mb, name="MB HBM", marker_color="#e45756"), row=1, col=1)
    unit, per = units.time_unit(ok.us / 1e3)  # the interpreter's µs run to millions: seconds, then
    time = go.Bar(x=ok.tile, y=ok.us / 1e3 / per, name="time", marker_color="#54a24b", showlegend=False)
    fig.add_trace(time, row=2, col=1)
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_yaxes(title_text=unit, row=2, col=1)
    fig.update_layout(barmode="group")
    # Tile names run down under the bars: the legend sits inside the bytes chart, top right, where bars are short.
    inside = dict(orientation="v", xref="paper", x=0.99, xanchor="right", yref="paper", y=0.99, yanchor="top")
    return base.big(fig, "Tile size: bytes loaded and time", r, height=680, legend=inside)


def estimated(s: dict) -> float:
    configs = len(sweeps.grid_configs("linear", s["grid"]))
    if base.size() == "cpu":  # the interpreter's call, at this CPU's speed
        return configs * 0.2 * estimate.cpu_speed()
    return configs * 0.3  # a GPU's capture and replays


LESSON = base.Lesson(
    name="tiling",
    title="Tiling and shared memory",
    summary="A small tile sweep of one matmul: bytes loaded against tile size, and time.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "Open *Tile sweep* (set to the linear kernel) and sweep block_k or num_stages too; cells that cannot run say "
        "why, often shared memory. *Use best in Generate* sends the winner to the Generate tab's tiles."
    ),
    estimate=estimated,
    controls=lambda s: {"kernel": s["kernel"]},
)
