"""The server's start, ordered so that its parts overlap: the job worker first, since its imports and warm-up
take most of start-up, and the page's own imports (Gradio) while it warms. The worker's warm-up ends its helpers
by HELPERS_UNTIL_S after the moment the server started (jobs.warm), so that the page is served within a minute of
it however long the imports took."""

from __future__ import annotations

import time
from collections.abc import Callable

from . import models
from .runner import ProcessRunner
from .settings import default_run
from .zerogpu import zero_gpu

# The page is served within SERVED_BY_S of the server's start: the helpers end FINISH_S before, the most that follows
# them (their reports read, a garbage collection, the page launched: 1.3 s on an H100, benchmarks/page.py, 2026-12-07).
SERVED_BY_S = 60.0
FINISH_S = 5.0
HELPERS_UNTIL_S = SERVED_BY_S - FINISH_S


def default_job(device: str, started_at: float | None = None) -> dict:
    """What the worker runs before it takes jobs: the default Generate, and on a GPU the default ladder; with
    `started_at` (the server's start, time.time()), when its helpers end at the latest ("helpers_until")."""
    s = default_run(device, models.default_dtype())
    until = started_at + HELPERS_UNTIL_S if started_at is not None else None
    return {"settings": s, "ladder": device == "cuda", "helpers_until": until}


def worker(warm: bool = True, log: Callable[[str], None] = print, started_at: float | None = None):
    """The job worker, started and not waited for (serve.app waits); None under ZeroGPU, where each job runs in
    the platform's own GPU call instead."""
    if zero_gpu():
        return None
    job = default_job(models.device().type, started_at if started_at is not None else time.time()) if warm else None
    r = ProcessRunner(warm=job, log=log)
    r.start(wait=False)
    return r
