"""On a GPU, the warm-up's first stage, in a helper process of its own (jobs.warm.AHEAD_TASK): every kernel the
default jobs and a visitor's first clicks launch, compiled before any of them runs, many at once (kernels.ahead).

Compiling one after another, where each kernel is first launched, took most of a GPU's start (34 s on an H100) and
left the lessons, the tile sweep and other shapes to compile after the page said it was ready. Here each job is
run with its launches recorded instead of run (on the process's own GPU tensors, nothing computed), once; each
distinct launch is read as Triton's own specialization data and compiled by JITFunction.preload in one of several
processes that load no model (kernels.ahead.in_processes; threads gain about 4x at most, since much of a compile
holds Python's lock). A job that cannot go on without its kernels' results stops there: the launches recorded until
then are kept, and the job's own warm-up or first click compiles the rest.
"""

from __future__ import annotations

import dataclasses
import os
import time

from kernels import ahead, launch

from .. import models
from ..settings import RunSettings
from . import compare
from . import generate as generate_job
from .base import Control

NEVER = Control(lambda: False, float("inf"))
PROCESSES_ENV = "EXPLORER_AHEAD_PROCESSES"  # how many compile processes (default: the cores less one)


def own_calls(s: RunSettings, llamas: list[RunSettings]) -> dict:
    """The warm-up's own jobs (jobs.warm.warm_up), by name: the default Generate, the ladder, and the bundled Llama's
    runs (`llamas`). Each takes the largest logit: drawing a token samples with PyTorch alone (no kernel of ours),
    and on a GPU sampling from logits no kernel wrote can trip a device-side assert, the end of the process's GPU
    context."""

    def generation(settings):
        greedy = dataclasses.replace(settings, temperature=0.0)
        return lambda: _drain(generate_job.run({"settings": greedy}, NEVER))

    calls = {"Generate": generation(s), "ladder": lambda: _drain(compare.ladder({"settings": s}, NEVER))}
    for llama in llamas:
        calls[f"bundled Llama, cache {'on' if llama.cache else 'off'}"] = generation(llama)
    return calls


def _drain(updates) -> None:
    for _ in updates:
        pass


def task_call(task: str, run_task):
    """A helper task as a call to record (`run_task`: jobs.warm's); the tile sweep's default returns its configs'
    launches (each recorded on the same inputs, not timed)."""
    if task != "sweep":
        return lambda: run_task(task)
    from ...measure import sweeps
    from .. import settings

    kernel, shape = settings.default_sweep("cuda")
    dtype = models.dtype_of(models.default_dtype())
    return lambda: sweeps.sweep_launches(kernel, shape, dtype=dtype, device=models.device())


def record(calls: dict) -> tuple[list, list[str], list[str]]:
    """(every launch the calls made or returned, the calls that ran to their end, a line for each that stopped
    early)."""
    launches, whole, stopped = [], [], []
    for name, call in calls.items():
        with launch.recording() as got:
            try:
                made = call()
                got += made if isinstance(made, list) else []  # the launches a call returns (a sweep's)
                whole.append(name)
            except Exception as e:  # noqa: BLE001 - its launches so far are kept; the real run says what failed
                stopped.append(f"{name} ({type(e).__name__})")
        launches += got
    return launches, whole, stopped


def compile_all(calls: dict, processes: int | None = None) -> tuple[list[str], str]:
    """Record `calls` and compile their distinct launches in processes of their own (kernels.ahead); (the calls
    recorded whole, a line for the log). Each call's launches are read as specialization data as soon as it is
    recorded: a later call that leaves the process's GPU context unusable (a device-side assert, computing from
    results no kernel wrote) loses none of what came before."""
    t0 = time.monotonic()
    if models.device().type != "cuda":
        return [], "nothing compiled ahead: the interpreter compiles no kernel"
    specs, whole, stopped, unread = [], [], [], []
    for name, call in calls.items():
        launches, done, halted = record({name: call})
        whole += done
        stopped += halted
        got, failed = ahead.specializations(launches)
        specs += got
        unread += failed
    recorded_s = time.monotonic() - t0
    processes = processes or int(os.environ.get(PROCESSES_ENV) or 0) or ahead.workers()
    done = ahead.preload_in_processes(specs, processes)
    line = (
        f"compiled {done.launches} kernels ahead in {processes} processes in {done.seconds:.1f} s, their launches "
        f"recorded in {recorded_s:.1f} s"
    )
    if stopped:
        line += f"; recorded until they needed a result: {', '.join(stopped)}"
    failed = unread + done.failed
    if failed:
        line += f"; {len(failed)} not compiled: {failed[0]}"
    return whole, line
