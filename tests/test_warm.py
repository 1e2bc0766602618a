"""The warm-up's helpers: the processes that compile, beside the worker's own warm-up, what a visitor's first
clicks would otherwise compile after the page says it is ready (on a GPU; explorer.app.jobs.warm)."""

import dataclasses
import json
import re
import time

import pytest
import torch

from explorer.app import estimate, lessons, serve, settings, start
from explorer.app.jobs import warm
from tests.serve import fresh_estimates


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(warm, "helped", {"tasks": [], "compiled": set()})
    with fresh_estimates():
        yield


def test_the_helpers_take_the_compiling_lessons_the_sweep_and_the_shapes_in_as_many_processes_as_the_cores_allow():
    assert set(warm.COMPILING_LESSONS) <= set(lessons.names())
    every = sorted([f"lesson:{n}" for n in warm.COMPILING_LESSONS] + ["sweep", "shapes"])
    for cores, limit, count in ((16, "", 3), (64, "", 3), (8, "", 2), (4, "", 1), (2, "", 1), (16, "2", 2)):
        groups = warm.helper_groups(cores=cores, limit=limit)
        assert len(groups) == count, (cores, limit, groups)
        assert sorted(t for g in groups for t in g) == every, (cores, limit)
    assert warm.helper_groups(cores=16, limit="")[0][0] == "lesson:sms"  # the longest first, with a process to itself
    assert warm.helper_groups(cores=16, limit="0") == []


def test_a_helper_says_each_task_and_the_worker_keeps_only_what_it_ran():
    """A real helper process: a task that fails is said in the worker's log and not counted; one still running
    at the deadline is ended, so that no helper shares the GPU with a visitor's job."""
    started = warm.start_helpers([["no-such-task"]])
    lines = list(warm.finish_helpers(started, time.monotonic() + 300))
    assert len(lines) == 1 and "no-such-task failed: ValueError: no such warm-up task" in lines[0], lines
    assert warm.helped["tasks"] == [] and warm.helped["compiled"] == set()  # nothing compiled in the interpreter
    reports = warm.read_reports('noise\n@@warm {"task": "sweep", "seconds": 1.5}\n@@warm {broken\n')
    assert reports == [{"task": "sweep", "seconds": 1.5}]
    assert (
        warm.helper_line(["sweep", "shapes"], reports, -9, 2.0)
        == "helper in 2.0 s: sweep 1.5 s; not run: shapes (exit -9)"
    )
    slow = warm.start_helpers([["no-such-task"]])
    lines = list(warm.finish_helpers(slow, time.monotonic()))
    assert len(lines) == 1 and lines[0].endswith("not run: no-such-task (exit -9) (ended at the warm-up's deadline)")
    assert slow[0][1].returncode == -9 and not slow[0][2].exists()  # ended, nothing left behind


def test_a_helper_runs_a_lesson_in_a_process_of_its_own_and_the_worker_counts_it():
    """The whole path a GPU's warm-up takes (`python -m explorer.app.jobs.helper`, its report read back), with a
    real task: here the lesson runs in the interpreter and compiles nothing, so only the task is counted."""
    started = warm.start_helpers([["lesson:memory"]])
    lines = list(warm.finish_helpers(started, time.monotonic() + 300))
    assert len(lines) == 1 and re.fullmatch(r"helper in [\d.]+ s: lesson:memory [\d.]+ s", lines[0]), lines
    assert warm.helped["tasks"] == ["lesson:memory"]


