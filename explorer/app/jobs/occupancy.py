"""The occupancy job: every Triton launch of a prefill and a decode step at the page's settings, compiled for a
GPU (on a CPU, the one the page stands for), with the programs each SM holds and the waves each grid runs in."""

from __future__ import annotations

import time

import pandas as pd

from ...measure import occupancy
from .. import counterpart
from .base import Control

PROMPT = 16  # the prefill's tokens when the page's prompt length is left to the prompt as written


def spec(s) -> dict:
    """The settings occupancy.compute() reads: the run's model, dtype, rung, tiles, batch and prompt length."""
    tiles = counterpart.settings_key(s)["tiles"]  # each kernel's as plain values, as a recording keys them
    dtype, prompt = counterpart.ran(s), s.prompt_tokens or PROMPT
    return dict(model=s.model, dtype=dtype, fusion=s.fusion, tiles=tiles, batch=s.batch, prompt_tokens=prompt)


def table(rows: list[dict]) -> pd.DataFrame:
    """One row per operation and kernel of each phase, its launches counted (a layer's are alike)."""
    frame = pd.DataFrame(rows, columns=[*occupancy.COLUMNS, "constants"])
    keys = [c for c in frame.columns if c != "waves"]
    grouped = frame.groupby(keys, sort=False).agg(launches=("waves", "size"), waves=("waves", "first"))
    return grouped.reset_index()


def source_blocks(frame: pd.DataFrame, sources: dict) -> list[str]:
    """Each kernel's source as written in kernels/, folded, under the values its launches compiled it with."""
    out = ["", "*The kernels as written in kernels/, each with the values its launches here compiled it with:*", ""]
    for kernel, src in sources.items():
        seen = sorted(set(frame[frame.kernel == kernel].constants))
        values = "".join(f"<br><code>{v}</code>" for v in seen)
        summary = f"<details><summary><b>{kernel}</b>{values}</summary>"
        out += [summary, "", "```python", src.rstrip(), "```", "", "</details>"]
    return out


def markdown(frame: pd.DataFrame, gpu: str, note: str, at: dict, sources: dict | None = None) -> str:
    decode = frame[frame.phase == "decode"]
    launches = int(decode.launches.sum())
    thin = int(decode[decode.waves < 0.1].launches.sum())
    lines = [
        f"**Compiled for {gpu}** ({note}): every Triton launch of a prefill of {at['prompt_tokens']} tokens and one "
        f"decode step ({at['model']}, {at['dtype']}, the {at['fusion']} rung, batch {at['batch']}, these tiles): "
        "the programs one SM holds at once (*per SM*) and what stops it holding more, and the waves each grid runs "
        "in (programs / (programs per SM x SMs)). *n*: launches alike (one a layer).",
        "",
        f"The decode step makes {launches} launches; {thin} of them fill less than a tenth of one wave: their SMs "
        "mostly wait, which is why a decode step costs more than its bytes.",
    ]
    for phase, title in (("prefill", f"Prefill of {at['prompt_tokens']} tokens"), ("decode", "One decode step")):
        lines += [
            "",
            f"*{title}*",
            "",
            "| operation | kernel | n | warps | regs | smem KB | per SM (limit) | programs | waves |",
            "|---|---|---:|---:|---:|---:|---|---:|---:|",
        ]
        for r in frame[frame.phase == phase].itertuples(index=False):
            lines.append(
                f"| {r.operation} | {r.kernel} | {r.launches} | {r.warps} | {r.registers} | {r.shared / 1024:.1f} | "
                f"{r.resident} ({r.limiter}) | {r.programs} | {r.waves:.2f} |"
            )
    if sources:
        lines += source_blocks(frame, sources)
    return "\n".join(lines)


def picture(tiles: dict, gpu: str, at: dict) -> str | None:
    """The prefill's matmul and attention tile by tile (explorer.app.tile_figure) as plotly JSON; None when the
    launches had neither."""
    from ...measure import tile_reads
    from ..tile_figure import tile_reads_figure

    names, walks = {}, {}
    for kind, walk in (("linear", tile_reads.linear), ("attention", tile_reads.attention)):
        if kind in tiles:
            args = dict(tiles[kind])
            names[kind] = args.pop("operation")
            walks[kind] = walk(**args)
    if not walks:
        return None
    shorter = " (the run's is shorter)" if tiles["prompt"] != at["prompt_tokens"] else ""
    note = (
        f"A prefill of {tiles['prompt']} tokens{shorter} at this page's tiles, as the launchers choose them for "
        f"{gpu}; the attention's grid is per (sequence, head)."
    )
    figure = tile_reads_figure(walks.get("linear"), walks.get("attention"), tiles["itemsize"], names, note)
    return figure.to_json()


def run(payload: dict, control: Control):
    s, arch = payload["settings"], payload["arch"]
    gpu, note = payload["gpu"], payload["note"]
    yield {"occupancy": f"*Compiling every kernel of a prefill and a decode step for {gpu}…*"}
    at = spec(s)
    got = occupancy.run(arch, at, timeout=max(30.0, control.deadline - time.monotonic()))
    view = {"occupancy": markdown(table(got["rows"]), gpu, note, at, got["sources"])}
    figure = picture(got["tiles"], gpu, at)
    yield view if figure is None else view | {"tile_reads": figure}


def target(device: str) -> tuple[int, str, str]:
    """(the architecture compiled for, the GPU's name, what the figures are) on this device."""
    from kernels.config import GPUS

    if device == "cpu":
        return 90, "NVIDIA H200 (sm_90)", "on this CPU, not run: the GPU this page's recordings come from"
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor
    if arch not in GPUS:
        raise ValueError(f"no limits known for sm_{arch}: known are {' '.join(map(str, GPUS))}")
    return arch, f"{torch.cuda.get_device_name()} (sm_{arch})", "on this GPU's architecture, compiled, not timed"
