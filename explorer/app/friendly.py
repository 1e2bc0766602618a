"""Any failure of the heavy work (a job, a lesson) as one message a visitor can act on, never a trace."""

from __future__ import annotations

import torch

from .errors import UserError


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