def test_what_the_helpers_ran_is_counted_compiled_by_the_estimates():
    d = settings.defaults("cuda", {"dtype": "bfloat16"})
    s = settings.RunSettings(prompt=d["prompt"], new_tokens=d["new_tokens"], dtype="bfloat16")
    kernel = d["kernel"]
    shape = settings.SWEEP_SHAPES["cuda"][kernel]
    sweep_before = estimate.sweep_s(kernel, shape, "cuda", "bfloat16")
    lesson_before = lessons.estimate("fusion", size_="gpu")
    for task in ("lesson:fusion", "sweep", "shapes"):
        estimate.compiled("cuda", serve.helped_keys(task, s))
    # the tab's default sweep compiles nothing more: each of its configs' compile seconds are gone
    configs = len(estimate.sweep_configs(kernel))
    gone = configs * estimate.COMPILE_S["cuda"]["sweep"]
    assert estimate.sweep_s(kernel, shape, "cuda", "bfloat16") == pytest.approx(sweep_before - gone)
    assert lessons.estimate("fusion", size_="gpu") < lesson_before
    # both bundled models and SmolLM2-135M: their decoders and prefills at any prompt, the cache off at any length
    for model in ("bundled", "bundled-llama", "HuggingFaceTB/SmolLM2-135M"):
        for tokens, cache in ((17, True), (256, True), (1000, True), (100, False)):
            at = dataclasses.replace(s, model=model, prompt_tokens=tokens, cache=cache)
            keys = [k for k in estimate.generation_keys(at) if k[0] in ("model", "prefill")]
            if not cache:
                keys += estimate.compare_keys(at, [tokens])[-1:]  # its cache-off bucket
            assert len(keys) >= 2 and estimate.missing("cuda", keys) == set(), (model, tokens, cache)
    assert serve.helped_keys("no-such-task", s) == []


def test_the_helpers_end_in_time_for_the_page_to_be_served_within_a_minute_of_the_servers_start():
    """The server asks for its helpers to end by a moment counted from its own start (start.default_job), so slow
    imports leave the helpers less time rather than making start-up longer; without one (a test, a script) they
    end HELPERS_DEADLINE_S after the warm-up began."""
    now = time.monotonic()
    assert warm.helpers_deadline(now) == now + warm.HELPERS_DEADLINE_S
    for ago in (0.0, 10.0, 30.0, 50.0, 600.0):  # the warm-up began this long after the server started
        started_at = time.time() - ago
        until = start.default_job("cpu", started_at)["helpers_until"]
        assert until == started_at + start.SERVED_BY_S - start.FINISH_S
        deadline = warm.helpers_deadline(time.monotonic(), until)
        served_by = deadline - time.monotonic() + ago + start.FINISH_S  # seconds after the start, at the latest
        assert served_by <= start.SERVED_BY_S + 0.5, (ago, served_by)
        assert deadline - time.monotonic() <= warm.HELPERS_DEADLINE_S + 0.5, ago
    until = start.default_job("cpu", time.time() - 10.0)["helpers_until"]  # quick imports: the warm-up's own limit
    assert warm.helpers_deadline(time.monotonic(), until) - time.monotonic() == pytest.approx(45.0, abs=0.5)
    assert start.default_job("cpu")["helpers_until"] is None


def test_a_gpus_warm_up_counts_the_lessons_whose_kernels_it_compiled_itself():
    """The lessons outside COMPILING_LESSONS run on kernels the warm-up compiles (jobs.warm.triton_first_calls): a
    GPU server counts them compiled whether or not a helper ran them, and the compiling lessons only once a helper
    has run them."""
    job = start.default_job("cpu")
    s = dataclasses.replace(job["settings"], dtype="bfloat16")
    before = {name: lessons.estimate(name, size_="gpu") for name in lessons.names()}
    serve.count_warm_up("cuda", {"settings": s, "ladder": True}, helped=["lesson:tiling"])
    after = {name: lessons.estimate(name, size_="gpu") for name in lessons.names()}
    for name in warm.warmed_lessons():
        assert estimate.missing("cuda", serve.helped_keys(f"lesson:{name}", s)) == set(), name
        assert after[name] <= before[name], name
    assert sum(after[n] for n in warm.warmed_lessons()) < sum(before[n] for n in warm.warmed_lessons())
    assert estimate.missing("cuda", serve.helped_keys("lesson:tiling", s)) == set()
    # the bundled Llama's Generates the warm-up ran: a visitor's first one there compiles neither model nor prefill
    for cache in (True, False):
        llama = dataclasses.replace(s, model="bundled-llama", cache=cache)
        assert not estimate.missing("cuda", [estimate.model_key(llama), estimate.prefill_key(llama, 8)]), cache
    for name in set(warm.COMPILING_LESSONS) - {"tiling"}:
        assert estimate.missing("cuda", serve.helped_keys(f"lesson:{name}", s)), name  # still to compile
        assert after[name] == before[name], name


