"""The GPU's answer beside a CPU run, so that no interpreter timing is left to teach the wrong lesson.

Without a GPU the kernels run in Triton's interpreter, whose clock measures Python running each program:
there a cache-off step can look cheaper than a cache-on one and the fused rungs slower than no fusion.
Every chart that shows a CPU timing therefore shows, beside it, the same job on a GPU:
- recorded: the job the CPU visitor runs by default (Generate, Compare, the ladder), run on an H200 with
  the same settings by `python scripts/record_lessons.py` and shipped in assets/recorded/jobs_<gpu>.json;
- modeled, for any other settings: each kernel's modeled HBM bytes over the recorded GPU's measured copy
  bandwidth, a floor on its time (real kernels add launch gaps and small-kernel inefficiency), labelled so.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ..measure.metrics import MB
from . import recordings
from .recordings import FOLDER
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, separators=(",", ":"), allow_nan=False))
    return path


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> Recording:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: recording format {data.get('format')!r}, this app reads {FORMAT}")
    meta = {k: v for k, v in data.items() if k not in ("format", "jobs")}
    jobs = {
        kind: {
            "key": j["key"],
            "tables": {k: recordings.frame(v) for k, v in j["tables"].items()},
            "summary": j["summary"],
        }
        for kind, j in data["jobs"].items()
    }
    return Recording(meta, jobs)


def latest(folder: str | Path | None = None) -> Recording | None:
    """The newest recording of jobs made on a GPU in `folder` (assets/recorded/), or None."""
    paths = sorted(Path(folder or FOLDER).glob("jobs_*.json"))
    found = [_load(str(p), os.path.getmtime(p)) for p in paths]
    return max(found, key=lambda r: str(r.meta.get("date", "")), default=None)


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


def _modeled(rec: Recording, tables: dict[str, pd.DataFrame]) -> Counterpart:
    bw = rec.meta["bandwidth_gbs"]
    label = f"{rec.meta['gpu']}, modeled: each kernel's HBM bytes at its measured {bw:,.0f} GB/s (a floor)"
    return Counterpart(
        False, rec.meta["gpu"], label, bw, rec.meta["tflops"], tables, {}, rec.meta.get("tflops_dtype", "float32")
    )


def seconds_at(mb, bandwidth_gbs: float):
    """Milliseconds that `mb` (MiB) take at `bandwidth_gbs`."""
    return mb * MB / (bandwidth_gbs * 1e9) * 1e3


def for_generate(s: RunSettings, steps: pd.DataFrame, kernels: pd.DataFrame, folder=None) -> Counterpart | None:
    """The GPU's answer to a CPU generation: the recording of the same job, else modeled from its bytes."""
    rec = latest(folder)
    if rec is None:
        return None
    found = _of(rec, "generate", {"settings": settings_key(s)})
    if found is not None:
        return found
    bw = rec.meta["bandwidth_gbs"]
    gpu_steps = steps.assign(latency_ms=seconds_at(steps.hbm_mb, bw), timer="modeled")
    gpu_steps["achieved_gbs"] = bw
    gpu_kernels = kernels.assign(kernel_ms=seconds_at(kernels.hbm_mb, bw))
    return _modeled(rec, {"steps": gpu_steps, "kernels": gpu_kernels})


def for_compare(s: RunSettings, lengths: list[int], frame: pd.DataFrame, folder=None) -> Counterpart | None:
    rec = latest(folder)
    if rec is None:
        return None
    found = _of(rec, "compare", {"settings": settings_key(s), "lengths": list(lengths)})
    if found is not None:
        return found
    return _modeled(rec, {"compare": frame.assign(latency_ms=seconds_at(frame.hbm_mb, rec.meta["bandwidth_gbs"]))})


def for_ladder(s: RunSettings, context: int, frame: pd.DataFrame, folder=None) -> Counterpart | None:
    rec = latest(folder)
    if rec is None:
        return None
    key = {"model": s.model, "dtype": s.dtype, "batch": s.batch, "context": context}
    found = _of(rec, "ladder", key)
    if found is not None:
        return found
    return _modeled(rec, {"ladder": frame.assign(step_ms=seconds_at(frame.hbm_mb, rec.meta["bandwidth_gbs"]))})


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
