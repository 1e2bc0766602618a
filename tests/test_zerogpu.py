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
    jobs = {"generate.run", "sweep.run", "compare.run", "compare.ladder", "lesson.run", "occupancy.run"}
    assert set(seen["wrapped"]) == jobs
    assert set(seen["wrapped"].values()) == {"callable"}  # each call asks for its own job's seconds


def test_each_gpu_call_asks_for_seconds_from_its_own_estimate_and_its_job_ends_before_they_run_out():
    from explorer.app.runner import ZERO_GPU_END_S, ZERO_GPU_MIN_S, ZERO_GPU_S, Job, zero_gpu_seconds

    short, long = Job("generate", {}, 600, 2.0), Job("generate", {}, 600, 100.0)
    assert zero_gpu_seconds(short) == ZERO_GPU_MIN_S  # a short job asks for the floor, not the kind's default
    assert 100 * 1.2 < zero_gpu_seconds(long) < 100 * 2  # room above its estimate, far from the 600 s budget
    assert zero_gpu_seconds(Job("lesson", {}, 600, None)) == ZERO_GPU_S["lesson"]  # no estimate: the kind's own
    assert zero_gpu_seconds(Job("sweep", {}, 30, 29.0)) == 30 + ZERO_GPU_END_S  # never past the budget's end


def test_elsewhere_jobs_run_in_a_worker_process(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    from explorer.app.zerogpu import zero_gpu

    assert not zero_gpu()


def test_the_inline_runner_hands_the_call_its_seconds_and_ends_the_job_before_them():
    import asyncio
    import time

    from explorer.app.runner import ZERO_GPU_END_S, InlineRunner, Job, zero_gpu_duration

    seen = {}

    def gpu_call(payload, control):  # the platform's call, as spaces.GPU(duration=zero_gpu_duration) makes it
        seen["asked"] = zero_gpu_duration(payload, control)
        seen["left"] = control.deadline - time.monotonic()
        yield {"status": "ran"}

    async def run(job):
        return [u async for u in InlineRunner(lambda fn, job: gpu_call).run(job)]

    assert asyncio.run(run(Job("generate", {"settings": None}, 600, 40.0))) == [{"status": "ran"}]
    assert seen["asked"] == 75  # 40 s x 1.5 + 15 s
    assert 75 - ZERO_GPU_END_S - 5 < seen["left"] <= 75 - ZERO_GPU_END_S


def test_triton_keeps_its_kernels_where_they_outlive_each_gpu_call(monkeypatch, tmp_path):
    import app

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert app.triton_cache_dir() == str(tmp_path)  # the operator's choice first
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(app.os.path, "isdir", lambda path: False)  # no persistent storage
    assert app.triton_cache_dir() == str(tmp_path / ".triton" / "cache")  # the Space's home, not the process's


def test_a_fresh_process_says_kernels_compile_only_where_the_server_has_not_run_those_settings(monkeypatch):
    from explorer.app.jobs import compiling
    from explorer.app.jobs.compiling import compile_note

    monkeypatch.setitem(compiling._state, "compile_s", None)  # a process with no warm-up of its own, as on ZeroGPU

    key = ("generate", "a model no test ran")
    assert compile_note(key, "cuda", known_s=0) is None  # ran before: Triton's cache on disk has its kernels
    assert "about 12 s" in compile_note(key, "cuda", known_s=12.0)
    assert compile_note(key, "cpu", known_s=12.0) is None  # the interpreter compiles nothing


def test_the_readmes_front_matter_suggests_hardware_a_space_can_pick_and_the_pinned_gradio():
    from importlib.metadata import version

    from huggingface_hub import SpaceHardware

    head = Path("README.md").read_text().split("---")[1]
    front = dict(line.split(": ", 1) for line in head.strip().splitlines())
    assert front["suggested_hardware"] in {h.value for h in SpaceHardware}, front["suggested_hardware"]
    assert front["sdk_version"] == version("gradio")  # the Space runs the Gradio the tests ran
