"""What every job shares: when to stop."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Control:
    """When a job should end early: `stopping()` (asked to stop) or the deadline of its time budget."""

    stopping: Callable[[], bool]
    deadline: float  # time.monotonic() by which the job ends on its own

    def stopped(self) -> bool:
        return bool(self.stopping())

    def over(self) -> bool:
        return time.monotonic() > self.deadline

    def why(self) -> str | None:
        """Why the job should end now, in a line, or None."""
        if self.stopped():
            return "by you, before the end"
        if self.over():
            return "at the time budget"
        return None
