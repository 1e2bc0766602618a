"""Tables written as files for download (CSV or JSON), kept an hour."""

from __future__ import annotations

import errno
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
    made = None
    try:
        prune(folder)
        os.makedirs(folder, exist_ok=True)
        made = tempfile.mkdtemp(prefix="export-", dir=folder)
        return metrics.export(frame, os.path.join(made, f"{name}.{fmt}"))
    except OSError as e:  # the disk full, the folder read-only or a file in its place: no path in the message
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)  # no half-written file left to serve
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        why = "the server's disk is full" if full else "the server's exports folder cannot be written"
        raise UserError(
            f"The export could not be written: {why}. Nothing you made is lost: your results stay on the page; "
            "try again later."
        ) from None


def prune(folder: str = FOLDER, now: float | None = None) -> None:
    """Remove export folders older than MAX_AGE_S (Gradio keeps its own copy for the download, and removes
    it on its own schedule: see ui.build's delete_cache)."""
    now = time.time() if now is None else now
    if not os.path.isdir(folder):
        return
    for entry in os.scandir(folder):
        if entry.is_dir() and now - entry.stat().st_mtime > MAX_AGE_S:
            shutil.rmtree(entry.path, ignore_errors=True)
