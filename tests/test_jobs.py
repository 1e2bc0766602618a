"""Work a request starts is bounded: a time budget ends it cleanly, and cancelling it (Stop, or the
API's cancel) stops it after the step, config or run in progress, freeing the GPU slot."""

import threading
import time

import pytest

from explorer.app import actions
from kernels import timing


def test_a_sweep_stops_at_the_time_budget(monkeypatch):
    monkeypatch.setattr(actions, "JOB_SECONDS", 0.0)
    results = list(actions.run_sweep("layer_norm", {"M": 4, "C": 32}, actions.default_dtype()))
    frame, _, status = results[-1]
    assert len(results) == 1 and len(frame) == 1  # one config timed, then the budget was spent
    assert status.startswith("stopped at the time budget (0 s): 1 of ")


def test_a_generation_stops_at_the_time_budget_and_says_so(monkeypatch):
    monkeypatch.setattr(actions, "JOB_SECONDS", 0.0)
    updates = list(actions.run_generation(actions.RunSettings(prompt="x = 1", new_tokens=50)))
    last = updates[-1]
    assert last.done and len(last.steps) == 1
    assert "| stopped | the time budget (0 s) |" in actions.summary_markdown(last.summary)


def test_cancelling_a_sweep_stops_its_work_and_the_server_serves_the_next_request(monkeypatch):
    gradio_client = pytest.importorskip("gradio_client")
    from tests.serve import running_app

    timed = []

    def slow(fn, inputs, device, **kwargs):  # each config takes 0.3 s, and is counted
        timed.append(time.monotonic())
        time.sleep(0.3)
        return timing.Timing(0.3, timing.CPU_REGIME)

    monkeypatch.setattr(timing, "measure", slow)
    with running_app() as url:
        client = gradio_client.Client(url, verbose=False)
        job = client.submit(
            "layer_norm", "M=4,C=32", actions.default_dtype(), "block_m", "num_warps", "ms", api_name="/sweep"
        )
        deadline = time.monotonic() + 60
        while len(timed) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(timed) >= 3, "the sweep did not start"
        job.cancel()
        time.sleep(0.5)
        at_cancel = len(timed)
        time.sleep(2.0)
        assert len(timed) <= at_cancel + 1, (at_cancel, len(timed))  # at most the config in progress
        assert len(timed) < 20  # the grid has 20 configs: it did not run to the end
        assert threading.active_count() < 200
        # The slot is free: the next request runs to its end.
        done = client.predict(
            "layer_norm", "M=4,C=32", actions.default_dtype(), "block_m", "num_warps", "ms", api_name="/sweep"
        )
        assert "all 20 configs" in done[2]


def test_closing_the_page_stops_its_sweep(monkeypatch):
    """A visitor who closes the tab closes the event stream; the server stops the job behind it."""
    httpx = pytest.importorskip("httpx")
    from tests.serve import running_app

    timed = []

    def slow(fn, inputs, device, **kwargs):
        timed.append(time.monotonic())
        time.sleep(0.3)
        return timing.Timing(0.3, timing.CPU_REGIME)

    monkeypatch.setattr(timing, "measure", slow)
    with running_app() as url:
        data = ["layer_norm", "M=4,C=32", actions.default_dtype(), "block_m", "num_warps", "ms"]
        event = httpx.post(url + "gradio_api/call/sweep", json={"data": data}).json()["event_id"]
        with httpx.stream("GET", url + f"gradio_api/call/sweep/{event}", timeout=60) as stream:
            for _ in stream.iter_lines():
                if len(timed) >= 3:
                    break  # the tab closes
        at_close = len(timed)
        time.sleep(2.0)
        assert len(timed) <= at_close + 1, (at_close, len(timed))
