"""The server's start (explorer.app.start, app.py): the job worker first, the page's imports while it warms."""

from explorer.app import models, serve, start


def test_the_page_takes_the_worker_started_before_it_and_waits_for_it_to_be_ready():
    worker = start.worker(warm=False, log=lambda line: None)
    try:
        demo, _, runner = serve.app("bundled", ["gpt2"], False, warm=False, log=lambda line: None, started=worker)
        assert runner is worker and runner.pid is not None
        assert runner.info.get("device") == models.device().type  # what the worker says once it is ready
        demo.close()
    finally:
        worker.close()
