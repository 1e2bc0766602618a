"""The server's start (explorer.app.start, app.py): the job worker first, the page's imports while it warms."""

import os
import subprocess
import sys

from explorer.app import models, serve, start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_start_stamp_imports_nothing_that_must_wait_for_zerogpus_spaces():
    """Under ZeroGPU `spaces` must be imported before torch; app.py stamps the start before it imports either."""
    heavy = "{'torch', 'gradio', 'triton'}"
    code = f"import sys, explorer.app.start as s; s.stamp(); print(sorted({heavy} & sys.modules.keys()))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_page_takes_the_worker_started_before_it_and_waits_for_it_to_be_ready():
    worker = start.worker(warm=False, log=lambda line: None)
    try:
        demo, _, runner = serve.app("bundled", ["gpt2"], False, warm=False, log=lambda line: None, started=worker)
        assert runner is worker and runner.pid is not None
        assert runner.info.get("device") == models.device().type  # what the worker says once it is ready
        demo.close()
    finally:
        worker.close()
