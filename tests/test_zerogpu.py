"""On ZeroGPU the GPU exists only inside calls decorated with spaces.GPU: building the app must not
touch CUDA, and every job must run inside such a call. The platform is faked here: a `spaces` module
that records what it wraps, and CUDA calls that fail the test if made."""

import sys
import types

import pytest
import torch


@pytest.fixture
def zero_gpu(monkeypatch):
    wrapped = {}

    def GPU(duration=None):  # noqa: N802 (the platform's name)
        def wrap(fn):
            def event(*args, **kwargs):
                return fn(*args, **kwargs)

            wrapped[fn.__module__.rsplit(".", 1)[-1] + "." + fn.__name__] = duration
            event.__wrapped__ = fn
            return event

        return wrap

    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as the platform reports it
    for name in ("init", "_lazy_init", "get_device_properties", "get_device_name", "current_device", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name, **k: pytest.fail(f"torch.cuda.{name} at build"))
    yield wrapped


def test_building_the_app_touches_no_cuda_and_runs_every_job_in_a_gpu_call(zero_gpu):
    from explorer.app import models, serve
    from explorer.app.runner import InlineRunner

    demo, _, runner = serve.app("bundled", ["gpt2"], False, warm=False)
    assert isinstance(runner, InlineRunner)  # the platform's own process per call, not a worker of ours
    assert set(zero_gpu) == {"generate.run", "sweep.run", "compare.run", "compare.ladder", "lesson.run"}
    assert all(isinstance(seconds, int) and seconds > 0 for seconds in zero_gpu.values())
    assert models.dtype_choices()[0] == "bfloat16"
    assert demo is not None


def test_elsewhere_jobs_run_in_a_worker_process(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    from explorer.app import runner

    assert not runner.zero_gpu()
