"""On ZeroGPU the GPU exists only inside calls decorated with spaces.GPU: building the app must not
touch CUDA, and every job must run inside such a call. The platform is stood in for by tests/zerogpu/spaces.py,
imported as `spaces` in a child process that builds the app: it records what it wraps and any CUDA call."""

import json
import os
import subprocess
import sys
from pathlib import Path

BUILD = """
from explorer.app import models, serve
from explorer.app.runner import InlineRunner
demo, _, runner = serve.app("bundled", ["gpt2"], False, warm=False)
assert isinstance(runner, InlineRunner), runner  # the platform's own process per call, not a worker of ours
assert models.dtype_choices()[0] == "bfloat16", models.dtype_choices()
assert demo is not None
"""


def test_building_the_app_touches_no_cuda_and_runs_every_job_in_a_gpu_call(tmp_path):
    platform = Path(__file__).parent / "zerogpu"
    report = tmp_path / "report.json"
    env = os.environ | {"SPACES_ZERO_GPU": "true", "ZEROGPU_REPORT": str(report)}
    env["PYTHONPATH"] = os.pathsep.join([str(platform), str(Path.cwd()), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(report.read_text())
    assert seen["touched"] == []  # no CUDA call while the app was built
    assert set(seen["wrapped"]) == {"generate.run", "sweep.run", "compare.run", "compare.ladder", "lesson.run"}
    assert all(isinstance(seconds, int) and seconds > 0 for seconds in seen["wrapped"].values())


def test_elsewhere_jobs_run_in_a_worker_process(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    from explorer.app import runner

    assert not runner.zero_gpu()
