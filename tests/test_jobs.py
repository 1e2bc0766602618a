"""The page's jobs called directly (explorer.app.jobs) and through their handlers with the jobs run in this
process: what each yields and in what order, when it stops, and what a handler refuses before any work."""

import asyncio
import dataclasses
import json
import re
import time

import gradio as gr
import pandas as pd
import pytest
import torch

from explorer.app import handlers, jobs, models, settings, views
from explorer.app.errors import UserError
from explorer.app.runner import InlineRunner
from explorer.measure.ladder import RUNGS
from kernels import TileConfig

NEVER = jobs.Control(lambda: False, float("inf"))


def collect(agen) -> list:
    async def go():
        return [x async for x in agen]

    return asyncio.run(go())


def values(**change) -> dict:
    """Every field of Generate at its default on this device, with `change`."""
    d = settings.defaults(models.device().type, {"dtype": models.default_dtype()})
    return {n: d[n] for n in [*settings.RUN, "overlay", "lengths", *settings.TILES]} | change


def cell(summary: str, measure: str) -> str:
    """A summary row's value for this run: its last column (this device's, beside a GPU's answer on CPU)."""
    row = next(line for line in summary.splitlines() if line.startswith(f"| {measure}"))
    return row.strip().strip("|").split("|")[-1].strip()


def context() -> handlers.Context:
    return handlers.Context(InlineRunner(), device=models.device().type)


def test_generate_sends_text_first_then_charts_then_the_profiled_run():
    s = settings.RunSettings(prompt="import os", new_tokens=3, dtype=models.default_dtype())
    updates = list(jobs.JOBS["generate"]({"settings": s}, NEVER))
    texts = [u for u in updates if "text" in u]
    assert texts[0]["text"].startswith("import os") and len(texts[-1]["text"]) > len("import os")
    assert {"text", "status"} <= set(texts[0]) <= {"text", "summary", "status"}  # no figure holds back the text
    if not torch.cuda.is_available():  # a token takes most of a second: the summary comes with each
        assert all("summary" in u for u in texts)
    first_chart = next(i for i, u in enumerate(updates) if "latency" in u)
    assert first_chart > updates.index(texts[0])
    last = updates[-1]
    if torch.cuda.is_available():  # a profiling pass after the run
        assert "profiling the kernels at" in updates[-2]["summary"]
        assert "| kernel times | timed at decode positions" in last["summary"]
    else:  # every operation timed in the run itself, by the interpreter's clock
        assert cell(last["summary"], "kernel times") == "timed in the run itself, every step (CPU clock)"
        assert last["state"]["kernels"].kernel_ms.notna().all()
    assert list(last["state"]["steps"].step) == [0, 1, 2]
    assert {"latency", "traffic", "kv", "share", "bandwidth", "hierarchy", "roofline"} <= set(last)
    assert "time to first token (waited, from the click)" in last["summary"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="kernel launches are counted on a GPU")
def test_a_generate_run_again_with_the_same_settings_is_not_counted_again(monkeypatch):
    from explorer.app.jobs import generate

    calls = []
    count = generate.launches.decode_step_launches
    monkeypatch.setattr(generate.launches, "decode_step_launches", lambda *a, **kw: calls.append(kw) or count(*a, **kw))
    monkeypatch.setattr(generate, "_counted", {})
    runs = [dict(new_tokens=3), dict(new_tokens=3), dict(new_tokens=3, batch=2), dict(new_tokens=4)]
    summaries = []
    for change in runs:
        s = settings.RunSettings(prompt="import os", dtype=models.default_dtype(), **change)
        summaries.append(list(jobs.JOBS["generate"]({"settings": s}, NEVER))[-1]["summary"])
    first = calls[0]["positions"]
    assert [kw["positions"] for kw in calls] == [first, first, first + 1]  # the first, the batch of 2, the longer
    counted = [cell(summary, "decode step launches") for summary in summaries]
    assert counted[0] == counted[1] and "counted by torch.profiler" in counted[0]


