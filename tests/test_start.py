"""The server's start (explorer.app.start, app.py): the job worker first, the page's imports while it warms."""

import pytest

from explorer.app import estimate, models, serve, start
from tests.serve import fresh_estimates


def test_the_page_takes_the_worker_started_before_it_and_waits_for_it_to_be_ready():
    worker = start.worker(warm=False, log=lambda line: None)
    try:
        demo, _, runner = serve.app("bundled", ["gpt2"], False, warm=False, log=lambda line: None, started=worker)
        assert runner is worker and runner.pid is not None
        assert runner.info.get("device") == models.device().type  # what the worker says once it is ready
        demo.close()
    finally:
        worker.close()


@pytest.mark.skipif(models.device().type != "cpu", reason="a GPU's warm-up compiles: its seconds are not kept")
def test_on_a_cpu_the_warm_ups_default_generate_sets_the_first_visitors_estimate():
    """Nothing compiles in the interpreter, so the warm-up's default Generate is a run like a visitor's: its own
    seconds are the first estimate of those settings (on the CPU page the first click was estimated at 4.7 s from
    the generic rate and took 7.6 s, 2026-12-07)."""
    with fresh_estimates():
        worker = start.worker(warm=True, log=lambda line: None)
        try:
            demo, _, runner = serve.app("bundled", ["gpt2"], False, log=lambda line: None, started=worker)
            demo.close()
            s = runner.warm["settings"]
            key = estimate.rate_key(s)
            assert estimate.source("cpu", ["triton"], key) == "from the last runs of these settings here"
            took = runner.info["warm_ran"]["generate_s"]
            assert estimate.generation_seconds(s, "cpu") == pytest.approx(took, rel=0.35)  # the fixed part: the prior's
        finally:
            worker.close()
