"""Fixtures for the suite: on CPU the kernels run in Triton's interpreter, on a GPU compiled.

On a GPU the suite can run for another GPU a Space offers, the real one standing for it (kernels.config.
standing_in: that GPU's shared memory and forms, the real GPU's SMs). On the H200, for ZeroGPU's RTX Pro 6000:
    EXPLORER_GPU_STANDS_FOR=sm_120 python -m pytest -n 16 tests
"""

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
    # The tests that take the GPU alone first: each waits until every running test has ended, so one that
    # comes mid-run idles fifteen workers behind the longest of them. Scattered through a warm GPU suite of
    # 271 s, the twenty-five of them left each worker with 45-76 s of its own tests. Then the long tests
    # (browser, server, fuzz): under -n the workers then end on short tests, and none waits a minute at the
    # end for another's last one.
    items.sort(key=lambda item: ("gpu_alone" not in item.fixturenames, "slow" not in item.keywords))
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


def _lock_file(name):
    import tempfile

    return open(os.path.join(tempfile.gettempdir(), f"explorer-gpu-{name}.lock"), "w")


@pytest.fixture(autouse=True)
def gpu_shared(request):
    """Under `pytest -n 16` every test on a GPU machine shares the GPU (a shared file lock, across the
    workers), except while a timing test holds it alone (gpu_alone)."""
    if not torch.cuda.is_available() or "gpu_alone" in request.fixturenames:
        yield
        return
    import fcntl

    with _lock_file("turnstile") as turnstile, _lock_file("shared") as shared:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # a timing test waiting for the GPU holds this: wait behind it
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(shared, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(shared, fcntl.LOCK_UN)


@pytest.fixture
def gpu_alone():
    """For a test that compares two timings. Under `pytest -n 16` the other workers' kernels would share the
    GPU, and a kernel timed while another process's kernels run takes that much longer (the GPU time-slices
    between processes, and the profiler counts the slices given away). So a timing test first stops new
    tests from starting (the turnstile), then waits until the running ones have finished (the shared lock
    taken exclusively), and measures with the GPU to itself; it may measure again, up to three times."""
    import fcntl

    with _lock_file("turnstile") as turnstile, _lock_file("shared") as shared:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(shared, fcntl.LOCK_EX)
        try:
            yield range(3)
        finally:
            fcntl.flock(shared, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


def pytest_runtest_logreport(report):
    """With PYTEST_REPORT_DIR set, each test's outcome, seconds and failure text are appended to a file of
    that folder as the test ends (one file a worker), so a run its time limit stops still says why its
    failures failed and which tests took the time; pytest's own summary comes only at the end."""
    folder = os.environ.get("PYTEST_REPORT_DIR")
    if not folder or (report.when != "call" and report.passed) or hasattr(report, "node"):
        return  # (a report with a node is a worker's, seen again by xdist's controller)
    import json

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {"test": report.nodeid, "when": report.when, "outcome": report.outcome, "s": round(report.duration, 2)}
    if report.failed:
        line["why"] = str(report.longrepr)[-3000:]
    with open(os.path.join(folder, f"tests-{worker}.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")
