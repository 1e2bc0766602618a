"""What the GPU recordings (assets/recorded/: the lessons', lessons/recorded.py, and the jobs', counterpart.py)
share: where they are, and how a value or a table is written to JSON and read back."""

from __future__ import annotations

import math
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
