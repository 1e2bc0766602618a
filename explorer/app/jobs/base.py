"""What every job shares: when to stop, and how a failure reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import UserError


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


def friendly(e: Exception) -> UserError:
    """Any failure as one message a visitor can act on, never a trace."""
    if isinstance(e, UserError):
        return e
    if isinstance(e, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return UserError(
            "The GPU ran out of memory for these settings: lower the batch, the new tokens or the "
            "prompt length, or pick a smaller model."
        )
    name = type(e).__name__
    if name == "OutOfResources":  # Triton: the tiles need more shared memory or registers than the GPU has
        return UserError(f"These tiles do not fit this GPU ({e}); pick smaller tiles or 'default'.")
    if isinstance(e, ValueError):  # validation of tiles, dtypes, lengths and models says what and why
        return UserError(str(e))
    return UserError(f"The run failed: {name}: {e}")
