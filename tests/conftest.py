import os

import pytest
import torch

# Without a GPU the kernels run in Triton's interpreter; it must be chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist each worker is a process: the machine's cores are shared among them, and among the app
# workers they start (which read OMP_NUM_THREADS). Sixteen workers of sixteen PyTorch threads each on the
# GPU machine's 16 cores spent most of their time waiting for each other: the sampling tests, a few seconds
# on CPU, took 80-145 s there.
_share = max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
os.environ.setdefault("OMP_NUM_THREADS", str(_share))
torch.set_num_threads(min(torch.get_num_threads(), _share))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def poison_outputs():
    """Every buffer a launcher allocates starts as NaN, so an unwritten element fails its test."""
    import kernels.config

    with kernels.config.poisoned_outputs():
        yield


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
