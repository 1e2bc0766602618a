"""The tile sweeps recorded on a GPU (scripts/record_sweeps.py, assets/recorded/sweeps_<gpu>.json): every
kernel's grid at the sweep tab's default GPU shape, shown beside an interpreter's sweep of the same kernel."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kernels.config import TileConfig

from . import recordings

FORMAT = 1
TILE_FIELDS = {f.name for f in dataclasses.fields(TileConfig)}


@dataclass
class Sweeps:
    meta: dict  # gpu, date, versions, dtype
    frames: dict  # kernel -> the sweep's frame (sweeps.sweep_frame)

    @property
    def date(self) -> str:
        return str(self.meta.get("date", ""))[:10]

    def label(self, kernel: str) -> str:
        shape = self.frames[kernel]["shape"].iloc[0]
        return f"{self.meta['gpu']}, recorded {self.date} at {shape}, {self.meta['dtype']}"


def save(path: str | Path, meta: dict, frames: dict[str, pd.DataFrame]) -> Path:
    body = {"format": FORMAT, **recordings.plain(meta), "kernels": {k: recordings.table(f) for k, f in frames.items()}}
    return recordings.write(path, body)


@functools.lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> Sweeps:
    meta, kernels = recordings.read(path, "sweeps", FORMAT, "kernels")
    frames = {}
    for kernel, table in kernels.items():
        frame = recordings.frame(table)
        frame["valid"] = frame["valid"].astype(bool)
        frame["reason"] = frame["reason"].fillna("")
        for name in TILE_FIELDS & set(frame.columns):
            frame[name] = frame[name].astype("Int64")  # whole numbers, as the live sweep's are
        frames[kernel] = frame
    return Sweeps(meta, frames)


def latest(folder: str | Path | None = None) -> Sweeps | None:
    """The newest GPU sweeps recording in `folder` (assets/recorded/), or None."""
    found = recordings.newest(folder, "sweeps_*.json", _load)
    return found[1] if found else None
