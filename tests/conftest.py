import os

import pytest
import torch

# Without a GPU the kernels run in Triton's interpreter; it must be chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """Every buffer a launcher allocates starts as NaN, so an unwritten element fails its test."""
    import kernels.config

    monkeypatch.setattr(kernels.config, "POISON_OUTPUTS", True)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.fixture
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gpu_alone():
    """For a test that compares two timings: under `pytest -n 16` other workers' kernels share the GPU, and a
    time measured while another process's kernels run is that much longer. Timing tests take turns on one
    lock (a file lock, across the workers), and each may measure again, up to three times, before it fails."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "explorer-gpu-timing.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield range(3)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
