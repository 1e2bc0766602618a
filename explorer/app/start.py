"""The server's start, ordered so that its parts overlap: the job worker first, since its imports and warm-up
take most of start-up, and the page's own imports (Gradio) while it warms. app.py stamps the moment the server
started before anything else (stamp: this module imports nothing heavy, since under ZeroGPU `spaces` must come
before torch); the worker, which inherits the stamp, ends its warm-up's helpers in time for the page to be served
within a minute of it (jobs.warm)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .runner import ProcessRunner

STARTED_ENV = "EXPLORER_STARTED_AT"  # the server's start, as time.time() wrote it


def stamp() -> None:
    """Mark this moment as the server's start, for the worker started from it (and its helpers' deadline)."""
    os.environ[STARTED_ENV] = repr(time.time())


def since_start() -> float | None:
    """Seconds since the server's start, where it was stamped; else None."""
    try:
        return time.time() - float(os.environ[STARTED_ENV])
    except (KeyError, ValueError):
        return None


def default_job(device: str) -> dict:
    """What the worker runs before it takes jobs: the default Generate, and on a GPU the default ladder."""
    from . import models
    from .settings import RunSettings, defaults

    d = defaults(device, {"dtype": models.default_dtype()})
    s = RunSettings(prompt=d["prompt"], new_tokens=d["new_tokens"], dtype=d["dtype"])
    return {"settings": s, "ladder": device == "cuda"}


def worker(warm: bool = True, log: Callable[[str], None] = print) -> ProcessRunner | None:
    """The job worker, started and not waited for (serve.app waits); None under ZeroGPU, where each job runs in
    the platform's own GPU call instead."""
    from . import models
    from .runner import ProcessRunner
    from .zerogpu import zero_gpu

    if zero_gpu():
        return None
    r = ProcessRunner(warm=default_job(models.device().type) if warm else None, log=log)
    r.start(wait=False)
    return r
