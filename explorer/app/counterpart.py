"""The GPU's answer beside a CPU run, so that no interpreter timing is left to teach the wrong lesson.

Without a GPU the kernels run in Triton's interpreter, whose clock measures Python running each program:
there a cache-off step can look cheaper than a cache-on one and the fused rungs slower than no fusion.
Every chart that shows a CPU timing therefore shows, beside it, the same job on a GPU:
- recorded: the job the CPU visitor runs by default (Generate, Compare, the ladder), run on an H200 with
  the same settings by `python scripts/record_lessons.py` and shipped in assets/recorded/jobs_<gpu>.json;
- recorded in the matrix of settings (Generate at both bundled models, every dtype, rung, batch and a few
  tiles and lengths, scripts/record_matrix.py, assets/recorded/matrix_<gpu>.json): shown as recorded;
- modeled, for any other settings, by the GPU time model (gpu_time.py), fitted on that matrix or, until one
  is shipped, on the default jobs' recorded steps: each kernel's bytes at the GPU's bandwidth or its FLOPs at
  the dtype's peak, plus the launch costs of its rung, labelled with how far it was from the recorded steps
  held out of its fit. A modeled time has no achieved bandwidth: that needs a measured time.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from . import gpu_time, models, recordings
from .settings import RunSettings

FORMAT = 1


@dataclass
class Counterpart:
    """A GPU's timings of a job: recorded there, or modeled from this run's bytes."""

    recorded: bool
    gpu: str  # "NVIDIA H200"
    label: str  # what it is, for a chart's title or a table's column
    bandwidth_gbs: float  # the GPU's measured copy bandwidth
    tflops: float
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # steps, kernels, compare, ladder
    summary: dict = field(default_factory=dict)
    tflops_dtype: str = "float32"  # the dtype of the product `tflops` timed: the CPU's jobs, recorded in float32


@dataclass
class Recording:
    meta: dict  # gpu, date, versions, peaks
    jobs: dict  # kind -> {"payload": ..., "tables": {...}, "summary": {...}}

    @property
    def date(self) -> str:
        return str(self.meta.get("date", ""))[:10]


def settings_key(s: RunSettings) -> dict:
    """What makes two runs the same job on a GPU: every setting but the CUDA-graph box (a CPU cannot tick
    it; the GPU runs as it would by default) and the seed of a greedy run."""
    d = json.loads(json.dumps(dataclasses.asdict(s), default=str))
    d.pop("cuda_graph")
    if s.temperature == 0:
        d.pop("seed")
    return d


def save(path: str | Path, meta: dict, jobs: dict) -> Path:
    """jobs: kind -> (key, tables, summary)."""
    body = {
        "format": FORMAT,
        **recordings.plain(meta),
        "jobs": {
            kind: {
                "key": recordings.plain(key),
                "tables": {k: recordings.table(v) for k, v in tables.items()},
                "summary": recordings.plain(summary),
            }
            for kind, (key, tables, summary) in jobs.items()
        },
    }
    return recordings.write(path, body)


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> Recording:
    meta, body = recordings.read(path, "recording", FORMAT, "jobs")
    jobs = {
        kind: {
            "key": j["key"],
            "tables": {k: recordings.frame(v) for k, v in j["tables"].items()},
            "summary": j["summary"],
        }
        for kind, j in body.items()
    }
    return Recording(meta, jobs)


def latest(folder: str | Path | None = None) -> Recording | None:
    """The newest recording of jobs made on a GPU in `folder` (assets/recorded/), or None."""
    found = recordings.newest(folder, "jobs_*.json", _load)
    return found[1] if found else None


def _of(rec: Recording, kind: str, key: dict) -> Counterpart | None:
    job = rec.jobs.get(kind)
    if job is None or job["key"] != key:
        return None
    label = f"{rec.meta['gpu']}, recorded {rec.date}: the same job"
    return Counterpart(
        True,
        rec.meta["gpu"],
        label,
        rec.meta["bandwidth_gbs"],
        rec.meta["tflops"],
        dict(job["tables"]),
        dict(job["summary"]),
        rec.meta.get("tflops_dtype", "float32"),
    )


def _modeled(model: gpu_time.TimeModel, dtype: str, tables: dict[str, pd.DataFrame]) -> Counterpart:
    return Counterpart(False, model.gpu, model.label(), model.bandwidth_gbs, model.tflops[dtype], tables, {}, dtype)


_JOBS_MODELS: dict = {}


def time_model(rec: Recording | None, folder=None) -> gpu_time.TimeModel | None:
    """The GPU time model: fitted on the matrix recording where one is shipped, else on the default jobs'."""
    found = gpu_time.model(folder)
    if found is not None or rec is None:
        return found
    key = (str(folder), rec.meta["gpu"], rec.meta["date"])
    if key not in _JOBS_MODELS:
        from .lessons import recorded  # the lessons' recording, read as the lessons read it

        found = recorded.latest(folder)
        lessons = found.results if found is not None and found.meta.get("gpu") == rec.meta["gpu"] else {}
        # the tensor cores' peak as the memory lesson measured it (bf16; fp16 runs at the same), else fp32's
        tensor = lessons["memory"].facts["peak_tflops"] if "memory" in lessons else rec.meta["tflops"]
        tflops = {"float32": rec.meta["tflops"], "float16": tensor, "bfloat16": tensor}
        try:
            held = gpu_time.lesson_points(lessons, rec.meta["bandwidth_gbs"], tensor) if lessons else []
        except KeyError:  # a recording without one of the lessons it draws on: the model says it was not held
            held = []
        _JOBS_MODELS[key] = gpu_time.from_jobs(rec.meta, rec.jobs, tflops, held)
    return _JOBS_MODELS[key]


