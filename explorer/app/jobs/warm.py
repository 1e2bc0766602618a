"""The worker's start: what it says about its device, and the warm-up that makes the first click fast.

On a GPU, Triton compiles each kernel the first time it meets a new combination of tiles, dtypes and
shapes: tens of seconds for a whole decoder. The warm-up runs the default Generate (and, on a GPU, the
default ladder step) once before the worker takes jobs, so the first visitor's click waits only for its
own tokens; it reports the seconds of each stage to the server's log. A job whose settings this worker
has not run before says on the page that kernels are compiling, and about how long that takes.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from kernels.config import device_limits

from ...model.generate import generate
from .. import models
from ..lessons import base as lessons_base
from ..settings import RunSettings
from . import compare
from . import generate as generate_job
from .base import Control
from .compiling import peaks, remember_compile


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


def warm_up(settings: dict):
    """Run what the default controls run, once; yield a line per stage with its seconds."""
    s: RunSettings = settings["settings"]
    never = Control(lambda: False, float("inf"))
    t0 = time.monotonic()
    generate_job.prepare(s)
    yield f"loaded {s.model} in {time.monotonic() - t0:.1f} s"
    t1 = time.monotonic()
    for _ in generate_job.run({"settings": s}, never):
        pass
    took = time.monotonic() - t1
    if models.device().type == "cuda":
        remember_compile(took)
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
    model = lessons_base.model(dict(model=lessons_base.GPT2_SHAPE, dtype="bfloat16", backend="torch"))
    for n in rows:
        list(
            generate(model, lessons_base.prompt(model, n), max_new_tokens=1, warmup=False, graph=False, eos_token_id=-1)
        )
    torch.cuda.synchronize()


def triton_first_calls(s: RunSettings) -> None:
    """The Triton kernels a visitor's first clicks would otherwise compile after the page says it is ready: the
    lessons' model (GPT-2 small's shape, bfloat16) with the cache on and off, and the bundled Llama's Generate with
    the cache on and off. Their lengths do not matter (the kernels do not specialise on them): a prompt past the
    decode rows, one step each. The rest is Triton's cache on disk, which a restart reads instead."""
    model = lessons_base.model(dict(model=lessons_base.GPT2_SHAPE, dtype="bfloat16", backend="triton"))
    for cache in (True, False):
        ids = lessons_base.prompt(model, 40)
        list(generate(model, ids, max_new_tokens=2, cache=cache, warmup=False, graph=False, eos_token_id=-1))
    never = Control(lambda: False, float("inf"))
    llama = dataclasses.replace(s, model="bundled-llama", new_tokens=2)
    for cache in (True, False):
        for _ in generate_job.run({"settings": dataclasses.replace(llama, cache=cache)}, never):
            pass
    torch.cuda.synchronize()
