"""Lesson 9: SMs, warps and occupancy. One decode step at two tile sizes and two rungs: how many programs of each
kernel an SM holds (its registers, shared memory and warps decide), in how many waves a grid runs, and, on a GPU,
what every SM did during the step (each program stamped with its start, end and SM: explorer.measure.timeline)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from kernels.config import GPUS
from kernels.occupancy import SMS

from ...measure import occupancy, timeline
from .. import estimate
from . import base

# The two tile choices of the decode projections: their defaults, and wider tiles in fewer warps.
WIDE = {"linear_decode": {"block_n": 16, "num_warps": 4}}
TILE_CHOICES = [None, WIDE]
RUNGS = ["decode", "overlap"]
# The GPU a CPU's run is compiled for: the one the recordings were made on (an H200 has an H100's SMs).
STANDS_FOR = 90
# Compiling the four variants' kernels for that GPU on the reference CPU (explorer.measure.occupancy, one process).
CPU_COMPILE_S = 12.0
# On a GPU: four steps recorded, each with two graphs captured and 40 replays, after its first run's compiles.
GPU_S = 4.0


def settings(size: str) -> dict:
    common = dict(backend="triton", cache=True, rungs=RUNGS, tile_choices=TILE_CHOICES)
    if size == "gpu":
        return common | dict(model=base.GPT2_SHAPE, dtype="bfloat16", context=1000)
    return common | dict(model="bundled", dtype="float16", context=16, arch=STANDS_FOR)


def tiles_label(choice: dict | None) -> str:
    if not choice:
        return "default tiles"
    return "; ".join(f"{k} " + ", ".join(f"{f}={v}" for f, v in cfg.items()) for k, cfg in choice.items())


def variants(s: dict) -> list[tuple[str, dict | None]]:
    return [(rung, choice) for rung in s["rungs"] for choice in s["tile_choices"]]


def measure(s: dict) -> tuple[dict, dict]:
    """Settings naming an `arch` compile for it and run nothing (a CPU's job, wherever it runs); the others stamp
    the step on this GPU."""
    return _measure_compiled(s) if "arch" in s else _measure_gpu(s)


def _measure_compiled(s: dict) -> tuple[dict, dict]:
    """The interpreter runs programs one after another on no SM: here the kernels are compiled for the GPU the page
    stands for and placed on its SMs, nothing run."""
    asked = [
        dict(
            model=s["model"], dtype=s["dtype"], fusion=rung, tiles=choice, prompt_tokens=s["context"], decode_only=True
        )
        for rung, choice in variants(s)
    ]
    found = occupancy.run(s["arch"], asked)
    frames = [_rows(got["rows"], rung, choice) for (rung, choice), got in zip(variants(s), found, strict=True)]
    gpu = GPUS[s["arch"]]
    facts = dict(arch=s["arch"], gpu=gpu.name, sms=gpu.num_sms, variants=[_variant(f, gpu.num_sms) for f in frames])
    facts["rungs_alike"] = _rungs_alike(frames)
    return facts, {"kernels": pd.concat(frames, ignore_index=True)}


def _measure_gpu(s: dict) -> tuple[dict, dict]:
    import torch

    from ...model.ops import Tiles

    model = base.model(s)
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    frames, busy, steps = [], [], []
    for rung, choice in variants(s):
        at_rung = model.with_fusion(rung)
        tiles = occupancy.tiles_of(choice) if choice else Tiles()
        got = timeline.record(at_rung, context=s["context"], graph=True, tiles=tiles)
        if got["problems"]:
            raise RuntimeError(f"the {rung} rung's stamped step: {'; '.join(got['problems'])}")
        rows = occupancy.decode_rows(arch, at_rung, batch=1, prompt=s["context"], tiles=tiles)
        frame, programs, sms = _rows(rows, rung, choice), got["frame"], got["sms"]
        if len(frame) != programs.launch.nunique():
            raise RuntimeError(f"the {rung} rung launched {programs.launch.nunique()} kernels, {len(frame)} compiled")
        frame["seen_at_once"] = [timeline.most_at_once(programs[programs.launch == i]) for i in range(len(frame))]
        spread = -(-frame.programs // sms)  # programs per SM where the grid is smaller than its slots
        frame["computed_at_once"] = frame.resident.clip(upper=spread)
        frames.append(frame)
        over = timeline.running(programs)
        over.insert(0, "variant", _name(rung, choice))
        busy.append(over)
        steps.append(
            dict(idle=timeline.idle_share(programs, sms), step_ms=got["step_ms"], stamped_ms=got["stamped_ms"])
        )
    facts = dict(arch=arch, gpu=torch.cuda.get_device_name(), sms=sms, context=s["context"])
    facts["variants"] = [_variant(f, sms) | step for f, step in zip(frames, steps, strict=True)]
    facts["rungs_alike"] = _rungs_alike(frames)
    tables = {"kernels": pd.concat(frames, ignore_index=True), "running": pd.concat(busy, ignore_index=True)}
    return facts, tables


def _name(rung: str, choice: dict | None) -> str:
    return f"{rung}, {tiles_label(choice)}"


def _rows(rows: list[dict], rung: str, choice: dict | None) -> pd.DataFrame:
    columns = ["operation", "kernel", "warps", "registers", "shared", "resident", "limiter", "programs", "waves"]
    frame = pd.DataFrame(rows)[[*columns, "constants"]]
    frame.insert(0, "variant", _name(rung, choice))
    frame.insert(1, "rung", rung)
    frame.insert(2, "tiles", tiles_label(choice))
    return frame


def _variant(frame: pd.DataFrame, sms: int) -> dict:
    """What the explanation quotes of one variant: its launches and programs, how many of its grids have fewer
    programs than the GPU has SMs, and its largest grid's kernel."""
    big = frame.loc[frame.programs.idxmax()]
    out = dict(
        variant=str(frame.variant.iloc[0]),
        rung=str(frame.rung.iloc[0]),
        tiles=str(frame.tiles.iloc[0]),
        launches=len(frame),
        programs=int(frame.programs.sum()),
        short_grids=int((frame.programs < sms).sum()),
        big_operation=str(big.operation),
        big_kernel=str(big.kernel),
        big_programs=int(big.programs),
        big_warps=int(big.warps),
        big_registers=int(big.registers),
        big_shared=int(big.shared),
        big_resident=int(big.resident),
        big_limiter=str(big.limiter),
        big_waves=float(big.waves),
        big_constants=str(big.constants),
    )
    if "seen_at_once" in frame:
        out["residency_held"] = int((frame.seen_at_once == frame.computed_at_once).sum())
    return out


def _rungs_alike(frames: list[pd.DataFrame]) -> dict:
    """The two rungs at the first tile choice, launch by launch: how many launches hold as many programs per SM."""
    first, second = frames[0].rung.iloc[0], frames[-1].rung.iloc[0]
    one, other = (next(f for f in frames if f.rung.iloc[0] == rung) for rung in (first, second))
    alike = len(one) == len(other)
    same = int((one.resident.to_numpy() == other.resident.to_numpy()).sum()) if alike else 0
    return dict(first=str(first), second=str(second), launches=(len(one), len(other)), same=same)


def _tile_effect(first: dict, wide: dict) -> str:
    """What the other tiles did to the largest grid: wider tiles, fewer and larger programs; or, where its default
    tile was wider still (a GPU's LM head takes 128 columns), narrower ones and more programs."""
    if wide["big_programs"] < first["big_programs"]:
        return "Wider tiles mean fewer, larger programs."
    return (
        f"Its default tile was wider still ({_constant(first['big_constants'], 'BLOCK_N')} columns), so here the "
        "tiles are narrower: more, smaller programs."
    )


def _constant(constants: str, name: str) -> str:
    for part in constants.split(", "):
        key, _, value = part.partition("=")
        if key == name:
            return value
    return "?"


def explain(r) -> str:
    f = r.facts
    v = f["variants"]
    first = v[0]
    gpu = "idle" in v[0]  # stamped on a GPU's SMs, not compiled for one
    where = f"the {f['gpu']} (sm_{f['arch']}, {f['sms']} SMs)"
    text = []
    if not gpu:
        text.append(
            f"The interpreter runs a kernel's programs one after another in Python, on no SM. So here each kernel of "
            f"one decode step is compiled for {where}, as the GPU would build it, and its programs placed on the "
            "SMs: nothing runs. What the SMs did during such a step, every program on the SM that ran it, a GPU "
            "recorded: in Generate, open *tiles* and click *One decode step on the … SMs (recorded)*."
        )
    big, sm = first["big_operation"], SMS[f["arch"]]
    text.append(
        f"At the **{first['rung']}** rung with {first['tiles']}, a step launches **{first['launches']} kernels**, "
        f"**{first['programs']:,} programs** in all. The largest grid is {big}'s: {first['big_programs']:,} programs "
        f"of `{first['big_kernel']}` (BLOCK_N={_constant(first['big_constants'], 'BLOCK_N')}), each "
        f"{first['big_warps']} warps of 32 lanes, {first['big_registers']} registers a thread and "
        f"{first['big_shared']:,} bytes of shared memory. An SM holds **{first['big_resident']} such programs at "
        f"once**, limited by its **{first['big_limiter']}** (an SM of sm_{f['arch']} has "
        f"{sm.registers // 1024}K registers, {sm.warps} warps, {sm.blocks} programs and {sm.shared // 1024} KB of "
        f"shared memory to share), so {f['sms']} SMs run the grid in **{first['big_waves']:.2f} waves**."
    )
    wide = next((x for x in v if x["rung"] == first["rung"] and x["tiles"] != first["tiles"]), None)
    if wide:
        text.append(
            f"With {wide['tiles']}, the same projection is {wide['big_programs']:,} programs of "
            f"{wide['big_warps']} warps and {wide['big_registers']} registers: {wide['big_resident']} fit an SM "
            f"(limited by {wide['big_limiter']}), {wide['big_waves']:.2f} waves. {_tile_effect(first, wide)} The "
            f"step's {first['programs']:,} programs become {wide['programs']:,}, and "
            f"**{wide['short_grids']} of its {wide['launches']} launches** (against {first['short_grids']}) have fewer "
            f"programs than the GPU's {f['sms']} SMs: while one of them runs, the SMs it leaves have nothing to do."
        )
    alike = f["rungs_alike"]
    if alike["first"] != alike["second"]:
        a, b = alike["launches"]
        text.append(
            f"At the **{alike['second']}** rung the step launches {b} kernels ({a} at {alike['first']}); "
            + (f"{alike['same']} of them hold as many programs per SM as at {alike['first']}. " if a == b else "")
            + (
                "What a rung changes is when programs start and how long SMs wait between kernels: "
                + (
                    "the chart shows the SMs busy through the step."
                    if gpu
                    else "only a GPU's timeline shows that (the recorded one, under Generate's tiles)."
                )
            )
        )
    if gpu:
        text.append(_timeline_text(f, v))
    return "\n\n".join(text)


def _timeline_text(f: dict, v: list[dict]) -> str:
    parts = []
    for x in v:
        parts.append(
            f"{x['variant']}: **{base.ms(x['step_ms'])}** a step ({base.ms(x['stamped_ms'])} stamped), SMs idle "
            f"**{base.pct(x['idle'])}** of it"
        )
    best = min(v, key=lambda x: x["step_ms"])
    worst = max(v, key=lambda x: x["step_ms"])
    held = sum(x["residency_held"] for x in v)
    launches = sum(x["launches"] for x in v)
    early = ""
    plain = next((x for x in v if x["rung"] == "decode"), None)
    ahead = next((x for x in v if x["rung"] == "overlap" and plain and x["tiles"] == plain["tiles"]), None)
    if plain and ahead:
        early = (
            f" At the overlap rung each kernel's programs start while the kernel before them still runs (programmatic "
            f"dependent launch): they request their weights, then wait on their SM for its results, and a program's "
            f"bar includes that wait. So its SMs look busy ({base.pct(1 - ahead['idle'])} of the step, against "
            f"{base.pct(1 - plain['idle'])} at decode) for a step {plain['step_ms'] / ahead['step_ms']:.2f}x as fast: "
            "held, not all of it working."
        )
    return (
        f"Replayed from a CUDA graph at {f['context']} tokens of cache, every program writing its start, end and SM: "
        + "; ".join(parts)
        + f". Idle means SM-time inside no program, between kernels or on SMs a grid left empty: it is time the "
        f"step pays for without moving a byte. The fastest, {best['variant']}, was "
        f"{worst['step_ms'] / best['step_ms']:.2f}x as fast as {worst['variant']}. On the busiest SM of each launch "
        f"the timeline shows as many programs at once as computed (the residency, or the grid's programs over the "
        f"SMs where fewer) in **{held} of {launches} launches**." + early
    )


def figure(r) -> go.Figure:
    if "running" in r.tables:
        return _running_figure(r)
    kernels = r.tables["kernels"]
    fig = go.Figure()
    per = kernels.groupby(["tiles", "operation"], as_index=False, sort=False).agg(
        resident=("resident", "first"), waves=("waves", "first"), limiter=("limiter", "first")
    )
    for tiles, rows in per.groupby("tiles", sort=False):
        fig.add_bar(
            x=rows.operation,
            y=rows.resident,
            name=tiles,
            customdata=list(zip(rows.waves, rows.limiter, strict=True)),
            hovertemplate="%{x}: %{y} programs per SM (limited by %{customdata[1]}), %{customdata[0]:.2f} waves",
        )
    return base.big(fig, f"Programs an SM holds, compiled for sm_{r.facts['arch']}", r, "", "programs per SM")


BINS = 100  # the busy-SM lines are averaged over this many spans of the longest step: the count changes every few ns


def _running_figure(r) -> go.Figure:
    running = r.tables["running"]
    longest = float(running.t_us.max())
    width = longest / BINS if longest > 0 else 1.0
    fig = go.Figure()
    for name, rows in running.groupby("variant", sort=False):
        at, busy = _binned(rows.t_us.to_numpy(), rows.sms.to_numpy(), width)
        fig.add_scatter(x=at, y=busy, name=name, mode="lines", hovertemplate="%{x:.0f} µs: %{y:.0f} SMs busy")
    fig.update_traces(line_width=2)
    return base.big(
        fig,
        "SMs busy through one decode step",
        r,
        "µs from the step's start",
        f"SMs busy of {r.facts['sms']}, {width:.3g}-µs means",
    )


def _binned(t, sms, width: float):
    """The step function `sms` (set at each time t, in order) averaged over spans of `width` from 0 to its last
    change: (each span's middle, its mean), the mean weighted by how long each value held."""
    import numpy as np

    spans = max(1, int(np.ceil(t[-1] / width)))
    fine = (np.arange(spans * 64) + 0.5) * (width / 64)  # 64 samples a span, each the value then holding
    held = sms[np.clip(np.searchsorted(t, fine, side="right") - 1, 0, len(sms) - 1)]
    held = np.where(fine < t[0], 0, held)
    return (np.arange(spans) + 0.5) * width, held.reshape(spans, 64).mean(axis=1)


def _estimate(s: dict) -> float:
    if "arch" not in s:
        return GPU_S
    return CPU_COMPILE_S * len(variants(s)) / 4 * estimate.cpu_speed()


LESSON = base.Lesson(
    name="sms",
    title="SMs, warps and occupancy",
    summary="How many programs of each kernel an SM holds, in how many waves a grid runs, and what every SM did.",
    settings=settings,
    measure=measure,
    explain=explain,
    figure=figure,
    try_next=(
        "In Generate, open *tiles*, set linear_decode's block_n and num_warps, and look at the occupancy table beside "
        "them (*Programs per SM*): what limits them and the waves. *One decode step on the … SMs (recorded)* "
        "draws a GPU's recording of the step at your rung, every program on its SM."
    ),
    estimate=_estimate,
    controls=base.model_controls,
)
