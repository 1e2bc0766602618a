"""What this worker knows of compiling: the seconds its warm-up's Generate took, the settings it has run (whose
kernels it holds) and the GPU's measured ceilings. The warm-up (warm.py) writes the first; the Generate job reads
all three to say on the page when a run will compile kernels, and for how long."""

from __future__ import annotations

import functools

from ...measure import metrics
from .. import models

COMPILE_S = 30.0  # a whole decoder's kernels compiled from nothing on a GPU, before one was timed here
_state = {"compile_s": None, "warm": set()}


@functools.cache
def peaks():
    """The GPU's measured ceilings (copy bandwidth, matmul rate), once per worker; None on CPU."""
    return metrics.device_peaks(str(models.device()), models.dtype_of(""))


def compile_note(key, device: str, known_s: float | None = None) -> str | None:
    """On a GPU, the first run of `key`'s settings in this worker compiles kernels: say so, and how long.
    `known_s` is the server's estimate of the job's compile seconds, 0 where these settings have run since the
    server started (their kernels are in Triton's cache on disk): a process that is new to the job (a restarted
    worker, each ZeroGPU call) has no other way to know."""
    if device != "cuda" or key in _state["warm"] or known_s == 0:
        return None
    seconds = _state["compile_s"] or known_s or COMPILE_S
    return (
        f"Compiling Triton kernels for this GPU and these settings (first run here; about {seconds:.0f} s at most, "
        "often less: kernels compiled before are read from Triton's cache)…"
    )


def remember_warm(key) -> None:
    _state["warm"].add(key)


def remember_compile(seconds: float) -> None:
    """The warm-up's Generate, compile included, took `seconds` on this GPU: what a first run's note says."""
    _state["compile_s"] = max(seconds, 1.0)
