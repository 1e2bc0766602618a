"""The worker's start: what it says about its device, and the warm-up that makes the first click fast.

On a GPU, Triton compiles each kernel the first time it meets a new combination of tiles, dtypes and
shapes: tens of seconds for a whole decoder. The warm-up runs the default Generate (and, on a GPU, the
default ladder step) once before the worker takes jobs, so the first visitor's click waits only for its
own tokens; it reports the seconds of each stage to the server's log. A job whose settings this worker
has not run before says on the page that kernels are compiling, and about how long that takes.

Two ways to compile more than that before "ready", both off by default (they cost more start-up than they save;
the numbers are at HELPERS_ENV): with EXPLORER_COMPILE_AHEAD=1, helper processes (`python -m
explorer.app.jobs.helper ahead:I/K`) first record what the default jobs and a visitor's first clicks would launch
(the lessons that compile kernels of their own, the tile sweep's default, SmolLM2-135M's shape and the prefills of
every tile of rows) and compile it, many kernels at once (jobs.precompile); with EXPLORER_WARM_HELPERS=N, N helper
processes run those tasks for real beside the worker's warm-up. Either shares Triton's cache directory with the
worker, which then loads their kernels from disk. The worker waits for its helpers (to helpers_deadline) and reports
what they compiled, so that estimates count none of it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from kernels.config import device_limits

from ...model.generate import generate
from .. import models
from ..lessons import base as lessons_base
from ..settings import RunSettings
from . import compare
from . import generate as generate_job
from .base import Control
from .compiling import peaks, remember_compile


def device_info() -> dict:
    dev = models.device()
    if dev.type != "cuda":
        return {
            "device": "cpu",
            "header": "**No GPU here: the kernels run in Triton's CPU interpreter.** Results are exact; every "
            "timing is a CPU timing and says so, with the same job as measured on a GPU beside it.",
        }
    p = peaks()
    return {"device": "cuda", "gpu": device_limits(dev).name, "header": f"**{p.label}**"}


def warm_up(settings: dict):
    """Run what the default controls run, once; yield a line per stage with its seconds. On a GPU, the helpers
    (helper_groups) run beside it, and their lines follow."""
    s: RunSettings = settings["settings"]
    never = Control(lambda: False, float("inf"))
    t0 = time.monotonic()
    deadline = helpers_deadline(t0, settings.get("helpers_until"))
    gpu = settings.get("ladder") and models.device().type == "cuda"
    helpful = gpu and deadline - t0 >= HELPERS_MIN_S
    ahead = start_helpers([[AHEAD_TASK]]) if helpful and ahead_on() else []
    helping = start_helpers(helper_groups()) if helpful else []
    generate_job.prepare(s)
    yield f"loaded {s.model} in {time.monotonic() - t0:.1f} s"
    yield from finish_helpers(ahead, deadline)  # before the worker's own warm-up, which then loads what it compiled
    t1 = time.monotonic()
    for update in generate_job.run({"settings": s}, never):
        if isinstance(update, dict) and "ran_s" in update:
            ran["generate_s"] = update["ran_s"]  # its own seconds, as a visitor's run reports them
    took = time.monotonic() - t1
    if models.device().type == "cuda":
        remember_compile(took)
    yield f"default Generate ({s.new_tokens} tokens, {s.fusion}, compile and profile included) in {took:.1f} s"
    if settings.get("ladder") and models.device().type == "cuda":
        t2 = time.monotonic()
        for _ in compare.ladder({"settings": s}, never):
            pass
        yield f"default ladder in {time.monotonic() - t2:.1f} s"
        t3 = time.monotonic()
        torch_first_calls()
        yield f"PyTorch's first prefills at GPT-2 small's shape in {time.monotonic() - t3:.1f} s"
        t4 = time.monotonic()
        triton_first_calls(s)
        yield f"Triton's kernels for the lessons' shape and the bundled Llama in {time.monotonic() - t4:.1f} s"
    yield from finish_helpers(helping, deadline)
    yield f"warm in {time.monotonic() - t0:.1f} s"


def torch_first_calls(rows=(128, 143, 159)) -> None:
    """PyTorch's prefill at GPT-2 small's shape in bfloat16 (the lessons' model), at a few row counts: its first
    calls there load the library's kernels for those matrices (0.7 s on an H200, no Triton compile), which every
    profiling pass's prefills on that shape, and so the first run of each lesson on it, would otherwise pay."""
    model = lessons_base.model(dict(model=lessons_base.GPT2_SHAPE, dtype="bfloat16", backend="torch"))
    for n in rows:
        list(
            generate(model, lessons_base.prompt(model, n), max_new_tokens=1, warmup=False, graph=False, eos_token_id=-1)
        )
    torch.cuda.synchronize()


def triton_first_calls(s: RunSettings) -> None:
    """The Triton kernels a visitor's first clicks would otherwise compile after the page says it is ready: the
    lessons' model (GPT-2 small's shape, bfloat16) with the cache on and off, and the bundled Llama's Generate with
    the cache on and off. Their lengths do not matter (the kernels do not specialise on them): a prompt past the
    decode rows, one step each. The rest is Triton's cache on disk, which a restart reads instead."""
    model = lessons_base.model(dict(model=lessons_base.GPT2_SHAPE, dtype="bfloat16", backend="triton"))
    for cache in (True, False):
        ids = lessons_base.prompt(model, 40)
        list(generate(model, ids, max_new_tokens=2, cache=cache, warmup=False, graph=False, eos_token_id=-1))
    never = Control(lambda: False, float("inf"))
    for llama in llama_runs(s):
        for _ in generate_job.run({"settings": llama}, never):
            pass
    torch.cuda.synchronize()


def llama_runs(s: RunSettings) -> list[RunSettings]:
    """The bundled Llama's Generates the warm-up runs (triton_first_calls): the default settings' with the cache
    on and off, two tokens each."""
    llama = dataclasses.replace(s, model="bundled-llama", new_tokens=2)
    return [dataclasses.replace(llama, cache=cache) for cache in (True, False)]


# --- Helpers: what a visitor's first clicks compile, beyond the default jobs ----------------------------------

# Both off by default: on an H100 from an empty Triton cache (benchmarks/page.py, 2026-12-07), the server was ready
# 34.4 s after its imports without them (about 45 s after its start), 61.9 s after its start with three helpers (four
# processes on one GPU slowed the worker's own warm-up by about 20 s), 75.3 s with one compile-ahead process and
# 90.7 s with eight (none had finished recording and compiling by the deadline, and loading the worker's model took
# 15 s beside them); either way some first clicks still compiled after "ready".
HELPERS_ENV = "EXPLORER_WARM_HELPERS"  # how many helper processes at most; unset or "0": none
AHEAD_ENV = "EXPLORER_COMPILE_AHEAD"  # "1": compile ahead in helper processes (jobs.precompile) before the warm-up
# The warm-up waits for its helpers until this many seconds after it began, and no later than the server asked
# (start.default_job: a minute after the server's start, less what follows the helpers), then ends those still
# running and serves. So start-up stays under a minute however long the imports took.
HELPERS_DEADLINE_S = 45.0
HELPERS_MIN_S = 10.0  # with less left than this (a worker restarted long after the start) no helper starts
MARK = "@@warm "  # a helper's report lines, among whatever else it prints
helped: dict = {"tasks": [], "compiled": set()}  # what the helpers that finished in time ran and compiled
ran: dict = {}  # the warm-up's default Generate's own seconds ("generate_s"), for the server's first estimate


def helpers_deadline(t0: float, until: float | None = None) -> float:
    """When the warm-up that began at `t0` (time.monotonic) ends its helpers, as a time.monotonic: HELPERS_DEADLINE_S
    after it began, or at `until` (time.time()) if that comes first."""
    deadline = t0 + HELPERS_DEADLINE_S
    if until is not None:
        deadline = min(deadline, time.monotonic() + until - time.time())
    return deadline


# The lessons whose first run compiled after "ready" without helpers (H100, 2026-12-07, benchmarks/page.py): the SMs
# lesson 23.7 s, fusion 6.0, tiling 3.8, blocks 1.4. The others' kernels are the warm-up's own (triton_first_calls):
# memory, decode-step, prefill-decode and cuda-graphs were done in 0.3-1.1 s, the kv-cache lesson compiled 0.6 s.
COMPILING_LESSONS = ("sms", "fusion", "tiling", "blocks")


def warmed_lessons() -> list[str]:
    """The lessons whose kernels a GPU's warm-up compiles itself (triton_first_calls): all but COMPILING_LESSONS."""
    from .. import lessons

    return [n for n in lessons.names() if n not in COMPILING_LESSONS]


# The helpers' tasks, one list per process: the SMs lesson (the longest: its stamped kernels), the other lessons
# that compile and the shapes (Generate's other models and the cache off), then the tile sweep's default (about 27 s
# of compiling on an H100). The compile ahead (jobs.precompile) records the same tasks.
HELPER_TASKS = [["lesson:sms"], [f"lesson:{n}" for n in COMPILING_LESSONS[1:]] + ["shapes"], ["sweep"]]


# The helper task that records the warm-up's own jobs and HELPER_TASKS and compiles their kernels (jobs.precompile):
# in a process of its own, so that nothing the recording leaves behind (a CUDA graph captured around kernels not run,
# a profile of no kernels) is kept by the worker. It records once and hands the compiling to processes of its own
# (kernels.ahead.in_processes): threads in one process gained about 4x at most (attention's sweep of 96 kernels on an
# H100: 66.9 s on one thread, 17.8 on 8, 18.1 on 15), and eight processes that each recorded everything had not
# finished by the deadline.
AHEAD_TASK = "ahead"


# The order the compile ahead records HELPER_TASKS in: the lessons last, since a lesson computing from results no
# kernel wrote could end the process's GPU context (the recording keeps what came before).
AHEAD_ORDER = ["sweep", "shapes", *(f"lesson:{n}" for n in COMPILING_LESSONS)]


def ahead_on() -> bool:
    return os.environ.get(AHEAD_ENV, "0") == "1"


def helper_groups(cores: int | None = None, limit: str | None = None) -> list[list[str]]:
    """HELPER_TASKS in as many processes as the cores allow. With fewer cores the lists merge, so that the compiling
    never starves the worker's own warm-up: a process per four cores, at most EXPLORER_WARM_HELPERS of them (by
    default none)."""
    groups = HELPER_TASKS
    cores = cores if cores is not None else os.cpu_count() or 1
    limit = limit if limit is not None else os.environ.get(HELPERS_ENV, "0")
    n = min(len(groups), max(1, cores // 4), int(limit) if limit.strip().isdigit() else len(groups))
    if n <= 0:
        return []
    merged: list[list[str]] = [[] for _ in range(n)]
    for i, group in enumerate(groups):
        merged[i % n] += group
    return merged


def start_helpers(groups: list[list[str]]) -> list[tuple[list[str], subprocess.Popen, Path, float]]:
    """Each group in a process of its own, its output in a file of its own (read once it has ended)."""
    root = Path(__file__).resolve().parents[3]
    started = []
    for tasks in groups:
        fd, name = tempfile.mkstemp(prefix="explorer-warm-", suffix=".log")
        process = subprocess.Popen(
            [sys.executable, "-m", "explorer.app.jobs.helper", *tasks],
            stdout=fd,
            stderr=subprocess.STDOUT,
            cwd=root,
            start_new_session=True,  # its own process group: ended with what it started
        )
        os.close(fd)
        started.append((tasks, process, Path(name), time.monotonic()))
    return started


def finish_helpers(started, deadline: float):
    """Wait for each helper until `deadline`; yield a line for each, and keep what it ran and compiled in
    `helped`. One still running by then is ended, so that nothing shares the GPU with a visitor's timed job: what
    it compiled so far is in Triton's cache (each kernel written whole), its unfinished task is not counted. A helper
    is ended with the processes it started (its session)."""
    for tasks, process, log, t0 in started:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
            late = ""
        except subprocess.TimeoutExpired:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                process.kill()
            process.wait()
            late = " (ended at the warm-up's deadline)"
        reports = read_reports(log.read_text(errors="replace"))
        log.unlink(missing_ok=True)
        yield helper_line(tasks, reports, process.returncode, time.monotonic() - t0) + late
        yield from (r["line"] for r in reports if "line" in r)
        helped["tasks"] += [r["task"] for r in reports if "seconds" in r and r["task"] != AHEAD_TASK]
        helped["tasks"] += [t for r in reports if "seconds" in r for t in r.get("tasks", ())]
        helped["compiled"] |= {name for r in reports for name in r.get("compiled", ())}


def read_reports(text: str) -> list[dict]:
    """A helper's report lines (MARK then JSON), in order; other lines (warnings, progress bars) are skipped."""
    out = []
    for line in text.splitlines():
        if line.startswith(MARK):
            try:
                out.append(json.loads(line[len(MARK) :]))
            except ValueError:
                continue
    return out


def helper_line(tasks: list[str], reports: list[dict], code: int | None, seconds: float) -> str:
    done = [f"{r['task']} {r['seconds']:.1f} s" for r in reports if "seconds" in r]
    failed = [f"{r['task']} failed: {r['error']}" for r in reports if "error" in r]
    left = [t for t in tasks if t not in {r.get("task") for r in reports}]
    said = "; ".join(done + failed + ([f"not run: {', '.join(left)} (exit {code})"] if left else []))
    return f"helper in {seconds:.1f} s: {said}"


def run_task(task: str) -> dict | None:
    """One helper task: `lesson:NAME`, the lesson's job; `sweep`, the tile sweep's defaults (the tab's kernel,
    shape and dtype); `shapes`, Generate's kernels for SmolLM2-135M's shape and the prefills of every tile of
    rows (a cache-off run past 128 rows) for both bundled models and that shape, in the default dtype; AHEAD_TASK,
    the kernels of the default jobs and of every other task compiled ahead (its report adds the tasks recorded
    whole, "tasks", and a line for the log)."""
    from ...measure import sweeps
    from .. import lessons, settings

    dtype = models.dtype_of(models.default_dtype())
    if task == AHEAD_TASK:
        from . import precompile

        s = settings.default_run("cuda", models.default_dtype())
        calls = precompile.own_calls(s, llama_runs(s)) | {t: precompile.task_call(t, run_task) for t in AHEAD_ORDER}
        whole, line = precompile.compile_all(calls)
        return {"tasks": [t for t in whole if t in AHEAD_ORDER], "line": line}
    if task.startswith("lesson:"):
        lessons.run(task.split(":", 1)[1])
    elif task == "sweep":
        kernel, shape = settings.default_sweep("cuda")
        for _ in sweeps.tile_sweep_rows(kernel, shape, dtype=dtype, device=models.device()):
            pass
    elif task == "shapes":
        warm_shapes(dtype)
    else:
        raise ValueError(f"no such warm-up task: {task}")


SHAPES_MODELS = ("bundled", "bundled-llama", "HuggingFaceTB/SmolLM2-135M")  # the last as random weights of its shape
SHAPES_OFF_TOKENS = 130  # a cache-off run from 8 tokens past 128 rows, where every kernel's row tile stops growing
SHAPES_PROMPTS = (8, 40, 100, 300, 600, 1000, 2000)  # prompts whose decode steps meet each decode tile plan


def warm_shapes(dtype, off_tokens: int = SHAPES_OFF_TOKENS, prompts=SHAPES_PROMPTS) -> None:
    """Generate's kernels at the default rung for both bundled models and SmolLM2-135M's shape: prefills and
    decode steps at `prompts` tokens (as far as the model reaches: prefill attention's tiles, and the decode
    attention's plan, which follows the cache's size), and the cache off from 8 tokens for `off_tokens` steps,
    each a prefill a row longer (every tile of rows the linear layers and attention choose)."""
    from ...model.ops import DEFAULT_FUSION
    from ...model.weights import load_model

    once = dict(fusion=DEFAULT_FUSION, warmup=False, graph=False, eos_token_id=-1)
    for name in SHAPES_MODELS:  # the bundled checkpoints as they load; SmolLM2-135M's shape, not its download
        model = load_model(name, device=models.device(), dtype=dtype)[0] if "bundled" in name else smollm2_shape(dtype)
        for n in sorted({min(n, model.config.n_positions - 4) for n in prompts}):
            list(generate(model, lessons_base.prompt(model, n), max_new_tokens=3, **once))
        list(generate(model, lessons_base.prompt(model, 8), max_new_tokens=off_tokens, cache=False, **once))
    if models.device().type == "cuda":
        torch.cuda.synchronize()


def smollm2_shape(dtype):
    """Random weights of SmolLM2-135M's shape (30 layers, width 576, 9 heads over 3 key/value heads)."""
    from ...model.llama import Llama, LlamaConfig

    cfg = LlamaConfig(
        vocab_size=49152, n_positions=2048, n_embd=576, n_layer=30, n_head=9, n_kv_head=3, ffn=1536, rope_theta=100000.0
    )
    gen = torch.Generator(device=models.device()).manual_seed(0)
    model = Llama(cfg).to(device=models.device(), dtype=dtype)
    return lessons_base.randomised(model, gen).with_backend("triton")


def helper_main(tasks: list[str]) -> None:
    """Run each task; report each as it ends, with every kernel specialization compiled so far (a helper ended
    at the deadline has said what it finished)."""
    from kernels.compiled import compiled

    for task in tasks:
        t0 = time.monotonic()
        try:
            more = run_task(task)
            report = {"task": task, "seconds": time.monotonic() - t0} | (more or {})
        except Exception as e:  # said in the worker's log; the other tasks still run
            report = {"task": task, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        print(MARK + json.dumps(report | {"compiled": sorted(compiled())}), flush=True)
