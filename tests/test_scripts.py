"""Scripts that time compiled kernels say, on a machine without a GPU, that they need one: one line and exit
status 2, never a traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
CPU_TOO = ("sampling", "stream_check", "compile_volume")  # experiments that run on CPU as well
# Benchmarks that run on CPU too: the page (a server), the estimates (the interpreter), torch_loop (a library).
CPU_BENCHMARKS = ("page", "estimates", "torch_loop")
GPU_ONLY = [
    *sorted(f"-m experiments.{p.stem}" for p in (ROOT / "experiments").glob("*.py") if p.stem not in CPU_TOO),
    *sorted(f"-m benchmarks.{p.stem}" for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in CPU_BENCHMARKS),
]
OPERATIONS = ("attention", "kv_cache", "linear", "norm", "rope")  # one benchmark per operation


# Every script run as `python -m` runs it, one after another in one process (the imports they share are made once):
# for each, its exit status and everything it printed.
RUN_ALL = """
import contextlib, io, json, runpy, sys
import torch, triton  # imported first, as by every script: their import-time warnings are not a script's output
out = {}
for name in sys.argv[1:]:
    printed, sys.argv = io.StringIO(), [name]
    sys.modules.pop(name, None)  # imported by an earlier script (generation imports ladder): run it afresh
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
            status = 0
        except SystemExit as e:
            status = e.code
        except BaseException as e:
            status, _ = repr(e), printed.write(repr(e))
    out[name] = (status, printed.getvalue())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def ran_without_a_gpu():
    names = [script.removeprefix("-m ") for script in GPU_ONLY]
    done = subprocess.run(
        [sys.executable, "-c", RUN_ALL, *names], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU shows")
@pytest.mark.parametrize("script", GPU_ONLY)
def test_a_gpu_only_script_says_so_in_one_line_and_exits_2(script, ran_without_a_gpu):
    status, printed = ran_without_a_gpu[script.removeprefix("-m ")]
    assert status == 2, (script, printed[-2000:])
    lines = [line for line in printed.splitlines() if line.strip()]
    assert len(lines) == 1 and "needs a CUDA GPU" in lines[0], lines


def test_every_operation_has_its_benchmark_and_the_whole_run_holds_each_group():
    """benchmarks/NAME.py for each operation, each with its groups of cases; benchmarks.operations runs them all,
    named by operation and group, and its --only takes exactly those names."""
    import importlib

    every = importlib.import_module("benchmarks.operations").GROUPS
    for name in OPERATIONS:
        groups = importlib.import_module(f"benchmarks.{name}").GROUPS
        assert groups and all(callable(cases) for cases in groups.values())
        assert all(every[f"{name}.{group}"] is cases for group, cases in groups.items())
    assert len(every) == sum(len(importlib.import_module(f"benchmarks.{n}").GROUPS) for n in OPERATIONS)
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.operations", "--only", "linear.nothing"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "invalid choice: 'linear.nothing'" in done.stderr and "linear.decode" in done.stderr


# Run by their paths from another directory, as a person who has not read `python -m` would: the same answer as by
# `python -m` from the repository's root (here on CPU: one line saying a GPU is needed; --help's usage elsewhere).
AS_FILES = [
    *(f"benchmarks/{p.name}" for p in sorted((ROOT / "benchmarks").glob("*.py")) if p.stem not in CPU_BENCHMARKS),
    "benchmarks/page.py --help",  # the CPU benchmarks' whole runs take minutes: their --help
    "benchmarks/estimates.py --help",
    "explorer/bench.py --help",
    "scripts/record_lessons.py --help",
    "scripts/record_timeline.py",
    "scripts/record_sweeps.py",
    "scripts/train_tiny.py --help",
]


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a machine without a GPU shows")
@pytest.mark.parametrize("script", AS_FILES)
def test_a_script_runs_by_its_path_from_any_directory(script, tmp_path):
    path, *args = script.split()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(ROOT / path), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    printed = done.stdout + done.stderr
    assert "Error" not in printed and "Traceback" not in printed, printed[-2000:]
    if args == ["--help"]:
        assert done.returncode == 0 and "usage:" in done.stdout
    else:
        assert done.returncode == 2 and "needs a CUDA GPU" in printed, printed[-2000:]


def test_the_page_benchmark_tells_quick_clicks_from_their_own_work_and_from_compiling():
    from benchmarks import page

    rows = [
        dict(job="quick", done_s=0.5, handler_done_s=0.4),
        dict(job="long", done_s=6.0, handler_done_s=5.5),  # its run again took as long: its own work
        dict(job="stalled", done_s=9.0, handler_done_s=1.0),  # 8 s more than its run again: compiling
        dict(job="alone", done_s=4.0),  # not run again in the page script's process
    ]
    said = page.click_verdict(rows)
    assert said.startswith("done within 3 s of submit: 1 of 4"), said
    assert "longer, their own work: long 6.0 s, alone 4.0 s (not run again);" in said, said
    assert said.endswith("longer, waiting on compilation: stalled 9.0 s (8.0 over its run again)"), said
