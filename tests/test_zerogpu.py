"""On ZeroGPU the GPU exists only inside calls decorated with spaces.GPU: building the app must not
touch CUDA, and every handler that uses the GPU must be such a call. The platform is faked here:
a `spaces` module that records what it wraps, and CUDA calls that fail the test if made."""

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

            wrapped[fn.__name__] = duration
            event.__wrapped__ = fn
            return event

        return wrap

    from explorer.model import graphs

    monkeypatch.setattr(graphs, "KEEP", graphs.KEEP)  # restored after the test: building the app sets it
    monkeypatch.setitem(sys.modules, "spaces", types.SimpleNamespace(GPU=GPU))
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as the platform reports it
    for name in ("init", "_lazy_init", "get_device_properties", "get_device_name", "current_device", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name, **k: pytest.fail(f"torch.cuda.{name} at build"))
    from explorer.app import actions

    actions.header.cache_clear()
    yield wrapped
    actions.header.cache_clear()


def test_building_the_app_touches_no_cuda_and_wraps_every_gpu_event(zero_gpu):
    from explorer.app import ui

    demo = ui.build()
    assert set(zero_gpu) == {"generate", "sweep", "compare", "ladder", "lesson"}  # export writes a file: no GPU
    assert all(isinstance(seconds, int) and seconds > 0 for seconds in zero_gpu.values())
    handlers = {fn.api_name: fn for fn in demo.fns.values() if fn.api_name}
    for name in ("generate", "sweep", "compare", "ladder", "lesson"):
        assert handlers[name].fn.__wrapped__.__name__ == name  # the platform's wrapper is what runs
    assert handlers["export"].fn.__name__ == "export"
    from explorer.app import actions

    assert "ZeroGPU" in actions.header() and actions.dtype_choices()[0] == "bfloat16"
    from explorer.model import graphs

    assert graphs.KEEP == 0  # no captured graph is kept past the call that captured it


def test_elsewhere_the_handlers_run_as_they_are(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    from explorer.app import gpu

    handler = lambda: None  # noqa: E731
    assert gpu.event(handler, 60) is handler