def test_a_generation_asked_to_stop_stops_at_the_next_token_and_says_so():
    s = settings.RunSettings(prompt="x = 1", new_tokens=50, backend="torch")
    asked = {"n": 0}

    def stopping():
        asked["n"] += 1
        return asked["n"] > 2  # the third look says stop

    updates = list(jobs.JOBS["generate"]({"settings": s}, jobs.Control(stopping, float("inf"))))
    last = updates[-1]
    assert len(last["state"]["steps"]) == 3  # two tokens, and the one made when it looked the third time
    assert cell(last["summary"], "stopped") == "by you, before the end" and "Stopped" in last["status"]


def test_stop_on_the_page_says_so_in_the_summary_and_the_status_line():
    summary = "| measure | NVIDIA H200 (modeled) | this CPU (interpreter) |\n|---|---|---|\n| stopped |  | running |"
    summary, status = handlers.stopped(summary, "3 of 60 tokens")
    assert cell(summary, "stopped") == "by you, before the end" and status == "Stopped by you after 3 of 60 tokens."
    assert handlers.stopped("", "Profiling…") == ("", "Stopped by you.")


def test_a_generation_past_its_budget_stops_and_says_so():
    s = settings.RunSettings(prompt="x = 1", new_tokens=50, backend="torch")
    last = list(jobs.JOBS["generate"]({"settings": s}, jobs.Control(lambda: False, time.monotonic())))[-1]
    assert len(last["state"]["steps"]) == 1
    assert cell(last["summary"], "stopped") == "at the time budget"


def test_tiles_that_cannot_run_are_refused_before_any_launch():
    from kernels.ops.linear.kernel import forms_taken

    # Too large for any GPU's shared memory, the H200's 227 KB included.
    tiles = settings.Tiles(linear_decode=TileConfig(block_n=256, block_k=256, num_stages=8))
    refusal = r"Tiles, linear decode: block_n 256 and block_k 256 need about .* shared memory"
    with forms_taken() as launched, pytest.raises(UserError, match=refusal):
        list(jobs.JOBS["generate"]({"settings": settings.RunSettings(new_tokens=2, tiles=tiles)}, NEVER))
    assert launched == []
    with forms_taken() as launched:  # the same run with tiles that fit: its prefill launches the linear kernel
        list(jobs.JOBS["generate"]({"settings": settings.RunSettings(new_tokens=1)}, NEVER))
    assert launched


