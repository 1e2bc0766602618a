"""One job at a time, bounded: where every GPU- or CPU-heavy request of the page runs.

A job (a generation, a sweep, a compare, the ladder, a lesson) runs in a worker process (worker.py) that
holds the models, the compiled kernels and the device, never in the server's own process. That buys
three things the page needs:
- the server's event loop never waits for the GIL behind a generation loop or a profiling pass, so each
  update reaches the browser when it is made, not in one burst at the end;
- a job can always be stopped: the worker is asked to stop (it checks between tokens, configs and runs)
  and, if it has not stopped within GRACE_S (the middle of one long interpreter launch, say), it is
  killed and a fresh one started. The slot is free only once the work has stopped;
- one job at a time per process, whatever Gradio's queue does with a cancelled event: the runner's own
  lock is held until the worker is idle again.

The job's updates are dicts (worker side: explorer.app.jobs); when the page cannot take them as fast as
they come, the ones waiting are merged into one (later keys win), so the page shows the newest state
instead of replaying a backlog.

Under ZeroGPU a GPU exists only inside a call decorated with spaces.GPU, which the platform runs in a
process of its own: there the job runs in a thread of the server (InlineRunner), stopped between
tokens, configs and runs; the platform bounds its duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from .errors import UserError

GRACE_S = 2.0  # a job asked to stop has this long to end by itself before its worker is killed
ROOT = Path(__file__).resolve().parents[2]  # where `python -m explorer.app.worker` finds the package
READY_S = 600.0
# A job that has sent nothing for this long gets an empty update passed on: Gradio notices a closed page only
# when it next writes to its stream, and a launch that runs for minutes writes nothing of its own.
KEEPALIVE_S = 1.0  # a worker that has not started (imports, warm-up) by then is reported as failed


@dataclass(frozen=True)
class Job:
    kind: str  # a name in explorer.app.jobs.JOBS
    payload: dict  # what the job function takes (picklable)
    budget_s: float  # seconds it may run; it stops itself there, and is killed GRACE_S later
    estimate_s: float | None = None  # what the page said it would take (logged beside what it took)


# When the event that submits a job reached its handler (set there; the job's timeline reports it).
ASKED: contextvars.ContextVar[float | None] = contextvars.ContextVar("asked", default=None)


class Timeline:
    """When a job's updates left the worker, reached the server and went on to the page (wall clock, seconds
    from the job's submission): one line in the server's log per job, so that a page that waits can be
    told from a job that is slow."""

    def __init__(self, kind: str, estimate_s: float | None = None):
        self.t0 = time.time()
        self.asked = ASKED.get()
        self.name = kind if estimate_s is None else f"{kind} (estimated {estimate_s:.2f} s)"
        self.sent, self.got, self.yielded = [], [], []

    def arrived(self, msg: tuple) -> None:
        """A message from the worker: (kind, job id, body, when it left), and when it arrived appended."""
        if msg[0] in ("update", "done"):
            self.sent.append(msg[3] - self.t0)
            self.got.append(msg[-1] - self.t0)

    def passed_on(self) -> None:
        self.yielded.append(time.time() - self.t0)

    def asked_at(self) -> str:
        return "" if self.asked is None else f"asked at {self.asked:.3f}, "

    def line(self) -> str:
        if not self.sent:
            return f"job {self.name}: no update in {time.time() - self.t0:.2f} s"
        lag = max(g - s for s, g in zip(self.sent, self.got, strict=True))
        shown = self.yielded or [float("nan")]
        return (
            f"job {self.name}: {len(self.sent)} messages, left the worker at {self.sent[0]:.2f}-{self.sent[-1]:.2f} s, "
            f"reached the server by {lag:.3f} s after each, went to the page in {len(self.yielded)} updates at "
            f"{shown[0]:.2f}-{shown[-1]:.2f} s, ended at {time.time() - self.t0:.2f} s "
            f"({self.asked_at()}began at {self.t0:.3f})"
        )


def merge(updates: list[dict]) -> dict:
    """Updates waiting for the page, as one: later keys win."""
    out: dict = {}
    for u in updates:
        out.update(u)
    return out


async def next_message(queue: asyncio.Queue, seconds: float):
    """The queue's next message; TimeoutError if none comes within `seconds`. Not asyncio.wait_for: before
    Python 3.12 it drops a cancel that comes as the message does (it returns the message and the task runs on),
    so a Stop or a closed tab during a stream of updates waited for the whole job to end."""
    if hasattr(asyncio, "timeout"):  # Python 3.11 on
        async with asyncio.timeout(seconds):
            return await queue.get()
    getter = asyncio.ensure_future(queue.get())
    try:
        await asyncio.wait({getter}, timeout=seconds)
    except asyncio.CancelledError:
        if getter.done():  # taken as the cancel came: put back, for the halt that follows
            queue.put_nowait(getter.result())
        raise
    finally:
        getter.cancel()  # a no-op once done
    if not getter.done() or getter.cancelled():
        raise TimeoutError
    return getter.result()


class ProcessRunner:
    """Jobs run in one worker process at a time; see the module docstring."""

    def __init__(self, warm: dict | None = None, log: Callable[[str], None] = print):
        self.warm = warm  # what the worker runs before it takes jobs (worker.warm_up), or None
        self.log = log
        self.info: dict = {}  # what the worker said about its device when it was ready
        self.compiled: set[str] = set()  # the kernel specializations its worker has compiled (kernels.compiled)
        self.restarts = 0
        self._lock = asyncio.Lock()
        self._ready = threading.Event()
        self._started_at = 0.0
        self._ids = itertools.count(1)
        self._route: tuple | None = None  # (job id, loop, queue) of the job in progress
        self._process = self._conn = self._stop = None
        self._job_id = 0

    # --- the worker process ------------------------------------------------------------------------

    def start(self, wait: bool = True) -> None:
        """Start the worker; with `wait`, return once it is ready (its warm-up logged stage by stage).

        The worker is a program of its own (python -m explorer.app.worker), not a multiprocessing child:
        nothing of the server's main module is imported again, and CUDA starts fresh in it. Three pipes:
        jobs in, updates out, and stop requests, which the job polls between its steps."""
        jobs_r, jobs_w = os.pipe()
        out_r, out_w = os.pipe()
        stop_r, stop_w = os.pipe()
        fds = (jobs_r, out_w, stop_r)
        self._ready.clear()
        self._started_at = time.monotonic()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "explorer.app.worker", *map(str, fds)], pass_fds=fds, cwd=ROOT
        )
        for fd in fds:
            os.close(fd)
        self._conn = Connection(jobs_w, readable=False)
        self._stop = Connection(stop_w, readable=False)
        self._conn.send(("warm", self.warm))
        reader = Connection(out_r, writable=False)
        threading.Thread(target=self._read, args=(reader, self._process), daemon=True, name="job-reader").start()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = READY_S) -> None:
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the job worker did not start within {timeout:.0f} s")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(5)

    def _read(self, conn, process) -> None:
        """The worker's messages, routed: logs to the log, job updates to the job in progress."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self._deliver(("died", None, process.wait()))
                return
            kind = msg[0]
            if kind == "log":
                self.log(msg[1])
            elif kind == "ready":
                self.info = msg[1]
                self.compiled = set(self.info.get("compiled", ()))  # a fresh worker has compiled only these
                self._ready.set()
            else:
                self._deliver(msg)

    def _deliver(self, msg) -> None:
        route = self._route
        if route is None:
            return
        job_id, loop, queue = route
        if msg[1] is None or msg[1] == job_id:
            loop.call_soon_threadsafe(queue.put_nowait, (*msg, time.time()))  # and when it arrived

    async def _restart(self) -> None:
        """Kill the worker (it did not stop in time, or died) and start a fresh one; the kill is awaited,
        the fresh worker's start is not (the next job waits for it)."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            await asyncio.to_thread(process.wait, 10)
        self.restarts += 1
        self.start(wait=False)

    # --- jobs ----------------------------------------------------------------------------------------

    def busy(self) -> bool:
        return self._lock.locked()

    async def run(self, job: Job) -> AsyncIterator[dict]:
        """The job's updates as they come (merged when several wait), ending when it does. A job that
        fails raises UserError with its message; one that outlives its budget, or whose consumer is
        cancelled (Stop, a closed tab), is stopped before this returns or raises."""
        async with self._lock:
            if not self._ready.is_set():
                yield {"status": self._starting()}
                while not self._ready.is_set():
                    await asyncio.sleep(0.05)
                    if time.monotonic() - self._started_at > READY_S:
                        raise UserError("The job worker did not start; the server's log says why.")
            job_id = self._job_id = next(self._ids)
            queue: asyncio.Queue = asyncio.Queue()
            self._route = (job_id, asyncio.get_running_loop(), queue)
            deadline = time.monotonic() + job.budget_s + GRACE_S
            timeline, end = Timeline(job.kind, job.estimate_s), None
            try:
                self._conn.send(("job", job_id, job.kind, job.payload | {"budget_s": job.budget_s}))
                while True:
                    left = deadline - time.monotonic()
                    try:
                        first = await next_message(queue, max(0.0, min(KEEPALIVE_S, left)))
                    except TimeoutError:
                        if left > KEEPALIVE_S:
                            yield {}  # nothing new: the page's stream carries a message, so a closed tab is seen
                            continue
                        await self._halt(queue)
                        yield {"status": f"Stopped at the time budget ({job.budget_s:.0f} s)."}
                        return
                    waiting = [first]
                    while not queue.empty():
                        waiting.append(queue.get_nowait())
                    updates, end = [], None
                    for msg in waiting:
                        timeline.arrived(msg)
                        if msg[0] == "update":
                            updates.append(msg[2])
                        else:
                            end = msg
                            break
                    if updates:
                        timeline.passed_on()
                        yield merge(updates)  # the page may close us here, after the job has ended
                    if end is not None:
                        await self._finish(end)
                        return
            except (asyncio.CancelledError, GeneratorExit):
                if end is None:  # still running: ask it to stop, and end its worker if it does not
                    await self._halt(queue)
                raise
            finally:
                self._route = None
                self.log(timeline.line())

    async def _finish(self, msg) -> None:
        kind = msg[0]
        if kind == "done":
            self.compiled.update(msg[2] or ())
            return
        if kind == "error":
            raise UserError(msg[2])
        await self._restart()  # "died"
        raise UserError(
            f"The job's worker process ended unexpectedly (exit code {msg[2]}); a fresh one is starting. "
            "Try again in a few seconds."
        )

    async def _halt(self, queue: asyncio.Queue) -> None:
        """Ask the job to stop; if it has not ended within GRACE_S, kill its worker."""
        with contextlib.suppress(OSError):  # a worker that died already has closed its end
            self._stop.send(self._job_id)
        end = time.monotonic() + GRACE_S
        while time.monotonic() < end:
            try:
                msg = await next_message(queue, end - time.monotonic())
            except TimeoutError:
                break
            if msg[0] in ("done", "error"):
                return
            if msg[0] == "died":
                break
        self.log(f"jobs: a job did not stop within {GRACE_S:.0f} s of being asked; its worker is restarted")
        await self._restart()

    def _starting(self) -> str:
        waited = time.monotonic() - self._started_at
        expected = self.info.get("start_s", 10.0)
        left = max(1.0, expected - waited)
        again = "again after a stopped job " if self.restarts else ""
        return f"Starting the job worker {again}(about {left:.0f} s more)…"


# ZeroGPU's calls: the GPU seconds a call asks for when its job has no estimate, by kind; past that, the estimate
# with room for the fork, CUDA's start and a compile slower than estimated, and at least ZERO_GPU_MIN_S.
ZERO_GPU_S = {"generate": 90, "sweep": 120, "compare": 240, "ladder": 120, "lesson": 240}
ZERO_GPU_MIN_S = 20
ZERO_GPU_ROOM = (1.5, 15.0)  # estimate x 1.5 + 15 s
ZERO_GPU_END_S = 5.0  # the job ends itself this long before its call's seconds run out


def zero_gpu_seconds(job: Job) -> int:
    """The seconds a ZeroGPU call asks for, from its job's own estimate, within its budget: a visitor's daily GPU
    quota is spent by what the call asks for, and a shorter ask waits less in the platform's queue."""
    if job.estimate_s is None:
        return ZERO_GPU_S[job.kind]
    scale, room = ZERO_GPU_ROOM
    wanted = max(ZERO_GPU_MIN_S, scale * job.estimate_s + room)
    return math.ceil(min(wanted, job.budget_s + ZERO_GPU_END_S))


