"""A job can always be stopped: asked, it stops between its steps; in the middle of one long launch, its
worker is ended and a fresh one started. The slot frees only once the work has stopped, and the server
then goes idle. Driven through gradio_client (cancel), a closed event stream, and the runner itself (the
time budget, which admission by estimate keeps a page's jobs well inside).

A launch that runs for seconds exists only in Triton's interpreter; on a GPU the long job is a sweep that
compiles and times many configs, stopped between two of them, within 5 s."""

import asyncio
import time

import pytest
import torch

from explorer.app import estimate, validate
from explorer.app.runner import GRACE_S, Job, ProcessRunner
from explorer.app.settings import RunSettings
from tests.serve import running_app

pytestmark = pytest.mark.slow  # a server (and a browser) per test

gradio_client = pytest.importorskip("gradio_client")
httpx = pytest.importorskip("httpx")

GPU = torch.cuda.is_available()
# On CPU one config of this sweep runs for many seconds in the interpreter (block_m=1: 6000 programs, about 30 s),
# far past the grace a job has to stop by itself: only ending its worker stops it; the whole sweep is estimated
# inside the default budget, so admission lets it start. On a GPU, 96 configs of a matmul, each compiled and timed.
LONG = dict(kernel="layer_norm", shape="M=6000,C=16", dtype="float32", x="block_m", y="num_warps", value="ms")
if GPU:
    LONG = dict(kernel="linear", shape="M=1024,K=768,N=3072", dtype="float16", x="block_m", y="block_n", value="ms")
SHORT = dict(kernel="layer_norm", shape="M=4,C=32", dtype="float32", x="block_m", y="num_warps", value="ms")
STOP_S = 5 if GPU else GRACE_S + 5  # from the cancel to the slot free: on a GPU the 5 s
# The client's requests (a cancel among them) wait for an answer as long as a busy 2-core machine may take to give
# one; what a test asserts is bounded by the work, not by this.
HTTP = {"timeout": 120}


def sweep_payload(params: dict) -> dict:
    return params | {"shape": validate.shape("shape", params["shape"], estimate.sweep_keys(params["kernel"]))}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks of 10 ms


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between the open and the read
        return False


def idle(pid: int) -> bool:
    before = cpu_seconds(pid)
    time.sleep(1.0)
    return cpu_seconds(pid) - before < 0.1


def wait_busy(pid: int, seconds: float = 60) -> None:
    """Until the worker has spent a second of CPU on the job."""
    start, deadline = cpu_seconds(pid), time.monotonic() + seconds
    while cpu_seconds(pid) - start < 1.0:
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)


def test_cancel_stops_a_long_launch_frees_the_slot_only_then_and_the_server_goes_idle():
    with running_app(with_runner=True) as (url, runner):
        client = gradio_client.Client(url, verbose=False, httpx_kwargs=HTTP)
        first = runner.pid
        job = client.submit(**LONG, api_name="/sweep")
        wait_busy(first)
        t0 = time.monotonic()
        assert job.cancel()
        assert time.monotonic() - t0 < STOP_S
        if not GPU:  # the worker did not stop by itself (one launch runs on): it was ended within the grace,
            # and a fresh one took its place before the cancel came back
            assert not alive(first) and runner.pid != first and runner.restarts == 1
        runner.wait_ready()
        before = cpu_seconds(runner.pid)
        time.sleep(2.0)
        assert cpu_seconds(runner.pid) - before < 0.2  # idle: nothing of the cancelled job goes on
        # The next request runs to its end.
        done = client.predict(**SHORT, api_name="/sweep")
        assert "all 20 configs" in done[2]


def test_stop_between_steps_keeps_the_worker():
    with running_app(with_runner=True) as (url, runner):
        client = gradio_client.Client(url, verbose=False, httpx_kwargs=HTTP)
        first = runner.pid
        job = client.submit(prompt="x = 1", new_tokens=1000, backend="torch", api_name="/generate")  # far from its end
        deadline = time.monotonic() + 300  # a hang's guard only: tokens come within seconds on an idle machine
        while not any(isinstance(o[0], str) and len(o[0]) > len("x = 1") + 4 for o in job.outputs()):
            assert not job.done(), f"the job ended before its tokens: {job.exception()!r}"
            assert time.monotonic() < deadline, "no tokens came"
            time.sleep(0.05)
        t0 = time.monotonic()
        assert job.cancel()
        assert runner.pid == first and runner.restarts == 0  # stopped at its next token, by itself: no worker ended
        assert time.monotonic() - t0 < GRACE_S + 10  # the bound on CPU, with the budget's 10% left out


