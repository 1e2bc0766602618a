"""The traffic models against hardware counters, as recorded on a GPU by `python -m kernels.ncu_check`
(and, for the tiled kernels, ncu_l1_probe in experiments/README.md) and shipped in assets/recorded/ncu_*.json, so a
visitor without a GPU, or without ncu, sees how far each modeled number can be trusted."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pandas as pd

RECORDED = Path(__file__).resolve().parents[2] / "assets" / "recorded"


@functools.cache
def recorded(name: str = "ncu_h200.json") -> tuple[dict, pd.DataFrame]:
    """(what was recorded where: gpu, date, torch, triton, dtype, command; one row per case). Empty when
    the file is missing."""
    path = RECORDED / name
    if not path.is_file():
        return {}, pd.DataFrame()
    data = json.loads(path.read_text())
    rows = pd.DataFrame(data.pop("rows"))
    return data, rows
