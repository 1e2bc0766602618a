"""Device time per named operation, measured at positions of the run itself.

A Profiler is an observer (explorer.model.ops) that times every operation it sees. On a GPU each call
is measured as device time: a spin kernel is queued first and the call's kernels are launched while
the device is still spinning, so the events around them see the kernels back to back, without the
Python launch overhead in between. That holds only if the whole call was launched before the spin
ended; the launch's host time is checked against that spin's length as the GPU ran it (events around
the spin, read once the call is done), and a call launched too slowly is run again behind a longer spin
(the operations are pure, or idempotent like the cache write). The host time of each launch is kept too
(`launch_ms`): it is the overhead a CUDA graph removes. On CPU a call is timed by perf_counter in the Triton
interpreter.

profile_run() places such measurements at decode positions spread over a finished run (its first and
last decode step among them), so a chart that divides a step's bytes by a kernel's time uses a time
measured at, or next to, that step's position.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import pandas as pd
import torch

from ..model.generate import generate
from ..model.ops import Op


class Profiler:
    """Times every operation of the steps it observes; take() hands over one step's times by name."""

    def __init__(self):
        self.active = True  # off: operations run untimed (a profiled step's set-up)
        self._events: list = []
        self._host: dict[str, float] = defaultdict(float)
        self._kinds: dict[str, str] = {}
        self._device: torch.device | None = None

    def __call__(self, op: Op, run):
        if not self.active:
            return run()
        self._kinds[op.name] = op.category
        if op.device.type != "cuda":
            t0 = time.perf_counter()
            out = run()
            self._events.append((op.name, t0, time.perf_counter()))
            return out
        for _ in range(_MAX_RESPINS):
            cycles = _spin.cycles
            before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            host0 = time.perf_counter()
            before.record()
            torch.cuda._sleep(cycles)
            start.record()
            out = run()
            end.record()
            host = (time.perf_counter() - host0) * 1e3
            end.synchronize()
            spin_ms = before.elapsed_time(start)  # this spin as the GPU ran it, at whatever clock it ran
            if host < _SPIN_MARGIN * spin_ms:
                if host < _SHRINK_BELOW * spin_ms:  # far shorter than the spin: wait less next time
                    _spin.cycles = max(cycles // 2, _MIN_SPIN_CYCLES)
                break
            _spin.cycles = min(4 * cycles, _MAX_SPIN_CYCLES)  # launched after the spin ended: longer spin, again
        self._events.append((op.name, start, end))
        self._host[op.name] += host
        self._device = op.device
        return out

    def take(self) -> list[dict]:
        """One row per operation name for the step just observed (device synchronised here): device
        time (ms) less the interval two empty events show, host launch time (ms, GPU only), calls."""
        if self._device is not None:
            torch.cuda.synchronize(self._device)
        ms: dict[str, float] = defaultdict(float)
        calls: dict[str, int] = defaultdict(int)
        for name, start, end in self._events:
            if isinstance(start, torch.cuda.Event):
                ms[name] += max(0.0, start.elapsed_time(end) - _spin.floor_ms(self._device))
            else:
                ms[name] += (end - start) * 1e3
            calls[name] += 1
        rows = [
            dict(
                op=name,
                kind=self._kinds[name],
                kernel_ms=ms[name],
                calls=calls[name],
                launch_ms=self._host[name] if name in self._host else float("nan"),
            )
            for name in ms
        ]
        self._events, self._host = [], defaultdict(float)
        return rows


_SPIN_MARGIN = 0.8  # a launch must end within 80% of the spin
_SHRINK_BELOW = 0.2  # a launch this much shorter halves the spin: one slow launch does not slow every later one
_MIN_SPIN_CYCLES = 100_000
_MAX_RESPINS = 6
_MAX_SPIN_CYCLES = 1 << 27  # about 70 ms at 2 GHz
_STEP_TRIES = 3  # a step read as all zeros (the GPU shared while timed) is timed again this many times at most
_FLOOR_SANE_MS = 0.02  # two events back to back take a few µs; more means the GPU was shared while measured


class NoKernelTime(RuntimeError):
    """A profiled step whose operations read no device time at all: what a GPU shared with other work
    at the same moment gives. Reported as such, never passed on as zeros for something to divide by."""


class _Spin:
    """GPU cycles to spin before a timed call, grown whenever a launch outlasts the spin. Each spin's length in ms
    is read from events around it, not from a rate measured once: the GPU's clock moves, and a spin timed at a
    low clock looks longer than it later is, so a launch that outlasted it would pass for one that did not, and
    the gap while the host launched would count as device time."""

    def __init__(self, cycles: int = 400_000):
        self.cycles = cycles
        self._floor: dict[int, float] = {}

    def floor_ms(self, device: torch.device) -> float:
        """Median interval of two events recorded back to back behind a spin: what an empty timed
        call would show."""
        index = _index(device)
        if index not in self._floor:
            pairs = []
            for _ in range(21):
                torch.cuda._sleep(50_000)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize(index)
            # The least of the pairs: another process's kernels running in between can only lengthen one.
            floor = min(s.elapsed_time(e) for s, e in pairs)
            if floor > _FLOOR_SANE_MS:  # the GPU was busy throughout: measure again next time
                return floor
            self._floor[index] = floor
        return self._floor[index]


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_spin = _Spin()


def sample_positions(decode_indices: list[int], samples: int) -> list[int]:
    """Up to `samples` step indices spread evenly over a run's decode steps, first and last included."""
    if not decode_indices or samples < 1:
        return []
    if samples == 1 or len(decode_indices) == 1:
        return [decode_indices[0]]
    n = min(samples, len(decode_indices))
    picks = {decode_indices[round(i * (len(decode_indices) - 1) / (n - 1))] for i in range(n)}
    return sorted(picks)


def profile_run(
    model,
    prompts: list[list[int]],
    steps,
    *,
    cache: bool,
    tiles=None,
    backend=None,
    samples: int = 5,
    progress=None,
    stop: Callable[[], bool] | None = None,
    positions: int | None = None,
) -> pd.DataFrame:
    """Device time per operation at decode positions spread over a finished run (`steps`, its Steps;
    `prompts`, its prompt ids), and at its prefill. Each sampled decode step is rebuilt exactly:
    the prompt and the tokens generated before it, fed as a prompt, then that step profiled.

    One row per (profiled step, operation): step (the run's step index), phase, position, op, kind,
    kernel_ms, launch_ms, calls. `stop()` true ends the pass early, with the steps profiled so far. positions:
    the run's cache size, where it was larger than the prompt and the steps taken (a run that ended early).
    Raises NoKernelTime when a step's operations read no device time at all."""
    generated = [[s.token_ids[b] for s in steps] for b in range(len(prompts))]
    picks = [0, *sample_positions([s.index for s in steps if s.phase == "decode"], samples)]
    rows = []
    profiler = Profiler()
    # Every rebuilt step runs on a cache of the run's size (`positions`; by default the prompt and the steps it
    # took), so the kernels the run compiled serve it: Triton specialises them on the cache's size.
    positions = positions or max(map(len, prompts)) + len(steps)
    kw = dict(
        cache=cache, tiles=tiles, backend=backend, warmup=False, graph=False, eos_token_id=-1, positions=positions
    )
    for n, index in enumerate(picks):
        if stop is not None and stop():
            break
        if progress:
            progress(n, len(picks), f"profiling step {index}")
        # The step's input is the prompt and the `index` tokens generated before it. With the cache on,
        # all but the last of those are a prefill and the last is what the decode step feeds.
        fed = [p + g[:index] for p, g in zip(prompts, generated, strict=True)]
        prompt, steps_run = ([f[:-1] for f in fed], 2) if cache and index > 0 else (fed, 1)
        # A decode step's cache is rebuilt by the torch backend's prefill: only the step is timed, and a prefill
        # of ours at each new length would compile its kernels first (about 2 s for each new bucket of rows on
        # an H200), a wait that no estimate could foresee. (Its attention plans nothing per length either:
        # reference.unplanned.)
        step_kw = dict(kw, prefill_backend="torch") if steps_run == 2 else kw
        if model.device.type == "cuda":  # compile for this length first, outside the timed calls
            list(generate(model, prompt, max_new_tokens=steps_run, **step_kw))
        # A step that reads no device time at all was timed while other work held the GPU: try it again
        # a few times before saying so.
        for _ in range(_STEP_TRIES):
            gen = generate(model, prompt, max_new_tokens=steps_run, observer=profiler, **step_kw)
            observed = _last_step(gen, steps_run, profiler)
            if any(r["kernel_ms"] > 0 for r in observed):
                break
        else:
            raise NoKernelTime(
                f"every operation of step {index} read zero device time in {_STEP_TRIES} tries: the GPU was "
                "busy with other work while it was profiled; run it again"
            )
        step = steps[index]
        rows += [dict(step=index, phase=step.phase, position=step.position, **r) for r in observed]
    if progress:
        progress(len(picks), len(picks), "profiled")
    return pd.DataFrame(rows)


def _last_step(gen, n: int, profiler: Profiler) -> list[dict]:
    """The profiled rows of the last of a generation's n steps; the steps before it (the prefill that
    fills the cache for a decode step) run untimed. Under an observer, generate launches each step only
    when it is asked for, so switching the profiler on between steps times exactly the last one."""
    profiler.active = n == 1
    try:
        for i, _ in enumerate(gen):
            if i + 2 == n:
                profiler.active = True
    finally:
        profiler.active = True
    return profiler.take()