def zero_gpu_duration(payload: dict, control) -> int:
    """spaces.GPU's duration: the platform calls it with the job function's own arguments."""
    return payload["gpu_s"]


class InlineRunner:
    """Jobs in a thread of this process, for ZeroGPU (see the module docstring): `wrap` turns the job
    function into the platform's GPU call, which asks for the seconds in the payload's "gpu_s"
    (zero_gpu_seconds). The job ends itself before those run out, and a cancelled job between its steps."""

    def __init__(self, wrap: Callable = lambda fn, job: fn):
        self.wrap = wrap
        self.info: dict = {}
        self.compiled: set[str] = set()  # none kept: each GPU call may be a fresh process on another GPU
        self._lock = asyncio.Lock()

    def busy(self) -> bool:
        return self._lock.locked()

    async def run(self, job: Job) -> AsyncIterator[dict]:
        from . import jobs

        async with self._lock:
            stop = threading.Event()
            gpu_s = zero_gpu_seconds(job)
            control = jobs.Control(stop.is_set, time.monotonic() + min(job.budget_s, gpu_s - ZERO_GPU_END_S))
            payload = job.payload | {"budget_s": job.budget_s, "gpu_s": gpu_s}
            it = iter(self.wrap(jobs.JOBS[job.kind], job)(payload, control))
            pending = None
            try:
                while True:
                    pending = asyncio.ensure_future(asyncio.to_thread(next, it, None))
                    update = await asyncio.shield(pending)
                    pending = None
                    if update is None:
                        return
                    yield update
            except (asyncio.CancelledError, GeneratorExit):
                stop.set()
                if pending is not None:  # the step in progress ends before the slot is free
                    await asyncio.gather(pending, return_exceptions=True)
                raise
            except UserError:
                raise
            except Exception as e:
                raise jobs.friendly(e) from None


def zero_gpu() -> bool:
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")
