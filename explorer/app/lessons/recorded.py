"""Lessons recorded on a GPU (scripts/record_lessons.py writes assets/recorded/lessons_<gpu>.json), so that
a visitor without one sees the real curves beside the interpreter's, labelled with the GPU and the date.

A recording holds, per lesson, the job's settings, the facts its explanation quotes and the tables its
chart is drawn from: the lesson's own explain() and figure() redraw it exactly as on the GPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from .. import recordings
from .base import Result

FORMAT = 1
NONE_YET = (
    "**No GPU recording is available yet.** `python scripts/record_lessons.py` on a GPU writes one to "
    "`assets/recorded/`; until then this side stays empty rather than show numbers nobody measured."
)


@dataclass
class Recording:
    meta: dict  # gpu, device_type, date, torch, triton, transformers, command
    results: dict[str, Result]

    @property
    def label(self) -> str:
        """'recorded on NVIDIA H200, 2026-11-30'"""
        return f"recorded on {self.meta['gpu']}, {str(self.meta['date'])[:10]}"

    @property
    def versions(self) -> str:
        m = self.meta
        return f"torch {m.get('torch', '?')}, triton {m.get('triton', '?')}, transformers {m.get('transformers', '?')}"


def slug(gpu: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'geforce-rtx-4090': for the file's name."""
    words = gpu.lower().replace("nvidia", " ").split()
    return "-".join("".join(c for c in w if c.isalnum()) for w in words) or "gpu"


def to_json(meta: dict, results: dict[str, Result]) -> dict:
    lessons = {
        name: dict(
            settings=recordings.plain(r.settings),
            facts=recordings.plain(r.facts),
            device=r.device,
            seconds=round(r.seconds, 2),
            first_s=None if r.first_s is None else round(r.first_s, 2),
            kernels=list(r.kernels),
            rebuilt_s=None if r.rebuilt_s is None else round(r.rebuilt_s, 2),
            compile_s={k: round(v, 3) for k, v in r.compile_s.items()},
            tables={k: recordings.table(v) for k, v in r.tables.items()},
        )
        for name, r in results.items()
    }
    return {"format": FORMAT, **recordings.plain(meta), "lessons": lessons}


def save(path: str | Path, meta: dict, results: dict[str, Result]) -> Path:
    return recordings.write(path, to_json(meta, results))


def load(path: str | Path) -> Recording:
    return _load(str(path), os.path.getmtime(path))


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> Recording:
    meta, lessons = recordings.read(path, "recording", FORMAT, "lessons")
    recording = Recording(meta, {})
    for name, d in lessons.items():
        tables = {k: recordings.frame(v) for k, v in d["tables"].items()}
        recording.results[name] = Result(
            name,
            d["settings"],
            d["facts"],
            tables,
            d["device"],
            d["seconds"],
            recording.label,
            first_s=d.get("first_s"),
            kernels=tuple(d.get("kernels", ())),
            rebuilt_s=d.get("rebuilt_s"),
            compile_s=d.get("compile_s", {}),
        )
    return recording


def latest(folder: str | Path | None = None) -> Recording | None:
    """The newest recording made on a GPU in `folder` (assets/recorded/), or None."""
    found = recordings.newest(folder, "lessons_*.json", _load, keep=lambda r: r.meta.get("device_type") == "cuda")
    return found[1] if found else None
