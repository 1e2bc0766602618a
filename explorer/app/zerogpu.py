"""Whether this server runs on Hugging Face's ZeroGPU, where a GPU exists only inside a call decorated with
spaces.GPU: the runner, the dtypes offered and the launch all ask."""

from __future__ import annotations

import os


def zero_gpu() -> bool:
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
