"""The page's heavy work, as jobs: plain generator functions `job(payload, control)` that yield what the
page should show (dicts keyed by output name) as soon as there is something new to show.

They run in the job worker (explorer.app.worker, started by explorer.app.runner), which holds the models
and the device; `control` says when to stop (Stop pressed, the tab closed, the time budget spent), and
every job checks it between tokens, configs, runs or rungs. A job that cannot check in time (one long
interpreter launch) is stopped by its worker being ended.
"""

from __future__ import annotations

from ..friendly import friendly
from . import compare, generate, lesson, occupancy, sweep, warm
from .base import Control

JOBS = {
    "generate": generate.run,
    "sweep": sweep.run,
    "compare": compare.run,
    "ladder": compare.ladder,
    "lesson": lesson.run,
    "occupancy": occupancy.run,
}
device_info = warm.device_info
warm_up = warm.warm_up

__all__ = ["JOBS", "Control", "device_info", "friendly", "warm_up"]
