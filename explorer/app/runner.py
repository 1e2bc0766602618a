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
  lock is held until the worker is idle again;
- a worker that dies, whenever it does (out of memory, a crash), is replaced at once by its supervisor
  (supervisor.py), and the job it was running, or waiting for it, is told what happened.

The job's updates are dicts (worker side: explorer.app.jobs); when the page cannot take them as fast as
they come, the ones waiting are merged into one (later keys win), so the page shows the newest state
instead of replaying a backlog.

Under ZeroGPU a GPU exists only inside a call decorated with spaces.GPU, which the platform runs in a
process of its own: there the job runs in a thread of the server (InlineRunner), stopped between
tokens, configs and runs; the platform bounds its duration.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from . import supervisor
from .errors import UserError

GRACE_S = 2.0  # a job asked to stop has this long to end by itself before its worker is killed
READY_S = 600.0  # a worker that has not started (imports, warm-up) by then is ended and started again
# A job that has sent nothing for this long gets an empty update passed on: Gradio notices a closed page only
# when it next writes to its stream, and a launch that runs for minutes writes nothing of its own.
KEEPALIVE_S = 1.0


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
    """Jobs run in one worker process at a time, kept alive by a Supervisor; see the module docstring."""

    def __init__(
        self,
        warm: dict | None = None,
        log: Callable[[str], None] = print,
        max_restarts: int = supervisor.MAX_RESTARTS,
        window_s: float = supervisor.WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.warm = warm  # what the worker runs before it takes jobs (worker.warm_up), or None
        self.log = log
        self.compiled: set[str] = set()  # the kernel specializations its worker has compiled (kernels.compiled)
        self.worker = supervisor.Supervisor(warm, log, self._deliver, max_restarts, window_s, clock)
        self._lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self._route: tuple | None = None  # (job id, loop, queue) of the job in progress
        self._job_id = 0

    # --- the worker process ------------------------------------------------------------------------

    def start(self, wait: bool = True) -> None:
        """Start the worker; with `wait`, return once it is ready (its warm-up logged stage by stage)."""
        self.worker.start()
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout: float = READY_S) -> None:
        self.worker.wait_ready(timeout)

    @property
    def pid(self) -> int | None:
        return self.worker.pid

    @property
    def info(self) -> dict:
        """What the worker said about its device when it was ready."""
        return self.worker.info

    @property
    def restarts(self) -> int:
        return self.worker.restarts

    def close(self) -> None:
        self.worker.close()

    def _deliver(self, msg) -> bool:
        """A message of the worker's (from its reader thread) to the job in progress; whether one took it."""
        if msg[0] == "ready":
            self.compiled = set(msg[1].get("compiled", ()))  # a fresh worker has compiled only these
            return False
        route = self._route
        if route is None:
            return False
        job_id, loop, queue = route
        if msg[1] is None or msg[1] == job_id:
            loop.call_soon_threadsafe(queue.put_nowait, (*msg, time.time()))  # and when it arrived
            return True
        return False

    # --- jobs ----------------------------------------------------------------------------------------

    def busy(self) -> bool:
        return self._lock.locked()

    async def run(self, job: Job) -> AsyncIterator[dict]:
        """The job's updates as they come (merged when several wait), ending when it does. A job that
        fails raises UserError with its message; one that outlives its budget, or whose consumer is
        cancelled (Stop, a closed tab), is stopped before this returns or raises."""
        async with self._lock:
            queue: asyncio.Queue = asyncio.Queue()
            worker = None
            while worker is None:  # None: the worker died as the job was sent; it goes to the fresh one
                if self._route is not None:
                    await asyncio.sleep(0.05)  # its reader is seeing the end of its pipe: let it replace it
                async for update in self._until_ready():
                    yield update
                job_id = self._job_id = next(self._ids)
                self._route = (job_id, asyncio.get_running_loop(), queue)
                worker = self.worker.send(("job", job_id, job.kind, job.payload | {"budget_s": job.budget_s}))
            deadline = time.monotonic() + job.budget_s + GRACE_S
            timeline, end = Timeline(job.kind, job.estimate_s), None
            try:
                while True:
                    left = deadline - time.monotonic()
                    try:
                        first = await next_message(queue, max(0.0, min(KEEPALIVE_S, left)))
                    except TimeoutError:
                        if left > KEEPALIVE_S:
                            yield {}  # nothing new: the page's stream carries a message, so a closed tab is seen
                            continue
                        await self._halt(queue, worker)
                        yield {"status": f"Stopped at the time budget ({job.budget_s:.0f} s)."}
                        return
                    waiting = [first]
                    while not queue.empty():
                        waiting.append(queue.get_nowait())
                    updates, end = [], None
                    for msg in waiting:
                        if stale(msg, worker):
                            continue
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
                        self._finish(end)
                        return
            except (asyncio.CancelledError, GeneratorExit):
                if end is None:  # still running: ask it to stop, and end its worker if it does not
                    await self._halt(queue, worker)
                raise
            finally:
                self._route = None
                self.log(timeline.line())

    async def _until_ready(self) -> AsyncIterator[dict]:
        """Until the worker is ready to take a job: a status line while it starts. A worker that dies while
        starting, or is down past too many deaths, is a UserError saying so and when to try again."""
        self.worker.ensure()
        if self.worker.ready.is_set():
            return
        deaths = self.worker.deaths
        yield {"status": self._starting()}
        while not self.worker.ready.is_set():
            await asyncio.sleep(0.05)
            if self.worker.deaths != deaths:
                raise UserError(self.worker.last_death.message())
            if time.monotonic() - self.worker.started_at > READY_S:
                self.log(f"jobs: the worker did not start within {READY_S:.0f} s; it is ended and started again")
                await self.worker.replace()
                raise UserError(
                    f"The job worker did not start within {READY_S / 60:.0f} minutes; a fresh one is starting. "
                    "Try again in a minute."
                )

    def _finish(self, msg) -> None:
        kind = msg[0]
        if kind == "done":
            self.compiled.update(msg[2] or ())
            return
        if kind == "error":
            raise UserError(msg[2])
        death = msg[2]  # "died": its supervisor has started a fresh worker already, or says when it will
        raise UserError(f"The job's worker process {death.how()} during the job; {death.next_try}")

    async def _halt(self, queue: asyncio.Queue, worker: int) -> None:
        """Ask the job to stop; if it has not ended within GRACE_S, end its worker (a fresh one starts)."""
        self.worker.ask_stop(self._job_id)
        end = time.monotonic() + GRACE_S
        while time.monotonic() < end:
            try:
                msg = await next_message(queue, end - time.monotonic())
            except TimeoutError:
                break
            if stale(msg, worker):
                continue
            if msg[0] in ("done", "error", "died"):  # ended; one that died is being replaced already
                return
        self.log(f"jobs: a job did not stop within {GRACE_S:.0f} s of being asked; its worker is restarted")
        await self.worker.replace()

    def _starting(self) -> str:
        waited = time.monotonic() - self.worker.started_at
        expected = self.info.get("start_s", 10.0)
        left = max(1.0, expected - waited)
        again = "again " if self.restarts else ""
        return f"Starting the job worker {again}(about {left:.0f} s more)…"


def stale(msg: tuple, worker: int) -> bool:
    """A death of a worker before the one the job was sent to (it died as the job was sent)."""
    return msg[0] == "died" and msg[2].generation != worker


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
        from . import jobs  # torch and the model layer: in the server's process only where it runs the jobs itself

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
