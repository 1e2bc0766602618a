"""The job worker, supervised: one worker process at all times, whatever ends it and whenever.

A worker may die at any moment: the kernel's out-of-memory killer, a crash in a native library, an operator's
kill. Its reader thread sees the end of the worker's output pipe the moment the process is gone, whatever it
was doing (starting, idle, running a job), and starts a fresh worker at once, up to `max_restarts` in a
rolling `window_s`: a worker that dies again and again (a machine out of memory at every start, a broken
install) is then left down, and each job is refused with the time its next try can start, instead of the
server spending itself on restarts. A job in progress is told by a "died" message carrying the Death; a job
waiting for the worker to start sees `deaths` change.

A worker ended on purpose (a job that did not stop in time, the server closing) is replaced without counting
towards that bound: those ends are paced by the jobs themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from .errors import UserError

ROOT = Path(__file__).resolve().parents[2]  # where `python -m explorer.app.worker` finds the package
MAX_RESTARTS = 5  # fresh workers after deaths within WINDOW_S; past that, none until the window has moved on
WINDOW_S = 60.0


@dataclass(frozen=True)
class Death:
    """How a worker ended unexpectedly, and what happens next, in words a visitor can act on."""

    code: int  # the exit code; -N: killed by signal N
    moment: str  # "while starting", "while idle", "during a job"
    generation: int  # which worker (the supervisor counts them from 1)
    next_try: str  # "a fresh one is starting ..." or when the next try can start

    def how(self) -> str:
        if self.code >= 0:
            return f"exited with code {self.code}"
        try:
            name = signal.Signals(-self.code).name
        except ValueError:
            name = f"signal {-self.code}"
        oom = ", as the system does when it runs out of memory" if -self.code == signal.SIGKILL else ""
        return f"was killed ({name}{oom})"

    def message(self) -> str:
        return f"The job worker {self.how()} {self.moment}; {self.next_try}"


def seconds(left: float) -> str:
    return f"{max(1, math.ceil(left))} s"


class Supervisor:
    """Starts the worker, routes its messages (logs to `log`, the rest to `deliver`), and replaces it when it
    dies; see the module docstring. `deliver` returns whether a job in progress took the message."""

    def __init__(
        self,
        warm: dict | None,
        log: Callable[[str], None],
        deliver: Callable[[tuple], bool],
        max_restarts: int = MAX_RESTARTS,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,  # what the window is measured by
    ):
        self.warm, self.log, self.deliver = warm, log, deliver
        self.max_restarts, self.window_s, self.clock = max_restarts, window_s, clock
        self.info: dict = {}  # what the worker said about its device when it was ready
        self.ready = threading.Event()
        self.started_at = 0.0
        self.generation = 0  # workers started so far
        self.restarts = 0  # of those, started in place of one that ended (on purpose or not)
        self.deaths = 0  # unexpected ends
        self.last_death: Death | None = None
        self._guard = threading.Lock()  # the reader threads and the server's loop change the worker under it
        self._recent: deque[float] = deque()  # when the unexpected ends within the window came
        self._resume_at = 0.0  # past too many ends: no worker is started before this
        self._process: subprocess.Popen | None = None
        self._jobs = self._stop = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None else None

    def start(self) -> None:
        with self._guard:
            self._closed = False
            self._spawn()

    def _spawn(self) -> None:
        """Start a worker (the guard held). It is a program of its own (python -m explorer.app.worker), not a
        multiprocessing child: nothing of the server's main module is imported again, and CUDA starts fresh in
        it. Three pipes: jobs in, updates out, and stop requests, which the job polls between its steps."""
        jobs_r, jobs_w = os.pipe()
        out_r, out_w = os.pipe()
        stop_r, stop_w = os.pipe()
        fds = (jobs_r, out_w, stop_r)
        self.ready.clear()
        self.started_at = time.monotonic()
        self.generation += 1
        # One OpenBLAS thread unless the operator says otherwise: the interpreter's tl.dot is a numpy matmul of
        # one tile, too small to share, and on a small machine busy with another process OpenBLAS's threads
        # spin waiting for each other (a float16 Generate on 2 cores took 2.5-7x its float32 twin).
        env = {**os.environ, "OPENBLAS_NUM_THREADS": os.environ.get("OPENBLAS_NUM_THREADS", "1")}
        process = subprocess.Popen(
            [sys.executable, "-m", "explorer.app.worker", *map(str, fds)], pass_fds=fds, cwd=ROOT, env=env
        )
        for fd in fds:
            os.close(fd)
        self._process = process
        self._jobs = Connection(jobs_w, readable=False)
        self._stop = Connection(stop_w, readable=False)
        with contextlib.suppress(OSError):  # dead already: its reader sees the end of its pipe and says so
            self._jobs.send(("warm", self.warm))
        reader = Connection(out_r, writable=False)
        name = f"job-reader-{self.generation}"
        threading.Thread(target=self._read, args=(reader, process, self.generation), daemon=True, name=name).start()

    def _read(self, conn: Connection, process: subprocess.Popen, generation: int) -> None:
        """The worker's messages until its pipe ends, which it does the moment the process is gone."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                conn.close()
                self._ended(process, generation)
                return
            if msg[0] == "log":
                self.log(msg[1])
                continue
            if msg[0] == "ready":
                with self._guard:
                    if process is not self._process:
                        continue
                    self.info = msg[1]
                    self.ready.set()
            self.deliver(msg)

    def _ended(self, process: subprocess.Popen, generation: int) -> None:
        code = process.wait()
        with self._guard:
            if process is not self._process or self._closed:
                return  # ended on purpose (replace, close): its successor, if any, is already there
            was_ready = self.ready.is_set()
            self._process = self._jobs = self._stop = None
            self.ready.clear()
            now = self.clock()
            self._recent.append(now)
            while self._recent[0] <= now - self.window_s:
                self._recent.popleft()
            if len(self._recent) <= self.max_restarts:
                expected = self.info.get("start_s", 10.0)
                next_try = f"a fresh one is starting: try again in about {seconds(expected)}."
                restart = True
            else:
                self._resume_at = self._recent[0] + self.window_s
                next_try = (
                    f"it ended {len(self._recent)} times within {self.window_s:.0f} s, so it is not restarted at "
                    f"once: the next try can start in {seconds(self._resume_at - now)}."
                )
                restart = False
            death = Death(code, "while idle" if was_ready else "while starting", generation, next_try)
            self.last_death = death  # before the count changes: a job waiting for the start reads it then
            self.deaths += 1
            if restart:
                self.restarts += 1
                self._spawn()
        if self.deliver(("died", None, death)):  # a job was in progress: its runner tells its visitor
            death = self.last_death = Death(code, "during a job", generation, next_try)
        fresh = f"worker {self.generation} starting" if restart else "no worker started"
        self.log(f"jobs: worker {generation} (pid {process.pid}) {death.how()} {death.moment}; {fresh}")

    def ensure(self) -> None:
        """A worker exists (or is starting) once this returns; past too many deaths, UserError says when the
        next try can start."""
        with self._guard:
            if self._closed:
                raise UserError("The server is stopping: try again in a minute.")
            if self._process is not None:
                return
            left = self._resume_at - self.clock()
            if left <= 0:
                self.restarts += 1
                self._spawn()
                return
        death = self.last_death
        said = f"The job worker {death.how()} {death.moment}, " if death is not None else "The job worker "
        raise UserError(
            f"{said}and ended too often to be restarted at once; the next try can start in {seconds(left)}. "
            "Nothing you made is lost."
        )

    def send(self, msg: tuple) -> int | None:
        """Send a job to the worker if it is ready: its generation, or None when it is not there (it has just
        died; its reader is replacing it)."""
        with self._guard:
            if self._jobs is None or not self.ready.is_set():
                return None
            try:
                self._jobs.send(msg)
            except OSError:
                return None
            return self.generation

    def ask_stop(self, job_id: int) -> None:
        with self._guard:
            stop = self._stop
        with contextlib.suppress(OSError, AttributeError):  # a worker that died already has closed its end
            stop.send(job_id)

    async def replace(self) -> None:
        """End the worker on purpose (it did not stop in time) and start a fresh one: the end is awaited, the
        fresh worker's start is not (the next job waits for it)."""
        with self._guard:
            process, self._process, self._jobs, self._stop = self._process, None, None, None
            self.ready.clear()
        if process is not None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await asyncio.to_thread(process.wait, 10)
        with self._guard:
            if not self._closed and self._process is None:
                self.restarts += 1
                self._spawn()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.5):
            self.ensure()  # down past too many deaths: UserError
            if time.monotonic() > deadline:
                raise RuntimeError(f"the job worker did not start within {timeout:.0f} s")

    def close(self) -> None:
        with self._guard:
            self._closed = True
            process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(5)
