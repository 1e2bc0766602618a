"""A stand-in for Hugging Face's `spaces` package as ZeroGPU runs it, put on the path of a child process by
tests/test_zerogpu.py. As on the platform, torch.cuda reports a GPU while no call holds one; unlike it, any
CUDA call made outside a GPU call is recorded (the test fails on it), and GPU(duration) records what it wraps and
what its duration asks for (a callable one, as the platform does, with the wrapped function's arguments)."""

import atexit
import json
import os

import torch

WRAPPED: dict[str, object] = {}
ASKED: list[int] = []
TOUCHED: list[str] = []


def GPU(duration=None):  # noqa: N802 (the platform's name)
    def wrap(fn):
        def call(*args, **kwargs):
            ASKED.append(duration(*args, **kwargs) if callable(duration) else duration)
            return fn(*args, **kwargs)

        WRAPPED[fn.__module__.rsplit(".", 1)[-1] + "." + fn.__name__] = "callable" if callable(duration) else duration
        call.__wrapped__ = fn
        return call

    return wrap


def _touched(name):
    return lambda *args, **kwargs: TOUCHED.append(name)


torch.cuda.is_available = lambda: True  # what the platform reports while the app is built
for _name in ("init", "_lazy_init", "get_device_properties", "get_device_name", "current_device", "synchronize"):
    setattr(torch.cuda, _name, _touched(_name))


@atexit.register
def _report():
    if os.environ.get("ZEROGPU_REPORT"):
        with open(os.environ["ZEROGPU_REPORT"], "w") as f:
            json.dump({"wrapped": WRAPPED, "touched": TOUCHED, "asked": ASKED}, f)