def test_out_of_memory_and_bad_tiles_become_advice():
    err = jobs.friendly(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert "ran out of memory" in str(err) and "lower the batch" in str(err)
    assert str(jobs.friendly(ValueError("linear: block_k=512 is not allowed"))) == "linear: block_k=512 is not allowed"

    class OutOfResources(Exception):  # Triton's, by name: the compiler's own exception type
        pass

    assert "do not fit this GPU" in str(jobs.friendly(OutOfResources("shared memory, Required: 300000")))


def test_a_sweep_stops_between_configs_when_asked():
    payload = dict(kernel="layer_norm", shape={"M": 4, "C": 32}, dtype="float32", x="block_m", y="num_warps")
    rows = lambda updates: [u for u in updates if "table" in u]  # on a GPU, the compile ahead's lines first
    updates = rows(jobs.JOBS["sweep"](payload | {"value": "ms"}, jobs.Control(lambda: True, float("inf"))))
    assert len(updates) == 1 and "stopped by you, before the end: 1 of 20 configs" in updates[0]["best"]
    everything = rows(jobs.JOBS["sweep"](payload | {"value": "ms"}, NEVER))
    assert len(everything) == 20 and "all 20 configs" in everything[-1]["best"]
    table = everything[-1]["table"]
    assert set(table.runs) <= {"✓", "✗"} and "ms" in table and "µs" not in table


def test_the_ladder_shows_each_rung_as_it_is_measured():
    import json

    s = settings.RunSettings(dtype="float32")
    updates = list(jobs.JOBS["ladder"]({"settings": s}, NEVER))
    assert len(updates) == len(RUNGS)
    table = updates[-1]["table"]
    own = "ms per step" if torch.cuda.is_available() else "ms per step (CPU)"  # a GPU's answer beside it on CPU
    assert list(table.rung) == list(RUNGS) and (table[own] > 0).all() and "× torch" in table
    if torch.cuda.is_available():
        assert table["kernels (counted)"].notna().all()
    else:  # the interpreter launches nothing a profiler counts: no column of blanks
        assert "kernels (counted)" not in table
    if not torch.cuda.is_available():  # what a visitor without a GPU sees: the GPU's time first
        ladder = {}
        for update in updates:
            ladder |= update
        titles = [a["text"] for a in json.loads(ladder["plot"])["layout"]["annotations"]]
        assert titles[2] == "µs per step: NVIDIA H200, recorded", titles
        # the interpreter's unit is the one its slowest rung reads in (seconds, or milliseconds on a fast machine)
        assert titles[3] in ("s per step (interpreter, CPU)", "ms per step (interpreter, CPU)"), titles


def test_summary_names_each_rate_by_its_clock_and_counts_kernels_only_where_counted():
    base = dict(
        timer="cuda events around each step (device clock)",
        ttft_ms=1.0,
        waited_s=0.25,
        wall_tokens_per_s=679.0,
        step_ms_p50=0.607,
        step_ms_p90=0.7,
        warmup_ms=3.0,
        mb_per_token=1.0,
        achieved_gbs=1.0,
        kv_cache_mb=0.0,
        peak_memory_mb=1.0,
        operations_per_step=171,
    )
    graphed = views.summary_markdown({**base, "cuda_graph": True, "kernels_per_step": 163, "memory_ops_per_step": 1})
    assert "| tokens/s delivered (wall clock, first to last token) | 679 tokens/s |" in graphed
    assert "| time to first token (waited, from the click) | 0.25 s |" in graphed
    assert "| decode step p50 / p90 (device clock, CUDA events) | 607 µs / 700 µs |" in graphed
    assert "163 GPU kernels + 1 memory operations (counted by torch.profiler)" in graphed
    eager = views.summary_markdown({**base, "cuda_graph": False})
    assert "171 named operations, each launched from Python (counting after the run)" in eager
    cpu = views.summary_markdown({**base, "timer": "cpu perf_counter (Triton interpreter)", "cuda_graph": False})
    assert "kernels are counted on a GPU" in cpu and "(CPU clock)" in cpu
    one = views.summary_markdown({**base, "operations_per_step": 1, "cuda_graph": False})  # the megakernel rung
    assert "| decode step launches | 1 named operation, launched from Python (counting after the run) |" in one
    replayed = views.summary_markdown({**base, "operations_per_step": 1, "cuda_graph": True})
    assert (
        "| decode step launches | 1 named operation, replayed as one CUDA graph (counting after the run) |" in replayed
    )


def test_compare_table_keeps_eager_and_graph_runs_apart():
    rows = []
    for mode, ms in (("eager", 8.0), ("CUDA graph", 0.5)):
        run = dict(backend="triton", cache="on", launch_mode=mode, prompt_tokens=4)
        rows.append(run | dict(phase="prefill", latency_ms=3.0, modeled_mb=1.0))
        rows += [run | dict(phase="decode", latency_ms=ms + i, modeled_mb=2.0) for i in range(3)]
    table = views.compare_table(pd.DataFrame(rows)).set_index("launch_mode")
    assert table.loc["eager", "decode_ms_p50"] == 9.0 and table.loc["CUDA graph", "decode_ms_p50"] == 1.5
    assert table.loc["CUDA graph", "last_step_ms"] == 2.5 and set(table.ttft_ms) == {3.0}


def test_the_generate_handler_streams_and_keeps_the_run_in_state():
    job = handlers.make(context())["generate"]
    outputs = collect(job(values(prompt="import os", new_tokens=3, fusion="decode"), handlers.NEW_STATE))
    assert all(len(o) == len(handlers.GENERATE_OUT) + 1 for o in outputs)
    final = dict(zip([*handlers.GENERATE_OUT, "state"], outputs[-1], strict=True))
    assert final["text"].startswith("import os") and cell(final["summary"], "fusion rung").startswith("decode:")
    assert final["state"]["previous"] is None and list(final["state"]["steps"].step) == [0, 1, 2]
    # Every output has its value by the end: an API client's result is the whole run.
    assert not any(v == gr.skip() for v in outputs[-1])
    if torch.cuda.is_available():  # decode steps replay a graph, and kernels are counted
        assert "replayed as one CUDA graph" in final["summary"] and "counted by torch.profiler" in final["summary"]
    else:  # on CPU the box is ignored and the summary says the steps launched from Python
        assert "each launched from Python" in final["summary"] and "kernels are counted on a GPU" in final["summary"]


def test_a_run_of_one_token_says_what_it_lacks_rather_than_nan_or_blanks():
    """One new token is a prefill and no decode step: the step's rows say so, in both columns on CPU."""
    job = handlers.make(context())["generate"]
    outputs = collect(job(values(new_tokens=1), handlers.NEW_STATE))
    final = dict(zip([*handlers.GENERATE_OUT, "state"], outputs[-1], strict=True))
    summary = final["summary"]
    assert "nan" not in summary.lower(), summary
    assert cell(summary, "bytes per token (modeled)") == "no decode step yet", summary
    step = next(line for line in summary.splitlines() if line.startswith("| decode step p50 / p90"))
    shown = [v.strip() for v in step.strip().strip("|").split("|")[1:]]  # this CPU's, and on CPU the GPU's
    assert shown and all(v == "needs two tokens" for v in shown), step


def test_a_job_estimated_past_the_budget_is_refused_at_once(monkeypatch):
    monkeypatch.setenv("EXPLORER_JOB_SECONDS", "5")
    job = handlers.make(context())["generate"]
    t0 = time.monotonic()
    with pytest.raises(gr.Error, match=r"would take about .* one run may take at most 5 s\. Lower the new tokens"):
        collect(job(values(new_tokens=2048, prompt_tokens=900, batch=16), handlers.NEW_STATE))
    assert time.monotonic() - t0 < 5


def test_use_best_sends_the_sweep_winner_to_the_tile_controls():
    from explorer.app import ui

    best = TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    updates = ui._use_best({"best": ("attention", best)})
    named = dict(zip(settings.TILES, updates, strict=True))
    assert named["attention_block_m"]["value"] == "64" and named["attention_num_stages"]["value"] == "2"
    assert named["attention_autotune"]["value"] is False
    assert named["linear_block_m"] == gr.skip()


def test_export_without_a_run_is_a_clear_error():
    export = handlers.make(context())["export"]
    with pytest.raises(gr.Error, match="Nothing to export yet"):
        export({"which": "last run: steps", "fmt": "csv"}, handlers.NEW_STATE)


def test_a_refused_value_names_the_field_and_runs_nothing():
    ran = []
    runner = InlineRunner(wrap=lambda fn, job: ran.append(job.kind) or fn)  # every job it would run, recorded
    job = handlers.make(handlers.Context(runner, device=models.device().type))["generate"]
    with pytest.raises(gr.Error, match="new tokens must be a whole number"):
        collect(job(values(new_tokens=1.5), handlers.NEW_STATE))
    with pytest.raises(gr.Error, match="attention block_m must be one of 'default', '16'"):
        collect(job(values(attention_block_m="48"), handlers.NEW_STATE))
    assert ran == []


def test_compare_refuses_lengths_past_the_models_positions_before_any_work():
    job = handlers.make(context())["compare"]
    with pytest.raises(gr.Error, match=r"A prompt of 1000 tokens and 64 new tokens need 1064 positions; the model"):
        collect(job(values(lengths="8, 1000", new_tokens=64), handlers.NEW_STATE))


def test_the_default_generate_and_the_readme_example_read_without_a_repeated_phrase():
    """What a visitor and the README's API example get by default: sampled as people decode, so the small
    model does not loop ("facility of the facility of the ...")."""
    from explorer.model.sampling import SUGGESTED, repeated_phrase

    d = settings.defaults(models.device().type, {"dtype": models.default_dtype()})
    assert {k: d[k] for k in SUGGESTED} == SUGGESTED
    assert {k: getattr(settings.RunSettings(), k) for k in SUGGESTED} == SUGGESTED
    for prompt, tokens in (("def fibonacci(n):", 32), (settings.EXAMPLES[0], d["new_tokens"])):
        s = settings.RunSettings(prompt=prompt, new_tokens=tokens, backend="torch")
        updates = list(jobs.JOBS["generate"]({"settings": s}, NEVER))
        text = next(u["text"] for u in reversed(updates) if "text" in u)
        assert repeated_phrase(text[len(prompt) :]) is None, text


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a visitor without a GPU sees")
@pytest.mark.parametrize("new_tokens,how", [(None, "recorded"), (3, "modeled")])
def test_on_cpu_every_chart_of_a_time_has_the_gpus_answer_beside_it(new_tokens, how):
    """The CPU's default job is recorded on an H200 (assets/recorded/jobs_h200.json) and shown beside it; any
    other job gets the GPU's time from the time model (gpu_time.py), and says so."""
    import json

    d = settings.defaults("cpu", {"dtype": "float32"})
    s = settings.RunSettings(prompt=d["prompt"], new_tokens=new_tokens or d["new_tokens"], dtype="float32")
    last = {}
    for update in jobs.JOBS["generate"]({"settings": s}, NEVER):
        last |= update
    figure = {name: json.loads(last[name])["layout"] for name in ("latency", "share", "bandwidth", "roofline")}
    panels = [a["text"] for a in figure["latency"]["annotations"]]
    assert panels == [f"NVIDIA H200, {how}", "this CPU (interpreter)"], panels
    assert "Python running each program" in figure["latency"]["title"]["text"]
    for name in ("share", "bandwidth", "roofline"):
        assert "NVIDIA H200" in figure[name]["title"]["text"], (name, figure[name]["title"]["text"])
    assert f"| measure | NVIDIA H200 ({how}) | this CPU (interpreter) |" in last["summary"]
    if how == "modeled":
        title = figure["latency"]["title"]["text"]
        assert "modeled: each kernel's bytes at" in title and "held out of the fit" in title, title


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a visitor without a GPU sees")
def test_on_cpu_compare_shows_the_gpus_time_first():
    """(The ladder's GPU time first: test_the_ladder_shows_each_rung_as_it_is_measured.)"""
    import json

    d = settings.defaults("cpu", {"dtype": "float32"})
    s = settings.RunSettings(prompt=d["prompt"], new_tokens=d["new_tokens"], dtype="float32")
    compare = {}
    short = dataclasses.replace(s, new_tokens=2)  # not the recorded job: the GPU's side is modeled
    for update in jobs.JOBS["compare"]({"settings": short, "lengths": [3]}, NEVER):
        compare |= update
    panels = [a["text"] for a in json.loads(compare["plot"])["layout"]["annotations"]]
    assert panels == ["NVIDIA H200, modeled", "this CPU (interpreter)"], panels


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a visitor without a GPU sees")
def test_on_cpu_the_recorded_compare_runs_every_run_beside_its_gpu_note(monkeypatch):
    """The default Compare's H200 recording carries a note on the cache: the note is not a reason to stop (it once
    took the stop reason's name, and the default Compare ended after its first run). A Compare of 2 new tokens is
    shown beside that recording here, each of its runs checked to carry the note."""
    from explorer.app import counterpart

    d = settings.defaults("cpu", {"dtype": "float32"})
    default = settings.RunSettings(prompt=d["prompt"], new_tokens=d["new_tokens"], dtype="float32")
    lengths = settings.check("lengths", d["lengths"])
    recorded = counterpart.for_compare(default, lengths, None)
    note = counterpart.cache_note(recorded.tables["compare"], recorded.gpu)
    assert recorded.recorded and note
    monkeypatch.setattr(counterpart, "for_compare", lambda *args, **kwargs: recorded)
    s = settings.RunSettings(prompt=d["prompt"], new_tokens=2, dtype="float32")
    updates = [u for u in jobs.JOBS["compare"]({"settings": s, "lengths": lengths}, NEVER) if "status" in u]
    statuses = [u["status"] for u in updates]
    runs = len(statuses)
    assert runs > 1 and statuses[-1] == f"all {runs} runs", statuses
    for u in updates:  # the note under the chart's title, wrapped into lines of small type
        title = json.loads(u["plot"])["layout"]["title"]["text"]
        assert note in " ".join(re.findall(r"<sup>(.*?)</sup>", title)), title


@pytest.mark.parametrize("timeout_api", [True, False], ids=["asyncio.timeout", "without it (Python 3.10)"])
def test_a_cancel_that_comes_as_a_message_does_is_not_lost(monkeypatch, timeout_api):
    """The runner waits for the worker's next message with runner.next_message. A Stop that comes just as a
    message is taken must stop the job: asyncio.wait_for (before Python 3.12) returns the message and drops
    the cancel, so a cancelled Generate streamed on to its last token (every one of 200 tries here on 3.11)."""
    from explorer.app.runner import next_message

    if not timeout_api:
        monkeypatch.delattr(asyncio, "timeout", raising=False)

    async def consume(queue, taken):
        while True:
            taken.append(await next_message(queue, 5.0))

    async def trial():
        queue, taken = asyncio.Queue(), []
        task = asyncio.create_task(consume(queue, taken))
        loop = asyncio.get_running_loop()
        for i in range(20):
            loop.call_soon(queue.put_nowait, i)
            if i == 10:
                loop.call_soon(task.cancel)  # in the same turn of the loop as a message
            await asyncio.sleep(0)
        done, _ = await asyncio.wait({task}, timeout=0.5)
        task.cancel()
        return bool(done) and task.cancelled(), taken + [queue.get_nowait() for _ in range(queue.qsize())]

    async def trials():
        return [await trial() for _ in range(200)]

    for stopped, messages in asyncio.run(trials()):
        assert stopped  # the cancel reached the consumer
        assert sorted(messages) == list(range(20))  # none lost: each taken, or still queued


def test_next_message_waits_for_a_message_and_times_out_without_one():
    from explorer.app.runner import next_message

    async def go():
        queue = asyncio.Queue()
        asyncio.get_running_loop().call_later(0.05, queue.put_nowait, "update")
        got = await next_message(queue, 5.0)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await next_message(queue, 0.1)
        return got, time.monotonic() - start

    got, waited = asyncio.run(go())
    assert got == "update" and waited >= 0.09


def test_the_worker_settles_collecting_its_garbage_before_freezing_what_lives():
    """A worker's warm-up ends with its objects out of the collector's sight; garbage made before that (a cycle
    no one refers to) is collected first, not frozen for the worker's life."""
    import gc
    import weakref

    from explorer.app import worker

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    try:
        line = worker.settle()
        assert gone() is None and gc.get_freeze_count() > 0
        assert line.startswith("a full garbage collection ") and "frozen" in line
    finally:
        gc.unfreeze()
