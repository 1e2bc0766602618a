"""What the GPU recordings (assets/recorded/: the lessons', lessons/recorded.py; the jobs', counterpart.py; the
matrix of settings, gpu_time.py; the sweeps, gpu_sweeps.py) share: where they are, how a value or a table is
written to JSON and read back, and the stamp of the machine that made one."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd

FOLDER = Path(__file__).resolve().parents[2] / "assets" / "recorded"


def plain(value):
    """JSON without NaN: missing numbers as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "item"):  # numpy scalars
        return plain(value.item())
    return value


def table(df: pd.DataFrame) -> dict:
    """A DataFrame as {"columns", "data"}, numbers to five significant digits."""

    def cell(v):
        return float(f"{v:.5g}") if isinstance(v, float) and math.isfinite(v) else v  # five significant digits

    rows = [[cell(plain(v)) for v in row] for row in df.itertuples(index=False)]
    return {"columns": list(df.columns), "data": rows}


def frame(data: dict) -> pd.DataFrame:
    """table()'s {"columns", "data"} back as a DataFrame, its columns of numbers (nulls among them) numeric."""
    df = pd.DataFrame(data["data"], columns=data["columns"])
    for column in df.columns:
        values = df[column]
        if values.map(lambda v: v is None or (isinstance(v, int | float) and not isinstance(v, bool))).all():
            df[column] = pd.to_numeric(values.astype(float))
    return df


def write(path: str | Path, body: dict) -> Path:
    """A recording's JSON (already plain) to `path`, its folder made where missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, separators=(",", ":"), allow_nan=False))
    return path


def read(path: str | Path, what: str, fmt: int, body: str) -> tuple[dict, dict]:
    """A recording's JSON: (its meta, every key but "format" and `body`; its `body`). A recording in another
    format than `fmt` is refused, naming `what` it is."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != fmt:
        raise ValueError(f"{path}: {what} format {data.get('format')!r}, this app reads {fmt}")
    return {k: v for k, v in data.items() if k not in ("format", body)}, data[body]


def stamp(command: str) -> dict:
    """Where and when a recording is made on this machine's GPU: its name, the time, the versions that ran."""
    import datetime
    import importlib.metadata
    import platform

    import torch

    return dict(
        gpu=torch.cuda.get_device_name(),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        triton=importlib.metadata.version("triton"),
        python=platform.python_version(),
        command=command,
    )


def newest(folder, pattern: str, load, keep=lambda recording: True) -> tuple[Path, object] | None:
    """(path, recording) of the recording matching `pattern` in `folder` (assets/recorded/ by default) whose meta
    has the latest date, among those `keep` accepts; `load(path, mtime)` is its module's cached reader. None if
    there is none."""
    found = [(p, load(str(p), os.path.getmtime(p))) for p in sorted(Path(folder or FOLDER).glob(pattern))]
    found = [(p, r) for p, r in found if keep(r)]
    return max(found, key=lambda pr: str(pr[1].meta.get("date", "")), default=None)
