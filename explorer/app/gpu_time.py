"""What a step of any setting takes on the recorded GPU: measured where a recording holds the setting,
modeled everywhere else, and the model held against recorded steps it was not fitted on.

A step's time is modeled as
    the sum over its kernels of max(bytes at the GPU's measured bandwidth, FLOPs at the dtype's measured peak)
  + its launches x the cost of one launch on its rung (torch, none, ..., persistent) in its launch mode,
    and, launched eagerly in half precision on the Triton backend, what such a launch adds on the host (the
    tensor descriptors it makes and encodes: on an H100 GPT-2's fp16 cache-off step took 2.93 ms against
    fp32's 2.09 for the same 45 launches)
  + the cost of a step in its launch mode and phase (the host's work around the kernels, the tensors of the
    next step), and the cost of drawing the token where the run samples rather than takes the largest logit.
The launch modes: "graph", a decode step replayed from a CUDA graph (the KV cache on, the default on a GPU),
and "eager", every kernel launched from Python (the prefill, every step with the cache off, or the graph box
unticked). A launch costs what its rung makes it cost: an eager launch is the host's Python and the driver;
in a graph, what is left is the GPU's own gap between dependent kernels, which the overlap rung hides.

The costs are fitted (least squares on relative error, none negative) on the matrix of settings that
scripts/record_matrix.py records on the GPU: two thirds of its settings. The third held out, drawn once and
stored with the recording, is never used to fit; its largest error is what a modeled figure's label says.
Until a matrix is shipped, the costs are fitted on the default jobs' recorded steps (Generate, Compare, the
ladder: the bundled GPT-2 in float32) and held against the lessons' recorded decode steps (GPT-2 small's shape
and a Llama block in bf16), which the fit never sees.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..measure.metrics import MB
from . import recordings

FORMAT = 1
MODES = ("graph", "eager")
PHASES = ("prefill", "decode")


def rung_of(settings: dict) -> str:
    """The ladder rung a run's settings (settings_key's dict, or RunSettings) are on."""
    get = settings.get if isinstance(settings, dict) else lambda k: getattr(settings, k)
    return "torch" if get("backend") == "torch" else get("fusion")


def mode_of(phase: str, cache: bool, cuda_graph: bool = True) -> str:
    """How a step is launched on a GPU: a decode step with the cache on replays a graph (unless unticked)."""
    return "graph" if phase == "decode" and cache and cuda_graph else "eager"


def roof_ms(hbm_mb, gflop, bandwidth_gbs: float, tflops: float):
    """The larger of the bytes at `bandwidth_gbs` and the FLOPs at `tflops`, in milliseconds."""
    return np.maximum(np.asarray(hbm_mb) * MB / (bandwidth_gbs * 1e9), np.asarray(gflop) / (tflops * 1e3)) * 1e3


def step_roofs(kernels: pd.DataFrame, bandwidth_gbs: float, tflops: float) -> pd.Series:
    """Each step's sum of its kernel kinds' roofs (roof_ms of each kind's bytes and FLOPs), by step."""
    roof = pd.Series(roof_ms(kernels.hbm_mb, kernels.gflop, bandwidth_gbs, tflops), index=kernels.index)
    return roof.groupby(kernels.step).sum()


@dataclass(frozen=True)
class Point:
    """One step kind of one setting: what the model sees, and what was measured."""

    rung: str
    mode: str
    phase: str
    roof_ms: float
    launches: float
    measured_ms: float = math.nan
    sampled: bool = False  # the step draws its token by sampling (top-k/top-p on the GPU), not greedily
    half: bool = False  # the run computes in float16 or bfloat16

    @property
    def described(self) -> float:
        """The launches that make tensor descriptors on the host: eager ones of the Triton backend in half
        precision (a graph replays its descriptors; the torch backend makes none)."""
        return self.launches if self.half and self.mode == "eager" and self.rung != "torch" else 0.0


def half(dtype: str | None) -> bool:
    """Whether a run in `dtype` computes in half precision (float16 or bfloat16)."""
    return dtype in ("float16", "bfloat16")


def sampled(settings: dict) -> bool:
    """Whether a run's steps sample their tokens (a temperature above zero) rather than take the largest logit."""
    return float(settings.get("temperature") or 0.0) > 0.0


def points(steps: pd.DataFrame, kernels: pd.DataFrame, settings: dict, bandwidth_gbs: float, tflops: float):
    """A run's prefill step and its median decode step (the one whose measured time is the median, so that
    its features and its time are one step's), as Points. Each kernel kind's roof is taken from its own bytes
    and FLOPs."""
    per_step = step_roofs(kernels, bandwidth_gbs, tflops)
    frame = steps.assign(roof_ms=steps.step.map(per_step).fillna(0.0))
    cache, graph_on = bool(settings["cache"]), bool(settings.get("cuda_graph", True))
    out = []
    for phase in PHASES:
        part = frame[frame.phase == phase].sort_values("latency_ms", kind="stable")
        if part.empty:
            continue
        middle = part.iloc[(len(part) - 1) // 2]
        mode = mode_of(phase, cache, graph_on)
        out.append(
            Point(
                rung_of(settings),
                mode,
                phase,
                float(middle.roof_ms),
                float(middle.operations),
                float(middle.latency_ms),
                sampled(settings),
                half(settings.get("dtype")),
            )
        )
    return out


@dataclass
class TimeModel:
    gpu: str
    date: str
    bandwidth_gbs: float
    tflops: dict  # dtype -> measured TFLOP/s
    per_launch_ms: dict  # (rung, mode) -> ms
    per_step_ms: dict  # (mode, phase) -> ms
    per_sample_ms: float = 0.0  # what drawing a token by sampling adds to a step
    per_described_ms: float = 0.0  # what a launch's tensor descriptors add (Point.described)
    fitted_on: str = ""  # what the costs were fitted on, for the label
    fit_error: float = math.nan  # the largest factor between the model and a step kind it was fitted on
    held_out: int = 0  # how many recorded settings the fit never saw
    held_out_error: float = math.nan  # the largest factor between the model and one of them
    held_kind: str = "recorded settings"  # what the held-out recordings are, for the label

    def step_ms(self, p: Point) -> float:
        launch = self.per_launch_ms.get((p.rung, p.mode), max(self.per_launch_ms.values()))
        step = self.per_step_ms.get((p.mode, p.phase), 0.0) + (self.per_sample_ms if p.sampled else 0.0)
        return p.roof_ms + p.launches * launch + p.described * self.per_described_ms + step

    def step_times(self, steps: pd.DataFrame, kernels: pd.DataFrame, settings: dict, dtype: str) -> pd.Series:
        """Each step's modeled milliseconds on this GPU (a Series on `steps`' index), from the step's kernels'
        bytes and FLOPs (a kernels frame, one row per step and kernel kind) and its launches."""
        per_step = step_roofs(kernels, self.bandwidth_gbs, self.tflops[dtype])
        cache, graph_on = bool(settings["cache"]), bool(settings.get("cuda_graph", True))
        rung, draws, halves = rung_of(settings), sampled(settings), half(dtype)
        out = []
        for step, phase, operations in zip(steps.step, steps.phase, steps.operations, strict=True):
            mode = mode_of(phase, cache, graph_on)
            roof = float(per_step.get(step, 0.0))
            out.append(self.step_ms(Point(rung, mode, phase, roof, float(operations), sampled=draws, half=halves)))
        return pd.Series(out, index=steps.index, dtype=float)

    def kernel_times(self, kernels: pd.DataFrame, dtype: str) -> pd.Series:
        """Each kernel kind's modeled milliseconds in its step: the larger of its bytes at bandwidth and its
        FLOPs at peak (its share of the launch costs is not split out by kind)."""
        return pd.Series(
            roof_ms(kernels.hbm_mb, kernels.gflop, self.bandwidth_gbs, self.tflops[dtype]), index=kernels.index
        )

    def label(self) -> str:
        how = (
            f"{self.gpu}, modeled: each kernel's bytes at {self.bandwidth_gbs:,.0f} GB/s or FLOPs at peak, plus "
            f"launch costs per rung fitted on {self.fitted_on}"
        )
        if self.held_out:
            return f"{how}; within {self.held_out_error:.2f}x of {self.held_out} {self.held_kind} held out of the fit"
        return f"{how}; within {self.fit_error:.2f}x of those, not yet held against any setting outside them"


def fit(train: list[Point], bandwidth_gbs=0.0, tflops=None, gpu="", date="") -> TimeModel:
    """The launch and step costs that make `train`'s modeled times closest to its measured ones, in relative
    error, none of them negative (a negative cost would be a fit to noise)."""
    launch_keys = sorted({(p.rung, p.mode) for p in train})
    step_keys = sorted({(p.mode, p.phase) for p in train})
    columns = launch_keys + step_keys + ["sampled", "described"]
    x = np.zeros((len(train), len(columns)))
    y = np.zeros(len(train))
    for i, p in enumerate(train):
        x[i, columns.index((p.rung, p.mode))] = p.launches / p.measured_ms
        x[i, columns.index((p.mode, p.phase))] = 1.0 / p.measured_ms
        x[i, -2] = float(p.sampled) / p.measured_ms
        x[i, -1] = p.described / p.measured_ms
        y[i] = 1.0 - p.roof_ms / p.measured_ms
    coef = _nonnegative_least_squares(x, y)
    return TimeModel(
        gpu,
        date,
        bandwidth_gbs,
        dict(tflops or {}),
        {k: float(coef[i]) for i, k in enumerate(launch_keys)},
        {k: float(coef[len(launch_keys) + i]) for i, k in enumerate(step_keys)},
        float(coef[-2]),
        float(coef[-1]),
    )


def _nonnegative_least_squares(x: np.ndarray, y: np.ndarray, tolerance: float = 1e-12) -> np.ndarray:
    """min |x c - y| over c >= 0, by Lawson and Hanson's active set: free the coefficient whose gradient
    most wants to grow, solve on the free set, and step back to the boundary where a free one would turn
    negative, until no pinned coefficient would lower the residual."""
    n = x.shape[1]
    free = np.zeros(n, dtype=bool)
    coef = np.zeros(n)
    for _ in range(3 * n + 10):
        gradient = x.T @ (y - x @ coef)
        gradient[free] = -np.inf
        if free.all() or gradient.max() <= tolerance:
            break
        free[np.argmax(gradient)] = True
        while True:
            trial = np.zeros(n)
            trial[free] = np.linalg.lstsq(x[:, free], y, rcond=None)[0]
            if (trial[free] > 0).all():
                coef = trial
                break
            # the furthest step toward `trial` that keeps every free coefficient >= 0, and pin those at zero
            going = free & (trial <= 0)
            gap = coef[going] - trial[going]
            step = np.min(np.divide(coef[going], gap, out=np.zeros_like(gap), where=gap > 0))
            coef = coef + step * (trial - coef)
            free &= coef > tolerance
            coef[~free] = 0.0
    return coef


def factor(a: float, b: float) -> float:
    """How many times apart two positive times are (1.0: equal)."""
    return max(a, b) / min(a, b)


# --- The recording ------------------------------------------------------------------------------------------


@dataclass
class Matrix:
    meta: dict
    rows: list[dict]  # index, key {"settings": ...}, cuda_graph, steps and kernels (DataFrames) or refused

    def points(self, row: dict) -> list[Point]:
        settings = dict(row["key"]["settings"], cuda_graph=row["cuda_graph"])
        tflops = self.meta["tflops"][settings["dtype"]]
        return points(row["steps"], row["kernels"], settings, self.meta["bandwidth_gbs"], tflops)

    def ran(self, held_out: bool | None = None) -> list[dict]:
        """The rows that ran; held_out=True only those held out of the fit, False only the others."""
        out = set(self.meta["held_out"])
        return [r for r in self.rows if "steps" in r and (held_out is None or (r["index"] in out) == held_out)]

    def find(self, key: dict) -> dict | None:
        """The row recorded with these settings as a GPU runs them by default (a CUDA graph with the cache on)."""
        cache = key["settings"]["cache"]
        return next((r for r in self.ran() if r["key"] == key and (r["cuda_graph"] or not cache)), None)


def save(path: str | Path, meta: dict, rows: list[dict]) -> Path:
    body = {
        "format": FORMAT,
        **recordings.plain(meta),
        "rows": [
            {k: (recordings.table(v) if isinstance(v, pd.DataFrame) else recordings.plain(v)) for k, v in row.items()}
            for row in rows
        ],
    }
    return recordings.write(path, body)


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> Matrix:
    meta, body = recordings.read(path, "matrix", FORMAT, "rows")
    rows = []
    for row in body:
        for name in ("steps", "kernels"):
            if name in row:
                row[name] = recordings.frame(row[name])
        rows.append(row)
    return Matrix(meta, rows)


def matrix(folder: str | Path | None = None) -> Matrix | None:
    """The newest matrix recording in `folder` (assets/recorded/), or None."""
    found = recordings.newest(folder, "matrix_*.json", _load)
    return found[1] if found else None


@functools.lru_cache(maxsize=4)
def _fitted(path: str, mtime: float) -> TimeModel:
    m = _load(path, mtime)
    train = [p for r in m.ran(held_out=False) for p in m.points(r)]
    model = fit(train, m.meta["bandwidth_gbs"], m.meta["tflops"], m.meta["gpu"], str(m.meta["date"])[:10])
    model.fitted_on = f"{len(m.ran(held_out=False))} recorded settings"
    model.fit_error = max((factor(model.step_ms(p), p.measured_ms) for p in train), default=math.nan)
    errors = [factor(model.step_ms(p), p.measured_ms) for r in m.ran(held_out=True) for p in m.points(r)]
    model.held_out = len(m.ran(held_out=True))
    model.held_out_error = max(errors, default=math.nan)
    return model


# --- Before a matrix is recorded: the shipped jobs recording --------------------------------------------------


def jobs_points(meta: dict, jobs: dict, tflops: dict) -> list[Point]:
    """The step kinds of the default jobs recorded on the GPU (counterpart's jobs_<gpu>.json): Generate's prefill
    and decode, each of Compare's runs (the cache on and off, eager and graph, both backends) and each rung of
    the ladder's graph replay (phase "replay": the replay alone, no step around it)."""
    bw = meta["bandwidth_gbs"]
    out = []
    if "generate" in jobs:
        g = jobs["generate"]
        settings = g["key"]["settings"]
        dtype = settings["dtype"]
        out += points(g["tables"]["steps"], g["tables"]["kernels"], settings, bw, tflops[dtype])
    if "compare" in jobs:
        c = jobs["compare"]
        settings = c["key"]["settings"]
        frame = c["tables"]["compare"]
        frame = frame.assign(roof=roof_ms(frame.hbm_mb, frame.modeled_gflop, bw, tflops[settings["dtype"]]))
        for (mode, cache, backend), run in frame.groupby(["launch_mode", "cache", "backend"]):
            # Compare's runs take the largest logit (sequence_runs): no sampling in their steps
            run_settings = dict(
                settings, backend=backend, cache=cache == "on", cuda_graph=mode != "eager", temperature=0.0
            )
            # each step's roof from the step's own bytes and FLOPs: Compare keeps no kernels table
            kernels = run[["step", "hbm_mb", "modeled_gflop"]].rename(columns={"modeled_gflop": "gflop"})
            out += points(run, kernels, run_settings, bw, tflops[settings["dtype"]])
    if "ladder" in jobs:
        key = jobs["ladder"]["key"]
        for r in jobs["ladder"]["tables"]["ladder"].itertuples(index=False):
            roof = float(roof_ms(r.hbm_mb, 0.0, bw, tflops[key["dtype"]]))
            out.append(Point(r.rung, "graph", "replay", roof, float(r.operations), float(r.step_ms)))
    return out


BLOCKS_RUNG = "epilogue"  # the blocks lesson's rung (lessons/blocks.py FUSION): each part of a block its own launch


def lesson_points(lessons: dict, bandwidth_gbs: float, tflops: float) -> list[Point]:
    """Decode steps the lessons recorded on the GPU (lessons_<gpu>.json, read by lessons.recorded: `lessons` its
    results by name), at settings no default job has: GPT-2
    small's shape in bf16 (the cuda-graphs lesson launched eagerly and replayed, the memory and prefill-decode
    lessons' replays) and the blocks lesson's GPT-2 and Llama at 1000 tokens (on its rung, BLOCKS_RUNG). The
    others are on the Triton backend's default rung, overlap. Each takes the largest logit. A step's operations
    are its lesson's count (the decode-step lesson's for GPT-2 small's shape at the same settings); the
    cuda-graphs lesson keeps no bytes, and takes the memory lesson's (the same model and dtype, its cache a few
    hundred kilobytes longer)."""
    ops = lessons["decode-step"].facts["operations"]
    memory = lessons["memory"].tables["steps"]
    memory = memory[memory.phase == "decode"]
    gflop = lessons["memory"].facts["last_gflop"]
    out = []

    def add(mode, roof, launches, ms, rung="overlap"):
        out.append(Point(rung, mode, "decode", float(roof), float(launches), float(ms), half=True))

    graphs = lessons["cuda-graphs"].tables["steps"]
    decode = graphs[graphs.phase == "decode"]
    roof = float(np.median(roof_ms(memory.hbm_mb, gflop, bandwidth_gbs, tflops)))
    for launch, mode in (("eager", "eager"), ("CUDA graph", "graph")):
        add(mode, roof, ops, decode[decode.launch == launch].latency_ms.median())
    add("graph", roof, ops, memory.latency_ms.median())
    pd_steps = lessons["prefill-decode"].tables["steps"]
    pd_steps = pd_steps[pd_steps.phase == "decode"]
    add(
        "graph",
        np.median(roof_ms(pd_steps.hbm_mb, pd_steps.modeled_gflop, bandwidth_gbs, tflops)),
        ops,
        pd_steps.latency_ms.median(),
    )
    blocks = lessons["blocks"]
    for family, name in (("GPT-2", "gpt2"), ("Llama", "llama")):
        kinds = blocks.tables["bytes"]
        hbm = kinds[kinds.family == family].hbm_mb.sum()
        steps = blocks.tables["steps"]
        steps = steps[(steps.family == family) & (steps.phase == "decode")]
        add(
            "graph",
            roof_ms(hbm, 0.0, bandwidth_gbs, tflops),
            blocks.facts[f"{name}_operations"],
            steps.latency_ms.median(),
            BLOCKS_RUNG,
        )
    return out


def from_jobs(meta: dict, jobs: dict, tflops: dict, held: list[Point] = ()) -> TimeModel:
    """The model fitted on the shipped default jobs' recordings, until a matrix is recorded: every cost it can
    tell apart from them, held against `held` (the lessons' recorded steps, lesson_points), which it never saw."""
    train = jobs_points(meta, jobs, tflops)
    model = fit(train, meta["bandwidth_gbs"], tflops, meta["gpu"], str(meta["date"])[:10])
    model.fitted_on = f"{len(train)} recorded steps of the default jobs"
    model.fit_error = max(factor(model.step_ms(p), p.measured_ms) for p in train)
    model.held_out, model.held_kind = len(held), "recorded lesson steps (bf16, two families)"
    model.held_out_error = max((factor(model.step_ms(p), p.measured_ms) for p in held), default=math.nan)
    return model


def model(folder: str | Path | None = None) -> TimeModel | None:
    """The time model fitted on the newest matrix recording, or None without one."""
    found = recordings.newest(folder, "matrix_*.json", _load)
    return None if found is None else _fitted(str(found[0]), os.path.getmtime(found[0]))
