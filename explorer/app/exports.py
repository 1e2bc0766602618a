"""Tables written as files for download (CSV or JSON), kept an hour."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import pandas as pd

from ..measure import metrics
from .errors import UserError

FOLDER = os.path.join(tempfile.gettempdir(), "explorer-exports")
MAX_AGE_S = 3600  # an exported file is kept this long, for its download


def export(frame: pd.DataFrame | None, name: str, fmt: str, folder: str = FOLDER) -> str:
    if frame is None or len(frame) == 0:
        raise UserError("Nothing to export yet: run something first.")
    prune(folder)
    os.makedirs(folder, exist_ok=True)
    return metrics.export(frame, os.path.join(tempfile.mkdtemp(prefix="export-", dir=folder), f"{name}.{fmt}"))


def prune(folder: str = FOLDER, now: float | None = None) -> None:
    """Remove export folders older than MAX_AGE_S (Gradio keeps its own copy for the download, and removes
    it on its own schedule: see ui.build's delete_cache)."""
    now = time.time() if now is None else now
    if not os.path.isdir(folder):
        return
    for entry in os.scandir(folder):
        if entry.is_dir() and now - entry.stat().st_mtime > MAX_AGE_S:
            shutil.rmtree(entry.path, ignore_errors=True)