def ran(s: RunSettings) -> str:
    """The dtype a run's settings ran in: theirs, or this machine's default where they leave it to the device
    (float32 on a CPU, whose run the GPU's answer is priced from)."""
    return s.dtype or models.default_dtype()


def _matrix_row(s: RunSettings, folder) -> Counterpart | None:
    m = gpu_time.matrix(folder)
    row = m.find({"settings": settings_key(s)}) if m is not None else None
    if row is None:
        return None
    gpu, date = m.meta["gpu"], str(m.meta["date"])[:10]
    return Counterpart(
        True,
        gpu,
        f"{gpu}, recorded {date}: the same job",
        m.meta["bandwidth_gbs"],
        m.meta["tflops"][ran(s)],
        {"steps": row["steps"], "kernels": row["kernels"]},
        dict(row.get("summary") or {}),
        ran(s),
    )


def for_generate(s: RunSettings, steps: pd.DataFrame, kernels: pd.DataFrame, folder=None) -> Counterpart | None:
    """The GPU's answer to a CPU generation: the recording of the same job, else the time model's."""
    rec = latest(folder)
    found = _of(rec, "generate", {"settings": settings_key(s)}) if rec is not None else None
    found = found or _matrix_row(s, folder)
    if found is not None:
        return found
    model = time_model(rec, folder)
    if model is None:
        return None
    key = settings_key(s)
    gpu_steps = steps.assign(
        latency_ms=model.step_times(steps, kernels, key, ran(s)), timer="modeled", achieved_gbs=float("nan")
    )
    gpu_kernels = kernels.assign(kernel_ms=model.kernel_times(kernels, ran(s)), achieved_gbs=float("nan"))
    return _modeled(model, ran(s), {"steps": gpu_steps, "kernels": gpu_kernels})


def for_compare(s: RunSettings, lengths: list[int], frame: pd.DataFrame, folder=None) -> Counterpart | None:
    rec = latest(folder)
    found = None
    if rec is not None:
        found = _of(rec, "compare", {"settings": settings_key(s), "lengths": list(lengths)})
    if found is not None:
        return found
    model = time_model(rec, folder)
    if model is None:
        return None
    key = settings_key(s)
    half = gpu_time.half(ran(s))
    times = []  # Compare's runs take the largest logit (sequence_runs): no sampling in their steps
    for row in frame.itertuples(index=False):
        settings = dict(key, backend=row.backend, cache=row.cache == "on", cuda_graph=row.launch_mode != "eager")
        mode = gpu_time.mode_of(row.phase, settings["cache"], settings["cuda_graph"])
        roof = gpu_time.roof_ms(row.hbm_mb, row.modeled_gflop, model.bandwidth_gbs, model.tflops[ran(s)])
        point = gpu_time.Point(
            gpu_time.rung_of(settings), mode, row.phase, float(roof), float(row.operations), half=half
        )
        times.append(model.step_ms(point))
    modeled = frame.assign(latency_ms=times, achieved_gbs=float("nan"), timer="modeled")
    return _modeled(model, ran(s), {"compare": modeled})


def for_ladder(s: RunSettings, context: int, frame: pd.DataFrame, folder=None) -> Counterpart | None:
    """The ladder's GPU answer: its recording, else each rung's step as one graph replay, modeled (the
    replay alone: no sampling and no step cost around it)."""
    rec = latest(folder)
    key = {"model": s.model, "dtype": s.dtype, "batch": s.batch, "context": context}
    found = _of(rec, "ladder", key) if rec is not None else None
    if found is not None:
        return found
    model = time_model(rec, folder)
    if model is None:
        return None
    times = []
    for r in frame.itertuples(index=False):
        roof = float(gpu_time.roof_ms(r.hbm_mb, 0.0, model.bandwidth_gbs, model.tflops[ran(s)]))
        times.append(model.step_ms(gpu_time.Point(r.rung, "graph", "replay", roof, float(r.operations))))
    return _modeled(model, ran(s), {"ladder": frame.assign(step_ms=times)})


def cache_note(compare: pd.DataFrame, gpu: str) -> str:
    """Why a GPU's Compare shows the cache off as fast as on, or faster, where it does: at a small model's size
    and a short context, a cache-off step's recompute is a prefill of a few rows, whose kernels cost what a
    one-row step's do (each a launch and one read of the weights), and the cache-on step launches more of them
    (its cache writes and attention over the cache). The cache pays off once the context is long enough for the
    recompute's work to outweigh that (the KV-cache lesson shows where)."""
    eager = compare[(compare.phase == "decode") & (compare.get("launch_mode", "eager") == "eager")]
    medians = eager.groupby(["backend", "cache"]).latency_ms.median()
    slower = [b for b in medians.index.get_level_values(0).unique() if medians[b].get("off", 1e9) <= medians[b]["on"]]
    if not slower:
        return ""
    times = ", ".join(f"{b}: {medians[b]['off']:.2f} ms off against {medians[b]['on']:.2f} on" for b in slower)
    return (
        f"On the {gpu} the cache off ran as fast as on here ({times}, launched one by one): at this size a cache-off "
        "step recomputes a prefix of a few tokens, which costs a GPU what a one-token step does (each kernel a "
        "launch and one read of the weights), and a cache-on step launches more kernels (its cache writes). The "
        "cache pays once the context is long enough for the recompute to outweigh that: see the KV-cache lesson."
    )