def test_recording_the_warm_ups_jobs_keeps_each_ones_launches_and_names_one_that_stopped():
    """jobs.precompile.record on this CPU (nothing compiles in the interpreter; on a GPU the same launches are
    compiled ahead): the default jobs and a lesson recorded whole, each with launches, the sweep's returned; a job
    that stops midway keeps the launches it made and is named, not raised."""
    from explorer.app.jobs import precompile
    from kernels.ops.layer_norm import kernel as LN

    s = start.default_job("cpu")["settings"]
    tasks = ("lesson:tiling", "sweep")
    calls = precompile.own_calls(s, warm.llama_runs(s)) | {t: precompile.task_call(t, warm.run_task) for t in tasks}

    def stops():
        x = torch.randn(3, 64)
        LN.layer_norm(x, torch.ones(64), torch.zeros(64))
        raise RuntimeError("a result was needed")

    calls["stops"] = stops
    launches, whole, stopped = precompile.record(calls)
    assert whole == [n for n in calls if n != "stops"] and stopped == ["stops (RuntimeError)"]
    assert sorted(warm.AHEAD_ORDER) == sorted(t for group in warm.HELPER_TASKS for t in group)
    names = {fn.__name__ for fn, *_ in launches}
    assert {"_layer_norm_kernel", "_linear_kernel", "_attention_kernel"} <= names, names
    assert sum(1 for fn, args, *_ in launches if fn is LN._layer_norm_kernel and args[0].shape == (3, 64)) == 1


def test_the_compile_ahead_helpers_report_counts_the_tasks_it_recorded_whole():
    """A helper's report may add the tasks it recorded whole ("tasks") and a line for the log: the worker says the
    line and counts those tasks as compiled, not the helper's own task name."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    report = json.dumps({"task": "ahead", "seconds": 2.0, "tasks": ["lesson:sms", "sweep"], "line": "compiled 9"})
    fd, name = tempfile.mkstemp(suffix=".log")
    process = subprocess.Popen([sys.executable, "-c", f"print({warm.MARK + report!r})"], stdout=fd)
    started = [([warm.AHEAD_TASK], process, Path(name), time.monotonic())]
    lines = list(warm.finish_helpers(started, time.monotonic() + 60))
    assert lines[1] == "compiled 9" and lines[0].startswith("helper in ")
    assert warm.helped["tasks"] == ["lesson:sms", "sweep"]


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_helper_ended_at_the_deadline_ends_the_processes_it_started(tmp_path):
    """The compile ahead's helper starts processes of its own: ended at the deadline, they end with it."""
    import subprocess
    import sys

    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    log = tmp_path / "helper.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-c", code], stdout=out, start_new_session=True)
    while not log.read_text().strip():
        time.sleep(0.1)
    child = int(log.read_text().split()[0])
    assert _running(child)
    lines = list(warm.finish_helpers([([warm.AHEAD_TASK], process, log, time.monotonic())], time.monotonic()))
    assert lines[0].endswith("(ended at the warm-up's deadline)"), lines
    for _ in range(50):
        if not _running(child):
            break
        time.sleep(0.1)
    assert not _running(child)


@pytest.mark.gpu
def test_on_a_gpu_the_compile_ahead_helper_compiles_the_first_clicks_kernels(tmp_path, monkeypatch):
    """The helper a GPU's warm-up starts first (jobs.warm.AHEAD_TASK), for real, into an empty Triton cache: it
    records every task and the default jobs, compiles their kernels many at once and says how many; the tasks it
    recorded whole are counted, and each compiled kernel is in the cache the worker reads."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EXPLORER_AHEAD_PROCESSES", "4")  # beside the suite's other workers
    started = warm.start_helpers([[warm.AHEAD_TASK]])
    lines = list(warm.finish_helpers(started, time.monotonic() + 900))
    found = next(line for line in lines if line.startswith("compiled "))
    count = int(re.match(r"compiled (\d+) kernels ahead in \d+ processes", found).group(1))
    assert count >= 50 and "not compiled" not in found, lines
    assert {"sweep", "shapes"} <= set(warm.helped["tasks"]), lines
    assert sum(1 for p in tmp_path.iterdir() if p.is_dir()) >= count