def test_closing_the_page_stops_its_job():
    """A visitor who closes the tab closes the event stream; the server stops the job behind it."""
    with running_app(with_runner=True) as (url, runner):
        first = runner.pid
        event = httpx.post(url + "gradio_api/call/sweep", json={"data": list(LONG.values())}).json()["event_id"]
        with httpx.stream("GET", url + f"gradio_api/call/sweep/{event}", timeout=60) as stream:
            wait_busy(first)
            stream.close()  # the tab closes
        deadline = time.monotonic() + (STOP_S if GPU else GRACE_S + 10)
        while alive(first) if not GPU else not idle(runner.pid):  # on a GPU it stops between two configs
            assert time.monotonic() < deadline, "the job went on after its page closed"
            time.sleep(0.1)


def test_a_job_past_its_budget_is_stopped_even_in_the_middle_of_a_launch():
    runner = ProcessRunner(log=lambda line: None)
    runner.start()
    try:
        payload = sweep_payload(LONG)
        budget = 1.0

        async def go():
            return [u async for u in runner.run(Job("sweep", payload, budget))]

        t0 = time.monotonic()
        updates = asyncio.run(go())
        took = time.monotonic() - t0
        if GPU:  # it stops itself between two configs (its last table says so), or is ended GRACE_S later
            said = updates[-1].get("status") or updates[-1].get("best", "")
            assert "time budget" in said and took < budget + 5, (said, took)
        else:
            assert updates[-1]["status"] == "Stopped at the time budget (1 s)."
            assert took < 1.1 * budget + 10, took
            assert runner.restarts == 1
    finally:
        runner.close()


# A Generate estimated past the admission test's budget on this machine: on a GPU a cached step costs so little
# that even the largest cached batch is estimated under 5 s, so there the cache is off (every step recomputes
# the 1000-token prefix, sixteen times over).
LONG_GENERATE = dict(prompt_tokens=1000, batch=16, new_tokens=24) | (dict(cache=False) if GPU else {})


def test_admission_refuses_a_job_estimated_past_the_budget(monkeypatch):
    budget = 5 if GPU else 30  # past what each job below is estimated to take here
    here = "cuda" if GPU else "cpu"
    assert estimate.generation_seconds(RunSettings(**LONG_GENERATE), here) > budget  # the refusal's premise
    monkeypatch.setenv("EXPLORER_JOB_SECONDS", str(budget))
    with running_app() as url:
        client = gradio_client.Client(url, verbose=False, httpx_kwargs=HTTP)
        t0 = time.monotonic()
        with pytest.raises(gradio_client.exceptions.AppError, match=rf"may take at most {budget} s\. Use smaller"):
            client.predict(**(SHORT | {"shape": "M=349525,C=1"}), api_name="/sweep")
        with pytest.raises(gradio_client.exceptions.AppError, match=rf"at most {budget} s\. Lower the new tokens"):
            client.predict(**LONG_GENERATE, api_name="/generate")
        assert time.monotonic() - t0 < 10
    assert estimate.budget_s() == budget


def test_a_jobs_timeline_says_when_its_handler_was_asked_and_when_it_began():
    from explorer.app import runner

    token = runner.ASKED.set(1000.25)
    try:
        timeline = runner.Timeline("generate", 1.5)
    finally:
        runner.ASKED.reset(token)
    timeline.arrived(("update", 1, {}, timeline.t0 + 0.1, timeline.t0 + 0.102))
    timeline.passed_on()
    line = timeline.line()
    assert line.startswith("job generate (estimated 1.50 s): 1 messages, left the worker at 0.10-0.10 s"), line
    assert line.endswith(f"(asked at 1000.250, began at {timeline.t0:.3f})"), line
    assert "asked at" not in runner.Timeline("sweep").line()  # no handler asked: a job started by the server
