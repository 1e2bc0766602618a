"""The clock of a generation, kept outside the decoder: generate() marks it around each step and around what
ran before the first steps; this module reads the marks and hands each Step on with its times.

On a GPU a mark is a CUDA event recorded on the current stream, so a step's time is the device's, free of
the host's work around it (the loop queues the next step before it reads this one's tokens); on CPU it is
perf_counter around the step, which in the interpreter is Python running every program. Every mark also
holds the host's perf_counter: the warm-up and a graph's capture are host work (compiling, capturing) and
are read by it, as is `wall_s`, when a step's tokens reached the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

from ..model.generate import Step, generate


class Mark(NamedTuple):
    host: float  # perf_counter when marked
    event: torch.cuda.Event | None  # recorded on the current stream (GPU), else None


class Clock:
    """Marks on one device. On a GPU the events come from a ring: a step's marks are read as soon as the
    step reaches the caller, while at most a few later steps are queued, so RING events are never reused
    before they are read."""

    RING = 16

    def __init__(self, device: torch.device, backend: str):
        self.device = device
        self.cuda = device.type == "cuda"
        on_cpu = "Triton interpreter" if backend == "triton" else "PyTorch on CPU"
        self.label = "cuda events around each step (device clock)" if self.cuda else f"cpu perf_counter ({on_cpu})"
        self._events = [torch.cuda.Event(enable_timing=True) for _ in range(self.RING)] if self.cuda else []
        self._next = 0
        self.started: Mark | None = None

    def mark(self) -> Mark:
        if not self.cuda:
            return Mark(time.perf_counter(), None)
        event = self._events[self._next]
        self._next = (self._next + 1) % self.RING
        event.record()
        return Mark(time.perf_counter(), event)

    def begin(self) -> Mark:
        """The timed run starts (the warm-up is done): the peak of memory is counted from here."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.started = self.mark()
        return self.started

    def step_ms(self, marks: tuple) -> float:
        """A step's time between its two marks: the device's between events, else the host's."""
        start, end = marks
        if start.event is not None:
            return start.event.elapsed_time(end.event)
        return (end.host - start.host) * 1e3

    @staticmethod
    def host_ms(marks: tuple) -> float:
        """Host time between two marks (what ran before a step: compiling, capturing); 0 with none."""
        return (marks[1].host - marks[0].host) * 1e3 if marks else 0.0

    def peak_bytes(self) -> int | None:
        """torch.cuda.max_memory_allocated since begin(), read without flattening every allocator statistic
        first (that takes about 0.4 ms, as long as a whole decode step on the GPU, once a step); None on CPU."""
        if not self.cuda:
            return None
        return torch.cuda.memory_stats_as_nested_dict(self.device)["allocated_bytes"]["all"]["peak"]


@dataclass
class TimedStep(Step):
    """A Step with what the clock read of it."""

    latency_ms: float = 0.0  # the step on the device clock (see timer)
    timer: str = ""  # what measured latency_ms
    wall_s: float = 0.0  # wall clock, from the start of the timed run (after warm-up) to this step's tokens
    peak_memory_bytes: int | None = None  # torch.cuda.max_memory_allocated since the run began (GPU only)
    warmup_ms: float = 0.0  # compile + first-run time before step 0; CUDA graph capture before step 1


_STEP_FIELDS = tuple(f.name for f in fields(Step) if f.name not in ("marks", "setup_marks"))


def read(step: Step, clock: Clock) -> TimedStep:
    """The step with its times, its marks read and dropped (CUDA events stay with the clock)."""
    return TimedStep(
        **{name: getattr(step, name) for name in _STEP_FIELDS},
        latency_ms=clock.step_ms(step.marks),
        timer=clock.label,
        wall_s=time.perf_counter() - clock.started.host,
        peak_memory_bytes=clock.peak_bytes(),
        warmup_ms=clock.host_ms(step.setup_marks),
    )


def timed(model, prompt_ids, **kwargs):
    """generate(model, prompt_ids, **kwargs), each Step timed: TimedStep, one per token."""
    backend = kwargs.get("backend") or model.backend
    clock = Clock(model.device, backend)
    steps = generate(model, prompt_ids, clock=clock, **kwargs)
    try:  # a caller that stops early closes generate() too: its captured graph goes back to the pool at once
        for step in steps:
            yield read(step, clock)
    finally:
        steps.close()
