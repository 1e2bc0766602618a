"""The job worker dies at every moment (as the out-of-memory killer or a crash would end it) and is replaced:
while starting, while idle, in the middle of a job, while another job waits. Each time the visitor of the
job in progress is told what happened, and the next job runs to its end on a fresh worker. Past too many
deaths a minute no worker is started, and jobs are refused with the time their next try can start.

Every wait here is on a condition, bounded only against a hang."""

import asyncio
import os
import signal
import time

import pytest

from explorer.app.errors import UserError
from explorer.app.runner import Job, ProcessRunner, merge
from tests.test_runner import LONG, SHORT, alive, sweep_payload, wait_busy

pytestmark = pytest.mark.slow  # a worker process (or several) per test

HANG_S = 120  # a bound against a hang only: every condition below is met within seconds on an idle machine


def short_job() -> Job:
    return Job("sweep", sweep_payload(SHORT), budget_s=300)


def long_job() -> Job:
    return Job("sweep", sweep_payload(LONG), budget_s=300)


async def outcome(runner: ProcessRunner, job: Job, seen: list | None = None):
    """(the job's updates, the UserError it ended with or None)."""
    seen = [] if seen is None else seen
    try:
        async for update in runner.run(job):
            seen.append(update)
    except UserError as e:
        return seen, e
    return seen, None


def finished(runner: ProcessRunner) -> None:
    """The next job runs to its end (on a fresh worker, where one died)."""
    updates, error = asyncio.run(outcome(runner, short_job()))
    assert error is None, error
    assert "all 20 configs" in merge(updates)["best"], updates


