"""Lessons recorded on a GPU (scripts/record_lessons.py writes assets/recorded/lessons_<gpu>.json), so that
a visitor without one sees the real curves beside the interpreter's, labelled with the GPU and the date.

A recording holds, per lesson, the job's settings, the facts its explanation quotes and the tables its
chart is drawn from: the lesson's own explain() and figure() redraw it exactly as on the GPU.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import recordings
from .base import Result

FORMAT = 1
NONE_YET = (
    "**No GPU recording is available yet.** `python scripts/record_lessons.py` on a GPU writes one to "
    "`assets/recorded/`; until then this side stays empty rather than show numbers nobody measured."
)


# What a lesson recorded later into an existing file (scripts/record_lessons.py --into) keeps of its own run.
OWN_META = ("gpu", "date", "torch", "triton", "transformers")


@dataclass
class Recording:
    meta: dict  # gpu, device_type, date, torch, triton, transformers, command
    results: dict[str, Result]
    own: dict[str, dict] = field(default_factory=dict)  # lessons recorded later into this file: their OWN_META

    def meta_of(self, name: str | None = None) -> dict:
        """The recording's meta, or where lesson `name` was recorded later into it, that lesson's run's."""
        return self.meta | self.own.get(name, {})

    def label_of(self, name: str | None = None) -> str:
        """'recorded on NVIDIA H200, 2026-11-30'"""
        m = self.meta_of(name)
        return f"recorded on {m['gpu']}, {str(m['date'])[:10]}"

    def versions_of(self, name: str | None = None) -> str:
        m = self.meta_of(name)
        return f"torch {m.get('torch', '?')}, triton {m.get('triton', '?')}, transformers {m.get('transformers', '?')}"

    @property
    def label(self) -> str:
        return self.label_of()

    @property
    def versions(self) -> str:
        return self.versions_of()


def slug(gpu: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'geforce-rtx-4090': for the file's name."""
    words = gpu.lower().replace("nvidia", " ").split()
    return "-".join("".join(c for c in w if c.isalnum()) for w in words) or "gpu"


def to_json(meta: dict, results: dict[str, Result], own: dict[str, dict] | None = None) -> dict:
    """own: lessons recorded later than the rest, by name, with their OWN_META."""
    own = own or {}
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
        | ({"meta": recordings.plain(own[name])} if name in own else {})
        for name, r in results.items()
    }
    return {"format": FORMAT, **recordings.plain(meta), "lessons": lessons}


def save(path: str | Path, meta: dict, results: dict[str, Result], own: dict[str, dict] | None = None) -> Path:
    return recordings.write(path, to_json(meta, results, own))


def merge(path: str | Path, meta: dict, results: dict[str, Result]) -> Path:
    """Lessons recorded just now (`meta`: this run's) written into the recording at `path`, each replacing its
    older run and labelled with this run's GPU, date and versions; the file's other lessons stay as they were."""
    old = load(path)
    own = {k: v for k, v in old.own.items() if k not in results}
    own |= {name: {k: meta[k] for k in OWN_META if k in meta} for name in results}
    return save(path, old.meta, old.results | results, own)


def load(path: str | Path) -> Recording:
    return _load(str(path), os.path.getmtime(path))


@functools.lru_cache(maxsize=8)
def _load(path: str, mtime: float) -> Recording:
    meta, lessons = recordings.read(path, "recording", FORMAT, "lessons")
    recording = Recording(meta, {})
    for name, d in lessons.items():
        if "meta" in d:
            recording.own[name] = d["meta"]
        tables = {k: recordings.frame(v) for k, v in d["tables"].items()}
        recording.results[name] = Result(
            name,
            d["settings"],
            d["facts"],
            tables,
            d["device"],
            d["seconds"],
            recording.label_of(name),
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
