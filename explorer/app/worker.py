"""The job worker: a process that holds the models and the device and runs one job at a time (runner.py).

It runs as `python -m explorer.app.worker JOBS OUT STOP` (three pipe descriptors the runner passes): it
imports torch and triton afresh, with the environment the server set (TRITON_INTERPRET among it), warms
up what the default controls use, says it is ready, then takes jobs: each job's updates go back as they
are made, then "done" or "error". A stop request names a job; the job polls for it between its steps.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from multiprocessing.connection import Connection


class StopRequests:
    """Whether the runner has asked job `job_id` to stop: a non-blocking look at the stop pipe."""

    def __init__(self, conn: Connection):
        self.conn, self.job_id, self.asked = conn, None, set()

    def __call__(self) -> bool:
        while self.conn.poll():
            self.asked.add(self.conn.recv())
        return self.job_id in self.asked


def settle() -> str:
    """Everything the imports and the warm-up made lives as long as the worker: collected once, then frozen out
    of the garbage collector's sight (gc.freeze), so that a full collection during a job walks only what jobs
    made, not the millions of objects of torch, triton, pandas and plotly: a full collection inside a GPU Generate
    would otherwise cost about a quarter of it. Returns what the collections took, for the log."""
    t0 = time.perf_counter()
    gc.collect()
    full = time.perf_counter() - t0
    gc.freeze()
    t0 = time.perf_counter()
    gc.collect()
    after = time.perf_counter() - t0
    return f"a full garbage collection {full:.2f} s, {after:.3f} s once the warm-up's objects are frozen"


def main(jobs_fd: int, out_fd: int, stop_fd: int) -> None:
    t0 = time.monotonic()
    inbox, out = Connection(jobs_fd, writable=False), Connection(out_fd, readable=False)
    stopping = StopRequests(Connection(stop_fd, writable=False))
    import torch

    if not torch.cuda.is_available():  # the interpreter must be chosen before triton is first imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from . import jobs  # torch, triton, the model layer: the part of the start that takes seconds

    out.send(("log", f"worker: imports {time.monotonic() - t0:.1f} s"))
    _, warm = inbox.recv()
    if warm:
        for line in jobs.warm_up(warm):
            out.send(("log", f"worker: {line}"))
    out.send(("log", f"worker: {settle()}"))
    from kernels.compiled import compiled

    # the kernels this worker has compiled, and those its warm-up's helpers left in Triton's cache for it: each
    # job's end reports those it added
    known = compiled() | jobs.warm.helped["compiled"]
    info = {"start_s": time.monotonic() - t0, "compiled": sorted(known), "helped": jobs.warm.helped["tasks"]}
    info["warm_ran"] = dict(jobs.warm.ran)
    out.send(("ready", jobs.device_info() | info))
    while True:
        try:
            msg = inbox.recv()
        except (EOFError, OSError):  # the server is gone
            return
        if msg[0] == "exit":
            return
        _, job_id, kind, payload = msg
        stopping.job_id = job_id
        control = jobs.Control(stopping, time.monotonic() + payload.get("budget_s", float("inf")))
        try:
            for update in jobs.JOBS[kind](payload, control):
                out.send(("update", job_id, update, time.time()))  # when it left, for the server's timeline
        except Exception as e:  # every failure becomes one message; the worker takes the next job
            out.send(("error", job_id, str(jobs.friendly(e))))
            continue
        now = compiled()
        out.send(("done", job_id, sorted(now - known), time.time()))
        known = now


if __name__ == "__main__":
    main(*map(int, sys.argv[1:4]))