def until(condition, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def closed(pid: int) -> bool:
    """Whether every thread of the process has ended, and with the last its files (its pipes) are closed. Its
    main thread shows as a zombie, its own fd list empty, while torch's threads are still ending and holding
    the pipes open: a job written then reaches a pipe still read, and is lost with the worker (its visitor told
    so)."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) <= 1
    except FileNotFoundError:  # reaped
        return True


def gone(pid: int) -> None:
    """Until the process has exited and its pipes are closed, whether or not its runner has noticed yet."""
    until(lambda: not alive(pid) and closed(pid), f"worker {pid} did not end")


@pytest.fixture
def runner():
    r = ProcessRunner(log=lambda line: None)
    yield r
    r.close()


def test_a_worker_killed_while_idle_is_replaced_and_the_next_job_runs(runner):
    runner.start()
    first = runner.pid
    os.kill(first, signal.SIGKILL)
    until(lambda: runner.pid not in (None, first), "no fresh worker was started")
    assert runner.worker.deaths == 1 and runner.restarts == 1
    assert runner.worker.last_death.moment == "while idle"
    assert "SIGKILL" in runner.worker.last_death.how()
    finished(runner)
    assert runner.worker.deaths == 1


def _environ(pid: int) -> dict:
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if b"=" in item)


def test_every_worker_and_its_replacement_run_one_openblas_thread(monkeypatch):
    """The interpreter's dots are numpy matmuls of one tile: OpenBLAS's threads only spin on a busy machine."""
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    r = ProcessRunner(log=lambda line: None)
    try:
        r.start()
        first = r.pid
        assert _environ(first)["OPENBLAS_NUM_THREADS"] == "1"
        os.kill(first, signal.SIGKILL)
        until(lambda: r.pid not in (None, first), "no fresh worker was started")
        assert _environ(r.pid)["OPENBLAS_NUM_THREADS"] == "1"
    finally:
        r.close()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")  # the operator's choice is kept
    r = ProcessRunner(log=lambda line: None)
    try:
        r.start()
        assert _environ(r.pid)["OPENBLAS_NUM_THREADS"] == "3"
    finally:
        r.close()


def test_a_job_sent_just_after_an_idle_worker_died_goes_to_the_fresh_one(runner):
    """The job is sent before the runner may have noticed: into a dead pipe (caught), or after the worker was
    replaced; either way it runs on the fresh worker, not told of a death that came before it."""
    runner.start()
    first = runner.pid
    os.kill(first, signal.SIGKILL)
    gone(first)
    finished(runner)
    assert runner.pid != first and runner.worker.deaths == 1


def test_a_worker_killed_while_starting_is_replaced_and_the_waiting_job_told(runner):
    runner.start(wait=False)
    first = runner.pid
    os.kill(first, signal.SIGSTOP)  # held before it can be ready: the job below waits for its start
    assert not runner.worker.ready.is_set()

    async def go():
        seen = []
        task = asyncio.create_task(outcome(runner, short_job(), seen))
        while not seen:  # the job is waiting, and says so
            assert not task.done(), task.result()
            await asyncio.sleep(0.05)
        assert seen[0]["status"].startswith("Starting the job worker")
        os.kill(first, signal.SIGKILL)
        return await task

    _, error = asyncio.run(go())
    assert error is not None and "was killed (SIGKILL" in str(error) and "while starting" in str(error)
    assert "a fresh one is starting: try again in about" in str(error)
    assert runner.pid != first and runner.restarts == 1
    finished(runner)


def test_a_worker_killed_mid_job_tells_its_visitor_and_the_waiting_job_runs(runner):
    runner.start()
    first = runner.pid

    async def go():
        running = asyncio.create_task(outcome(runner, long_job()))
        waiting = asyncio.create_task(outcome(runner, short_job()))
        await asyncio.to_thread(wait_busy, first)
        assert not waiting.done() and runner.busy()
        os.kill(first, signal.SIGKILL)
        return await running, await waiting

    (_, error), (updates, waited) = asyncio.run(go())
    assert error is not None and str(error).startswith("The job's worker process was killed (SIGKILL"), error
    assert "during the job; a fresh one is starting" in str(error)
    assert waited is None, waited
    assert "all 20 configs" in merge(updates)["best"]
    assert runner.pid != first and runner.worker.deaths == 1 and runner.worker.last_death.moment == "during a job"


def test_past_the_restart_bound_jobs_are_refused_until_the_window_moves_on():
    now = [1000.0]
    runner = ProcessRunner(log=lambda line: None, max_restarts=1, window_s=60, clock=lambda: now[0])
    try:
        runner.start(wait=False)
        first = runner.pid
        os.kill(first, signal.SIGKILL)  # the first death: restarted
        until(lambda: runner.pid not in (None, first), "no fresh worker was started")
        second = runner.pid
        now[0] += 10
        os.kill(second, signal.SIGKILL)  # the second within the minute: left down
        until(lambda: runner.worker.deaths == 2, "the second death was not noticed")
        assert runner.pid is None and runner.restarts == 1
        _, error = asyncio.run(outcome(runner, short_job()))
        assert error is not None and "the next try can start in 50 s" in str(error), error
        now[0] += 50  # the first death leaves the window
        finished(runner)
        assert runner.restarts == 2
    finally:
        runner.close()


def test_through_the_page_a_visitor_is_told_and_the_app_serves_on():
    """As a visitor sees it: the worker killed mid job, then killed again while idle; the app serves each time."""
    gradio_client = pytest.importorskip("gradio_client")
    from tests.serve import running_app

    with running_app(with_runner=True) as (url, runner):
        client = gradio_client.Client(url, verbose=False, httpx_kwargs={"timeout": HANG_S})
        first = runner.pid
        job = client.submit(**LONG, api_name="/sweep")
        wait_busy(first)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(gradio_client.exceptions.AppError, match=r"^The job's worker process was killed \(SIGKILL"):
            job.result()
        until(lambda: runner.pid not in (None, first), "no fresh worker was started")
        second = runner.pid
        runner.wait_ready()
        os.kill(second, signal.SIGKILL)
        until(lambda: runner.pid not in (None, second), "no fresh worker was started")
        assert "all 20 configs" in client.predict(**SHORT, api_name="/sweep")[2]
        assert runner.worker.deaths == 2
