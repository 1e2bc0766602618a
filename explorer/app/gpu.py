"""GPU events: the handlers that use the GPU.

On Hugging Face's ZeroGPU hardware (the platform sets SPACES_ZERO_GPU) a GPU is attached to the
process only for the duration of a call decorated with spaces.GPU, and CUDA must not be touched
outside one: not at import, not while the app is built. There, each event is wrapped with an
estimate of how long it needs; everywhere else the handlers run as they are.
"""

from __future__ import annotations

import os


def zero_gpu() -> bool:
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


def event(fn, duration):
    """fn as a GPU event: on ZeroGPU, spaces.GPU(duration=duration)(fn); elsewhere fn itself.
    `duration` is seconds, or a function of fn's arguments that estimates them."""
    if not zero_gpu():
        return fn
    import spaces

    from ..model import graphs

    graphs.KEEP = 0  # a GPU attached per call: no captured graph may outlive the call that captured it

    return spaces.GPU(duration=duration)(fn)
