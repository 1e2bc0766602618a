"""Guided lessons on CPU: each runs, and the numbers its explanation quotes are its own run's measurements;
an unknown lesson is refused by name; recordings round-trip and are labelled with their GPU and date."""

import dataclasses
import json
import re
import statistics
import subprocess
import sys
import types
from pathlib import Path

import gradio as gr
import numpy as np
import pandas as pd
import pytest
import torch

from explorer.app import handlers, lessons, recordings
from explorer.app.lessons import base, recorded

ROOT = Path(__file__).resolve().parent.parent
H200 = dict(gpu="NVIDIA H200", device_type="cuda", size="gpu", date="2026-11-30T09:00:00+00:00")
H200 |= dict(torch="2.13.0", triton="3.9.0", transformers="5.24.0")
# What a visitor without a GPU sees beside each lesson; on a GPU a lesson shows its own run instead.
without_a_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the recorded view is shown without a GPU")


@pytest.fixture(scope="module")
def runs():
    """Each lesson's CPU job, run once for the module."""
    cache = {}

    def run(name):
        if name not in cache:
            cache[name] = lessons.run(name, "cpu")
        return cache[name]

    return run


def _ends(values):
    values = list(values)
    k = max(1, len(values) // 8)
    return statistics.median(values[:k]), statistics.median(values[-k:])


def _decode(steps):
    return steps[steps.phase == "decode"].latency_ms


def check_memory(r):
    kinds, steps = r.tables["kinds"], r.tables["steps"]
    return [
        ("step_ms", statistics.median(_decode(steps)), base.ms),
        ("last_hbm_mb", kinds.hbm_mb.sum(), None),
        ("top_kind", kinds.loc[kinds.hbm_mb.idxmax()].kind, str),
    ]


def check_decode_step(r):
    kinds = r.tables["kinds"]
    top = kinds.loc[kinds.kernel_ms.idxmax()]
    return [("kernel_ms", kinds.kernel_ms.sum(), base.ms), ("top", top.kind, lambda v: f"**{v}**")]


def check_kv_cache(r):
    steps, kernels = r.tables["steps"], r.tables["kernels"]
    on, off = (steps[steps.cache == c] for c in ("on", "off"))
    off_kernels = kernels[kernels.cache == "off"].kernel_ms
    return [
        ("on_early_ms", _ends(_decode(on))[0], base.ms),
        ("on_late_ms", _ends(_decode(on))[1], base.ms),
        ("off_early_ms", _ends(_decode(off))[0], base.ms),
        ("off_late_ms", _ends(_decode(off))[1], base.ms),
        ("off_total_ms", off.latency_ms.sum(), base.ms),
        ("off_last_kernel_ms", off_kernels.iloc[-1], base.ms),
    ]


def check_tiling(r):
    sweep = r.tables["sweep"]
    valid = sweep[sweep.valid]
    return [
        ("fast_us", valid.us.min(), base.duration),
        ("small_mb", valid.iloc[0].modeled_mb, base.mb),
        ("large_mb", valid.iloc[-1].modeled_mb, base.mb),
    ]


def check_cuda_graphs(r):
    steps = r.tables["steps"]
    return [("eager_ms", statistics.median(_decode(steps[steps.launch == "eager"])), base.ms)]


def check_prefill_decode(r):
    steps = r.tables["steps"]
    prefill = steps[steps.phase == "prefill"].latency_ms.iloc[0]
    return [
        ("prefill_ms", prefill, base.ms),
        ("decode_ms", statistics.median(_decode(steps)), base.ms),
        ("prefill_per_token_ms", prefill / r.settings["prompt_tokens"], base.ms),
    ]


def check_fusion(r):
    ladder = r.tables["ladder"].set_index("rung")
    return [
        ("none_ms", ladder.step_ms["none"], base.ms),
        ("decode_ms", ladder.step_ms["decode"], base.ms),
        ("overlap_ms", ladder.step_ms["overlap"], base.ms),
        ("torch_ms", ladder.step_ms["torch"], base.ms),
        ("epilogue_launches", ladder.launches["epilogue"], None),
        ("decode_hbm_mb", ladder.hbm_mb["decode"], base.mb),
    ]


def check_blocks(r):
    """Each figure from the run's tables or the models' shapes, worked out here: one token's K and V is
    2 x layers x key/value heads x head dim x 4 bytes (float32)."""
    steps, t = r.tables["steps"], r.tables["bytes"]
    sh = r.settings["blocks"]
    head_dim = sh["width"] // sh["heads"]
    kb = lambda n: f"{base.num(n / 1024)} KB"
    out = []
    for key, family, kv_heads in (("gpt2", "GPT-2", sh["heads"]), ("llama", "Llama", sh["kv_heads"])):
        out += [
            (f"{key}_step_ms", statistics.median(_decode(steps[steps.family == family])), base.ms),
            (f"{key}_kv_per_token", 2.0 * sh["layers"] * kv_heads * head_dim * 4, kb),
        ]
    totals = [base.mb(t[t.family == f].hbm_mb.sum()) for f in ("GPT-2", "Llama")]
    return out + [("shape_width", sh["width"], None), ("totals", " → ".join(totals), None)]


def check_sms(r):
    """The largest grid of the first variant and of the same rung at the wider tiles, read from the compiled
    kernels' table (the interpreter runs nothing on SMs: each kernel compiled for the H100/H200 and placed)."""
    kernels = r.tables["kernels"]
    first, wide = (kernels[kernels.variant == v] for v in kernels.variant.unique()[:2])
    big, wide_big = first.loc[first.programs.idxmax()], wide.loc[wide.programs.idxmax()]
    return [
        ("variants.0.launches", len(first), lambda v: f"**{v} kernels**"),
        ("variants.0.programs", first.programs.sum(), lambda v: f"**{v:,} programs**"),
        ("variants.0.big_resident", big.resident, lambda v: f"**{v} such programs at once**"),
        ("variants.0.big_limiter", big.limiter, lambda v: f"limited by its **{v}**"),
        ("variants.0.big_waves", big.waves, lambda v: f"**{v:.2f} waves**"),
        ("variants.1.big_resident", wide_big.resident, lambda v: f"{v} fit an SM"),
        ("variants.1.programs", wide.programs.sum(), lambda v: f"become {v:,}"),
        ("variants.1.short_grids", (wide.programs < 132).sum(), lambda v: f"**{v} of its"),  # the H100's 132 SMs
        ("variants.0.short_grids", (first.programs < 132).sum(), lambda v: f"(against {v})"),
    ]


CHECKS = {
    "memory": check_memory,
    "decode-step": check_decode_step,
    "kv-cache": check_kv_cache,
    "tiling": check_tiling,
    "cuda-graphs": check_cuda_graphs,
    "prefill-decode": check_prefill_decode,
    "fusion": check_fusion,
    "blocks": check_blocks,
    "sms": check_sms,
}


def test_nine_lessons_in_teaching_order_each_with_a_check():
    assert lessons.names() == [
        "memory",
        "decode-step",
        "kv-cache",
        "tiling",
        "cuda-graphs",
        "prefill-decode",
        "fusion",
        "blocks",
        "sms",
    ]
    assert set(CHECKS) == set(lessons.names())
    assert [label for label, _ in lessons.choices()][2] == "3. The KV cache on and off"
    for lesson in lessons.LESSONS.values():
        for size in ("cpu", "gpu"):
            assert lessons.describe(lesson.settings(size))  # both sizes are defined
        assert lesson.try_next and lesson.summary


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_explanation_quotes_this_runs_measurements(runs, name):
    r = runs(name)
    text = lessons.live_markdown(r)
    assert text.startswith(f"#### {lessons.LESSONS[name].title}, measured just now on {r.device}")
    assert "**What to try next:**" in text
    for fact, measured, shown in CHECKS[name](r):
        if fact == "totals":  # a figure the text adds up from the tables itself
            assert f"**{measured}**" in text
            continue
        value = _fact(r.facts, fact)
        if isinstance(value, list):  # decode-step's top kinds: (kind, ms, share)
            value = value[0][0]
        assert value == (measured if isinstance(measured, str) else pytest.approx(measured)), fact
        if shown is not None:
            assert shown(value) in text, (fact, shown(value))
    # The same facts with other values give other text: the numbers are not written into it.
    scaled = _scaled(r.facts)
    assert lessons.LESSONS[name].explain(base.Result(name, r.settings, scaled, r.tables, r.device, 1.0)) != (
        lessons.LESSONS[name].explain(r)
    )
    figure = lessons.LESSONS[name].figure(r)
    assert figure.layout.font.size >= 20 and figure.layout.title.font.size >= 24  # readable from the back
    assert f"measured just now: {r.device}" in figure.layout.title.text


@pytest.mark.gpu
def test_the_sms_lesson_on_a_gpu_sees_on_each_sm_the_programs_it_computed(gpu_alone):
    """On the GPU: every variant's step stamped (a problem raises), replayed with stamps within 1.5x of its time
    without (plus 20 us); no SM ever holding more programs of a launch than the compiled kernel's residency; at the
    decode rung, where each kernel has the GPU to itself, the busiest SM of every launch holding as many as
    computed (its residency, or the grid's programs over the SMs where fewer). At the overlap rung a kernel's
    programs share the SMs with the one before (PDL), so there the text only counts where it held."""
    r = lessons.run("sms", "gpu")
    variants = r.facts["variants"]
    assert len(variants) == 4 and len(r.tables["kernels"]) == sum(v["launches"] for v in variants)
    kernels = r.tables["kernels"]
    assert (kernels.seen_at_once <= kernels.resident).all()  # never more on an SM than its resources allow
    for v in variants:
        if v["rung"] == "decode":  # each kernel alone on the GPU: its grid spread evenly over the SMs
            assert v["residency_held"] == v["launches"], v
        assert v["stamped_ms"] <= 1.5 * v["step_ms"] + 0.02, v
        assert 0 <= v["idle"] < 1
    held, total = sum(v["residency_held"] for v in variants), sum(v["launches"] for v in variants)
    assert f"in **{held} of {total} launches**" in lessons.live_markdown(r)
    assert len(lessons.LESSONS["sms"].figure(r).data) == 4


def test_the_sms_lessons_gpu_text_and_chart_come_from_its_facts_and_tables(runs):
    """What a GPU run of the SMs lesson shows, from a GPU-shaped result built on the CPU run's tables: the steps'
    times and idle shares quoted, the fastest named, the launches where the residency held counted, what the
    overlap rung's bars hold said, and one line of busy SMs a variant."""
    cpu = runs("sms")
    kernels = cpu.tables["kernels"].assign(seen_at_once=cpu.tables["kernels"].resident)
    kernels["computed_at_once"] = kernels.resident.where(kernels.variant != kernels.variant.iloc[-1], 0)
    times = {"decode": (0.30, 0.31, 0.6), "overlap": (0.25, 0.26, 0.03)}
    variants = []
    for v in cpu.facts["variants"]:
        step, stamped, idle = times[v["rung"]]
        held = int((kernels[kernels.variant == v["variant"]].computed_at_once > 0).sum())
        variants.append(v | dict(step_ms=step, stamped_ms=stamped, idle=idle, residency_held=held))
    running = pd.concat(
        pd.DataFrame({"variant": v["variant"], "t_us": [0.0, 1.0], "programs": [3, 0], "sms": [2, 0]}) for v in variants
    )
    facts = cpu.facts | dict(gpu="NVIDIA H100 80GB HBM3", context=1000, variants=variants)
    r = base.Result("sms", cpu.settings, facts, {"kernels": kernels, "running": running}, "NVIDIA H100 80GB HBM3", 9.0)
    text = lessons.LESSONS["sms"].explain(r)
    launches = sum(v["launches"] for v in variants)
    held = launches - variants[-1]["launches"]
    assert f"in **{held} of {launches} launches**" in text
    slow, fast = variants[0]["variant"], variants[2]["variant"]
    assert f"The fastest, {fast}, was 1.20x as fast as {slow}." in text
    assert "SMs idle **60%** of it" in text and "SMs idle **3%** of it" in text
    assert "look busy (97% of the step, against 40% at decode) for a step 1.20x as fast" in text
    assert "nothing runs" not in text  # the CPU's words about compiling, not said of a GPU's run
    figure = lessons.LESSONS["sms"].figure(r)
    assert [t.name for t in figure.data] == [v["variant"] for v in variants]
    assert "SMs busy of 132, 0.01-µs means" in figure.layout.yaxis.title.text  # 1 µs in 100 spans
    # 2 SMs busy for the step's first microsecond, none after: each span of it averages 2.
    assert all(list(t.y) == [2.0] * 100 for t in figure.data)


def test_the_busy_sms_are_averaged_over_spans_weighted_by_how_long_each_count_held():
    from explorer.app.lessons.sms import _binned

    t, busy = np.array([0.0, 1.0, 2.0, 3.0]), np.array([10, 0, 10, 0])
    at, means = _binned(t, busy, 2.0)
    assert list(at) == [1.0, 3.0] and list(means) == [5.0, 5.0]  # half of each span at 10 SMs
    at, means = _binned(np.array([0.5, 1.0]), np.array([4, 0]), 0.5)
    assert list(at) == [0.25, 0.75] and list(means) == [0.0, 4.0]  # nothing ran before the first program


def _fact(facts, path: str):
    """A fact by name, or inside a list or dict of facts by a dotted path: variants.0.big_waves."""
    for part in path.split("."):
        facts = facts[int(part)] if isinstance(facts, list) else facts[part]
    return facts


def _scaled(value):
    """Every float among the facts, however nested, times 1.37."""
    if isinstance(value, dict):
        return {k: _scaled(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scaled(v) for v in value]
    if isinstance(value, float):
        return value * 1.37
    return value


def test_a_share_below_one_percent_is_not_shown_as_zero():
    from explorer.app.lessons.base import pct

    assert [pct(x) for x in (0.5, 0.126, 0.0003, 0.0011, 0.0)] == ["50%", "13%", "0.03%", "0.11%", "0%"]


def test_an_unknown_lesson_is_refused_with_the_allowed_names():
    import asyncio

    from explorer.app.runner import InlineRunner

    lesson = handlers.make(handlers.Context(InlineRunner()))["lesson"]
    for bad in ("nope", 5, None):
        with pytest.raises(gr.Error, match=r"lesson must be one of 'memory', 'decode-step', .*; got "):
            asyncio.run(lesson({"lesson": bad}).__anext__())
    # A lesson's first word on the page says what runs and about how long (the lesson itself is not run here).
    first = asyncio.run(lesson({"lesson": "tiling"}).__anext__())[0]
    assert re.fullmatch(r"\*Running .+ \((about \d+(\.\d)? s|under a second) on this (CPU|GPU)\)…\*", first), first
    with pytest.raises(gr.Error, match="got 'fused'"):
        handlers.pick_lesson("fused")
    # "Run the lesson again" with none picked says what to do, in the introduction's place.
    assert handlers.pick_lesson(None)[0] == "Pick a lesson above."


def test_picking_a_lesson_sets_the_controls_to_its_job():
    intro, *updates = handlers.pick_lesson("kv-cache")
    assert intro.startswith("### The KV cache on and off") and "Estimate: " in intro
    named = dict(zip(handlers.LESSON_CONTROLS, updates, strict=True))
    s = lessons.LESSONS["kv-cache"].settings(lessons.size())
    assert named["new_tokens"]["value"] == s["new_tokens"] and named["cache"]["value"] is False
    assert named["backend"]["value"] == s["backend"]
    assert named["kernel"] == gr.skip()  # a Generate lesson leaves the sweep tab alone
    _, *updates = handlers.pick_lesson("tiling")
    assert dict(zip(handlers.LESSON_CONTROLS, updates, strict=True))["kernel"]["value"] == "linear"


def test_a_link_with_a_lesson_opens_the_lessons_tab_with_it_picked():
    tab, pick = handlers.open_link(types.SimpleNamespace(query_params={"lesson": "kv-cache"}))
    assert tab.selected == "lessons" and pick["value"] == "kv-cache"
    assert all(v == gr.skip() for v in handlers.open_link(types.SimpleNamespace(query_params={})))
    with pytest.warns(UserWarning, match="There is no lesson 'nope'; the lessons are memory, decode-step"):
        tab, pick = handlers.open_link(types.SimpleNamespace(query_params={"lesson": "nope"}))
    assert tab.selected == "lessons" and pick == gr.skip()
    # A visitor's text in the link is shown as text, never as markup, and cut short.
    link = "<h1>Session expired</h1><form action=x><input name=pw></form>" + "x" * 200
    with pytest.warns(UserWarning) as warned:
        handlers.open_link(types.SimpleNamespace(query_params={"lesson": link}))
    message = str(warned[0].message)
    assert "<h1>" not in message and "<form" not in message and "&lt;h1&gt;" in message and len(message) < 300


@without_a_gpu
def test_a_recording_round_trips_and_is_labelled_with_its_gpu_and_date(runs, tmp_path):
    names = ["tiling", "kv-cache", "prefill-decode"]
    # As a GPU recording has them: the first run's seconds and the kernel specializations it compiled.
    compiling = {"3f2a": 1.25, "9c01": 0.5}
    results = {
        name: dataclasses.replace(runs(name), first_s=9.5, kernels=("3f2a", "9c01"), rebuilt_s=1.5, compile_s=compiling)
        for name in names
    }
    path = recorded.save(tmp_path / "lessons_h200.json", H200, results)
    assert path.stat().st_size < 200_000
    json.loads(path.read_text())  # plain JSON: no NaN
    rec = recorded.latest(tmp_path)
    assert rec.label == "recorded on NVIDIA H200, 2026-11-30" and "triton 3.9.0" in rec.versions
    for name in names:
        original, loaded = results[name], rec.results[name]
        assert loaded.facts == json.loads(json.dumps(recordings.plain(original.facts)))
        assert (loaded.first_s, tuple(loaded.kernels)) == (9.5, ("3f2a", "9c01"))
        assert (loaded.rebuilt_s, loaded.compile_s) == (1.5, compiling)
        assert lessons.LESSONS[name].explain(loaded) == lessons.LESSONS[name].explain(original)
        for key, table in original.tables.items():
            assert list(loaded.tables[key].columns) == list(table.columns) and len(loaded.tables[key]) == len(table)
        figure = lessons.LESSONS[name].figure(loaded)
        assert "recorded on NVIDIA H200, 2026-11-30" in figure.layout.title.text
    text, figure = lessons.recorded_view("tiling", tmp_path)
    assert text.startswith("#### Tiling and shared memory, recorded on NVIDIA H200, 2026-11-30") and figure is not None
    text, figure = lessons.recorded_view("memory", tmp_path)  # not in this recording
    assert "has no lesson 'memory'" in text and figure is None


def test_a_lesson_recorded_later_into_a_recording_carries_its_own_gpu_date_and_versions(runs, tmp_path):
    path = recorded.save(tmp_path / "lessons_h200.json", H200, {n: runs(n) for n in ("tiling", "sms")})
    later = H200 | dict(gpu="NVIDIA H100 80GB HBM3", date="2026-12-06T02:00:00+00:00", triton="3.6.0")
    newer = dataclasses.replace(runs("sms"), facts=_scaled(runs("sms").facts))
    before = recorded.load(path).meta
    recorded.merge(path, later | dict(command="ignored", seconds=9.0), {"sms": newer})
    rec = recorded.load(path)
    assert rec.meta == before and rec.meta["date"] == H200["date"]  # the file's own, kept
    assert rec.label_of("tiling") == "recorded on NVIDIA H200, 2026-11-30" and "triton 3.9.0" in rec.versions_of(
        "tiling"
    )
    assert rec.label_of("sms") == "recorded on NVIDIA H100 80GB HBM3, 2026-12-06" and "triton 3.6.0" in rec.versions_of(
        "sms"
    )
    assert rec.results["sms"].facts == json.loads(json.dumps(recordings.plain(newer.facts)))
    assert rec.results["tiling"].source == "recorded on NVIDIA H200, 2026-11-30"
    text, _ = lessons.recorded_view("sms", tmp_path)
    if not torch.cuda.is_available():
        assert text.startswith("#### SMs, warps and occupancy, recorded on NVIDIA H100 80GB HBM3, 2026-12-06")
        assert "triton 3.6.0" in text
    recorded.merge(path, H200 | dict(date="2026-12-07T00:00:00+00:00"), {"tiling": runs("tiling")})
    rec = recorded.load(path)  # a second merge keeps the first's lesson as it was labelled
    assert rec.label_of("sms").endswith("2026-12-06") and rec.label_of("tiling").endswith("2026-12-07")


@without_a_gpu
def test_without_a_gpu_recording_the_lesson_says_so(runs, tmp_path):
    assert lessons.recorded_view("tiling", tmp_path) == (recorded.NONE_YET, None)
    # A recording made on a CPU is never shown as a GPU's.
    recorded.save(tmp_path / "lessons_cpu.json", dict(H200, gpu="CPU", device_type="cpu"), {"tiling": runs("tiling")})
    assert lessons.recorded_view("tiling", tmp_path) == (recorded.NONE_YET, None)
    assert "No GPU recording is available yet" in recorded.NONE_YET


def test_the_shipped_recordings_are_gpu_recordings_or_the_ui_says_there_are_none():
    shipped = sorted(recordings.FOLDER.glob("lessons_*.json"))
    assert sum(p.stat().st_size for p in shipped) < 1 << 20
    rec = recorded.latest()
    if rec is None:
        assert lessons.recorded_view("kv-cache")[0] == recorded.NONE_YET
    else:
        assert rec.meta["device_type"] == "cuda" and set(rec.results) <= set(lessons.names())


@without_a_gpu
def test_a_recording_from_an_earlier_version_of_a_lesson_asks_for_a_new_one(runs, tmp_path):
    r = runs("tiling")
    old = base.Result("tiling", r.settings, {k: v for k, v in r.facts.items() if k != "fast_us"}, r.tables, "X", 1.0)
    recorded.save(tmp_path / "lessons_h200.json", H200, {"tiling": old})
    text, figure = lessons.recorded_view("tiling", tmp_path)
    assert "made by an earlier version" in text and "record_lessons.py" in text and figure is None


@without_a_gpu
def test_the_recording_script_on_cpu(tmp_path):
    out = tmp_path / "lessons_cpu.json"
    cmd = [sys.executable, "scripts/record_lessons.py", "--size", "cpu", "--out", str(out), "--lessons", "tiling"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tiling: the linear kernel at M=64" in done.stdout and f"wrote {out}" in done.stdout
    rec = recorded.load(out)
    assert rec.meta["gpu"] == "CPU" and rec.meta["device_type"] == "cpu" and rec.meta["torch"] and rec.meta["triton"]
    assert list(rec.results) == ["tiling"] and rec.results["tiling"].facts["configs"] == 9
    # Another lesson recorded into it: the first kept as it was, the new one labelled with its own run.
    cmd = [sys.executable, "scripts/record_lessons.py", "--size", "cpu", "--lessons", "memory", "--into", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    merged = recorded.load(out)
    assert list(merged.results) == ["tiling", "memory"] and merged.meta == rec.meta
    assert merged.results["tiling"].facts == rec.results["tiling"].facts and "memory" in merged.own
    for wrong in (["--into", str(out)], ["--lessons", "memory", "--into", str(tmp_path / "none.json")]):
        refused = subprocess.run(
            [sys.executable, "scripts/record_lessons.py", *wrong], cwd=ROOT, capture_output=True, text=True
        )
        assert refused.returncode != 0 and "--into takes an existing recording" in refused.stderr
    if not torch.cuda.is_available():  # with no GPU, nothing lands in assets/recorded/ by default
        refused = subprocess.run(
            [sys.executable, "scripts/record_lessons.py"], cwd=ROOT, capture_output=True, text=True
        )
        assert refused.returncode != 0 and "pass --out" in refused.stderr


def test_forget_models_drops_the_models_the_lessons_built_for_themselves():
    """The recording's way to meet a lesson as a fresh server would: the lessons' own models (and the graphs they
    keep) are built again after forget_models."""
    from explorer.app.lessons import base, blocks, forget_models

    shape = (("width", 64), ("vocab", 128), ("layers", 1), ("heads", 2), ("kv_heads", 1))
    first = blocks.pair(shape, "cpu", torch.float32)
    assert blocks.pair(shape, "cpu", torch.float32) is first
    forget_models()
    assert blocks.pair(shape, "cpu", torch.float32) is not first
    assert base._gpt2_shape.cache_info().currsize == 0
    forget_models()
