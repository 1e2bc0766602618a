"""The timelines of one decode step on the SMs recorded on a GPU (scripts/record_timeline.py), for the page: each
bundled model at each rung, every program an interval on the SM that ran it (explorer.measure.timeline)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import recordings

FORMAT = 1


@dataclass
class Timelines:
    meta: dict
    steps: list[dict]  # model, fusion, graph, context, dtype, sms, step_ms, stamped_ms, problems, programs[, tasks]

    def find(self, model: str, fusion: str) -> dict | None:
        """The recorded step of `model` at `fusion`: its graph replay where there is one, else its eager step."""
        alike = [s for s in self.steps if s["model"] == model and s["fusion"] == fusion]
        return max(alike, key=lambda s: bool(s.get("graph")), default=None)


def save(path: str | Path, meta: dict, steps: list[dict]) -> Path:
    return recordings.write(path, {"format": FORMAT, **recordings.plain(meta), "steps": recordings.plain(steps)})


@functools.lru_cache(maxsize=2)
def _load(path: str, mtime: float) -> Timelines:
    meta, steps = recordings.read(path, "timeline", FORMAT, "steps")
    return Timelines(meta, steps)


def latest(folder: str | Path | None = None) -> Timelines | None:
    found = recordings.newest(folder, "timeline_*.json", _load)
    return found[1] if found else None


def figure(model: str, fusion: str, folder=None):
    """(plotly figure, None) of the recorded step at these settings, or (None, why there is none)."""
    from .timeline_figure import timeline_figure

    rec = latest(folder)
    if rec is None:
        return None, "No timeline is recorded: `python scripts/record_timeline.py` on a GPU records one."
    step = rec.find(model, fusion)
    if step is None:
        models = sorted({s["model"] for s in rec.steps})
        return None, f"A timeline is recorded for {', '.join(models)} at each Triton rung: pick one of them."
    how = "replayed from a CUDA graph" if step.get("graph") else "launched eagerly, each kernel from the host"
    tasks = pd.DataFrame(step["tasks"]) if step.get("tasks") else None
    stamped = "every program stamping its start, end and SM"
    if tasks is not None:
        stamped += ", every task of the megakernel its start, its inputs ready and its end"
    note = (
        f"{rec.meta['gpu']}, recorded {str(rec.meta['date'])[:10]}: {step['model']} at the {step['fusion']} rung, "
        f"{step['dtype']}, batch 1, {step['context']} tokens of cache, {how}; the step took {step['step_ms']:.3f} ms "
        f"({step['stamped_ms']:.3f} ms with {stamped}). Hover a bar: its "
        + ("task, and what it waits for." if tasks is not None else "program.")
    )
    return timeline_figure(pd.DataFrame(step["programs"]), step["sms"], note, tasks), None
