"""The worker's start: what it says about its device, and the warm-up that makes the first click fast.

On a GPU, Triton compiles each kernel the first time it meets a new combination of tiles, dtypes and
shapes: tens of seconds for a whole decoder. The warm-up runs the default Generate (and, on a GPU, the
default ladder step) once before the worker takes jobs, so the first visitor's click waits only for its
own tokens; it reports the seconds of each stage to the server's log. A job whose settings this worker
has not run before says on the page that kernels are compiling, and about how long that takes.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import torch

from kernels.config import device_limits

from ...measure import metrics
from .. import models
from ..settings import RunSettings

COMPILE_S = 30.0  # a whole decoder's kernels compiled from nothing on a GPU, before one was timed here
_state = {"compile_s": None, "warm": set()}


@functools.cache
def peaks():
    """The GPU's measured ceilings (copy bandwidth, matmul rate), once per worker; None on CPU."""
    return metrics.device_peaks(str(models.device()), models.dtype_of(""))


def device_info() -> dict:
    dev = models.device()
    if dev.type != "cuda":
        return {
            "device": "cpu",
            "header": "**No GPU here: the kernels run in Triton's CPU interpreter.** Results are exact; every "
            "timing is a CPU timing and says so, with the same job as measured on a GPU beside it.",
        }
    p = peaks()
    return {"device": "cuda", "gpu": device_limits(dev).name, "header": f"**{p.label}**"}


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


def warm_up(settings: dict):
    """Run what the default controls run, once; yield a line per stage with its seconds."""
    from . import compare, generate
    from .base import Control

    s: RunSettings = settings["settings"]
    never = Control(lambda: False, float("inf"))
    t0 = time.monotonic()
    generate.prepare(s)
    yield f"loaded {s.model} in {time.monotonic() - t0:.1f} s"
    t1 = time.monotonic()
    for _ in generate.run({"settings": s}, never):
        pass
    took = time.monotonic() - t1
    if models.device().type == "cuda":
        _state["compile_s"] = max(took, 1.0)
    yield f"default Generate ({s.new_tokens} tokens, {s.fusion}, compile and profile included) in {took:.1f} s"
    if settings.get("ladder") and models.device().type == "cuda":
        t2 = time.monotonic()
        for _ in compare.ladder({"settings": s}, never):
            pass
        yield f"default ladder in {time.monotonic() - t2:.1f} s"
        t3 = time.monotonic()
        torch_first_calls()
        yield f"PyTorch's first prefills at GPT-2 small's shape in {time.monotonic() - t3:.1f} s"
        t4 = time.monotonic()
        triton_first_calls(s)
        yield f"Triton's kernels for the lessons' shape and the bundled Llama in {time.monotonic() - t4:.1f} s"
    yield f"warm in {time.monotonic() - t0:.1f} s"


def torch_first_calls(rows=(128, 143, 159)) -> None:
    """PyTorch's prefill at GPT-2 small's shape in bfloat16 (the lessons' model), at a few row counts: its first
    calls there load the library's kernels for those matrices (0.7 s on an H200, no Triton compile), which every
    profiling pass's prefills on that shape, and so the first run of each lesson on it, would otherwise pay."""
    from ...model.generate import generate
    from ..lessons import base

    model = base.model(dict(model=base.GPT2_SHAPE, dtype="bfloat16", backend="torch"))
    for n in rows:
        list(generate(model, base.prompt(model, n), max_new_tokens=1, warmup=False, graph=False, eos_token_id=-1))
    torch.cuda.synchronize()


def triton_first_calls(s: RunSettings) -> None:
    """The Triton kernels a visitor's first clicks would otherwise compile after the page says it is ready: the
    lessons' model (GPT-2 small's shape, bfloat16) with the cache on and off, and the bundled Llama's Generate with
    the cache on and off. Their lengths do not matter (the kernels do not specialise on them): a prompt past the
    decode rows, one step each. The rest is Triton's cache on disk, which a restart reads instead."""
    from ...model.generate import generate
    from ..lessons import base
    from . import generate as generate_job
    from .base import Control

    model = base.model(dict(model=base.GPT2_SHAPE, dtype="bfloat16", backend="triton"))
    for cache in (True, False):
        ids = base.prompt(model, 40)
        list(generate(model, ids, max_new_tokens=2, cache=cache, warmup=False, graph=False, eos_token_id=-1))
    never = Control(lambda: False, float("inf"))
    llama = dataclasses.replace(s, model="bundled-llama", new_tokens=2)
    for cache in (True, False):
        for _ in generate_job.run({"settings": dataclasses.replace(llama, cache=cache)}, never):
            pass
    torch.cuda.synchronize()
