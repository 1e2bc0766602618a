"""The timeline of a decode step on the SMs (kernels.stamps, kernels.launch.stamping, explorer.measure.timeline): the
stamping buffer's layout read back from a synthetic buffer, the idle share against hand-worked cases, the checks a
GPU run must pass, and the chart. The stamps themselves are written on a GPU only (tests/test_compile.py builds the
stamped variant of every kernel for the H200; the GPU suite runs one)."""

import re

import numpy as np
import pandas as pd
import pytest
import torch

from explorer.app.timeline_figure import timeline_figure
from explorer.measure import timeline
from explorer.model.weights import BUNDLED_LLAMA, DEFAULT_MODEL, load_model
from kernels import launch, layer_norm
from kernels.stamps import SLOT


def buffer(programs: list[tuple[int, int, int]]) -> np.ndarray:
    """A stamping buffer holding (start ns, end ns, SM) per program, in SLOT int64s each."""
    values = np.zeros(len(programs) * SLOT, dtype=np.int64)
    for p, (start, end, sm) in enumerate(programs):
        values[p * SLOT : p * SLOT + 3] = (start, end, sm)
    return values


LAUNCHES = [("_layer_norm_kernel", (2, 1, 1), 0, "ln_1"), ("_decode_merge_kernel", (1, 2, 1), 2, "attn")]


def test_the_buffer_reads_back_as_one_row_per_program_of_each_launch():
    values = buffer([(1000, 1400, 3), (1100, 1300, 7), (1500, 2000, 3), (1500, 1900, 0)])
    frame = timeline.intervals(LAUNCHES, values)
    assert list(frame.kernel) == ["layer_norm", "layer_norm", "decode_merge", "decode_merge"]
    assert list(frame.operation) == ["ln_1", "ln_1", "attn", "attn"]
    assert list(frame.program) == [0, 1, 0, 1] and list(frame.sm) == [3, 7, 3, 0]
    assert list(frame.start_ns) == [0, 100, 500, 500] and list(frame.end_ns) == [400, 300, 1000, 900]
    assert timeline.check(frame, LAUNCHES, window_ns=1000) == []


def test_the_checks_name_a_missing_stamp_a_short_grid_and_a_span_past_the_step():
    values = buffer([(1000, 1400, 3), (0, 0, 0), (1500, 2000, 3), (1500, 1900, 0)])
    frame = timeline.intervals(LAUNCHES, values)
    assert timeline.check(frame, LAUNCHES, window_ns=5000) == ["1 programs without a start and an end"]
    frame = timeline.intervals(LAUNCHES, buffer([(1000, 1400, 3), (1100, 1300, 7), (1500, 2000, 3), (1500, 1900, 0)]))
    longer = [LAUNCHES[0], ("_decode_merge_kernel", (1, 3, 1), 2, "attn")]
    assert timeline.check(frame.iloc[:4], longer, window_ns=999) == [
        "launch 1 (_decode_merge_kernel): 2 programs stamped, its grid has 3",
        "intervals outside the step's 999 ns",
    ]


@pytest.mark.parametrize(
    "programs,sms,idle",
    [
        ([(0, 100, 0)], 1, 0.0),  # one SM busy throughout
        ([(0, 100, 0)], 4, 0.75),  # three of four never used
        ([(0, 50, 0), (50, 100, 1)], 2, 0.5),  # each busy half the window
        ([(0, 60, 0), (40, 100, 0), (0, 100, 1)], 2, 0.0),  # overlapping programs on one SM count once
        ([(0, 10, 0), (90, 100, 0)], 1, 0.8),  # a gap between two launches
    ],
)
def test_the_idle_share_is_sm_time_in_no_program_over_the_window(programs, sms, idle):
    launches = [("_add_kernel", (len(programs), 1, 1), 0, "")]
    frame = timeline.intervals(launches, buffer([(a + 1000, b + 1000, sm) for a, b, sm in programs]))
    assert timeline.idle_share(frame, sms) == pytest.approx(idle)


@pytest.mark.parametrize(
    "programs,most",
    [
        ([(0, 100, 0)], 1),
        ([(0, 100, 0), (0, 100, 1)], 1),  # one each on two SMs
        ([(0, 60, 0), (40, 100, 0), (50, 70, 0)], 3),  # three overlap at 50-60 on SM 0
        ([(0, 50, 0), (50, 100, 0)], 1),  # one ends as the next starts: never two at once
        ([(0, 10, 2), (5, 20, 2), (30, 40, 2), (31, 39, 2), (32, 38, 2)], 3),  # the second busy spell is fuller
    ],
)
def test_the_most_programs_at_once_on_one_sm(programs, most):
    launches = [("_add_kernel", (len(programs), 1, 1), 0, "")]
    frame = timeline.intervals(launches, buffer([(a + 1000, b + 1000, sm) for a, b, sm in programs]))
    assert timeline.most_at_once(frame) == most


def test_programs_and_busy_sms_over_the_step_at_even_instants():
    programs = [(0, 100, 0), (0, 40, 1), (10, 40, 1), (60, 100, 2)]
    launches = [("_add_kernel", (len(programs), 1, 1), 0, "")]
    frame = timeline.intervals(launches, buffer([(a + 1000, b + 1000, sm) for a, b, sm in programs]))
    over = timeline.running(frame, points=11)  # every 10 ns from 0 to 100; an end is outside its interval
    assert list(over.t_us) == pytest.approx([t / 1e3 for t in range(0, 101, 10)])
    assert list(over.programs) == [2, 3, 3, 3, 1, 1, 2, 2, 2, 2, 0]
    assert list(over.sms) == [2, 2, 2, 2, 1, 1, 2, 2, 2, 2, 0]


def test_the_chart_draws_each_kernel_on_its_sms_and_says_the_idle_share():
    frame = timeline.intervals(LAUNCHES, buffer([(1000, 1400, 3), (1100, 1300, 7), (1500, 2000, 3), (1500, 1900, 0)]))
    fig = timeline_figure(frame, sms=8, note="recorded on an H200")
    assert [t.name for t in fig.data] == ["layer_norm", "decode_merge"]
    assert list(fig.data[0].y) == [3, 3, None, 7, 7, None] and list(fig.data[0].x) == [0, 0.4, None, 0.1, 0.3, None]
    busy = 0.4 + 0.2 + 0.5 + 0.4  # SM 3: 0-0.4 and 0.5-1.0; SM 7: 0.1-0.3; SM 0: 0.5-0.9
    idle = 1 - busy / (8 * 1.0)
    assert f"2 launches in 1.0 us, SMs idle {idle:.0%} of it" in fig.layout.title.text


# a megakernel-like launch after LAUNCHES: 2 programs (slots 4-5), then its 5 tasks' stamps (slots 6-10)
STEP = ("_decode_step_kernel", (2, 1, 1), 4, "step")
RUNS = [("embedding", -1, 2), ("c_attn", 0, 3)]
TASKS = [(2, 6, (RUNS, 2))]


def _step_buffer(task_stamps):
    values = buffer([(1000, 1400, 3), (1100, 1300, 7), (1500, 2000, 3), (1500, 1900, 0), (2000, 3000, 5)])
    values = np.concatenate([values, buffer([(2000, 2900, 6)])])
    return np.concatenate([values, np.array(task_stamps, dtype=np.int64).reshape(-1)])


GOOD = [(2000, 2000, 2100), (2000, 2000, 2200), (2100, 2400, 2600), (2200, 2500, 2700), (2600, 2800, 2900)]


def test_the_megakernels_tasks_read_back_on_their_programs_sms_from_the_step_origin():
    values = _step_buffer(GOOD)
    frame = timeline.intervals([*LAUNCHES, STEP], values)
    tasks = timeline.task_intervals(TASKS, values, frame)
    assert list(tasks.operation) == ["embedding"] * 2 + ["c_attn"] * 3 and list(tasks.layer) == [-1, -1, 0, 0, 0]
    assert list(tasks.program) == [0, 1, 0, 1, 0] and list(tasks.sm) == [5, 6, 5, 6, 5]  # task g on program g mod 2
    assert list(tasks.start_ns) == [1000, 1000, 1100, 1200, 1600]
    assert list(tasks.ready_ns) == [1000, 1000, 1400, 1500, 1800]
    assert list(tasks.end_ns) == [1100, 1200, 1600, 1700, 1900] and tasks.stamped.all()
    assert timeline.check(frame, [*LAUNCHES, STEP], window_ns=2000, tasks=tasks) == []


def test_the_checks_name_a_task_unstamped_or_outside_its_program():
    bad = [*GOOD[:3], (0, 0, 0), (2600, 2800, 3100)]  # task 3 never stamped; task 4 ends after its program (3000)
    values = _step_buffer(bad)
    frame = timeline.intervals([*LAUNCHES, STEP], values)
    tasks = timeline.task_intervals(TASKS, values, frame)
    assert timeline.check(frame, [*LAUNCHES, STEP], window_ns=2000, tasks=tasks) == [
        "1 tasks without a start, a ready and an end in that order",
        "2 tasks outside the interval of the program that ran them",
    ]


def test_the_chart_draws_the_megakernels_tasks_waiting_in_grey_and_working_by_operation():
    values = _step_buffer(GOOD)
    frame = timeline.intervals([*LAUNCHES, STEP], values)
    tasks = timeline.task_intervals(TASKS, values, frame)
    fig = timeline_figure(frame, sms=8, tasks=tasks)
    assert [t.name for t in fig.data] == ["layer_norm", "decode_merge", "waiting", "embedding", "c_attn"]
    waiting, c_attn = fig.data[2], fig.data[4]
    assert list(waiting.x[6:9]) == [1.1, 1.4, None] and list(waiting.y[6:9]) == [5, 5, None]
    assert "c_attn (layer 0), task 2 on program 0, SM 5: waiting 0.30 us for every task of" in waiting.text[6]
    assert list(c_attn.x[:3]) == [1.4, 1.6, None]
    waited = (0 + 0 + 300 + 300 + 200) / (1000 + 900)  # the tasks' waits over the step launch's program time
    assert f"; tasks waiting {waited:.0%} of their programs' time" in fig.layout.title.text


def test_stamping_is_refused_where_there_are_no_sms_and_no_launch_is_stamped_outside_it():
    with pytest.raises(ValueError, match="the interpreter has no global timer and no SMs"):
        with launch.stamping(torch.zeros(30, dtype=torch.int64)):
            pass
    x = torch.randn(3, 40)
    with launch.recording() as got:
        layer_norm(x, torch.ones(40), torch.zeros(40))
    ((fn, _, kwargs, _),) = got
    assert "Stamps" in fn.arg_names and kwargs["Stamps"] is None


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("name", [DEFAULT_MODEL, BUNDLED_LLAMA])
@pytest.mark.parametrize("fusion", ["none", "decode", "overlap", "persistent", "megakernel"])
def test_a_stamped_decode_step_stamps_every_program_once(name, fusion, graph, gpu_alone):
    """On the GPU: every program of every grid of the step wrote its start, end and SM; the stamped span fits
    the step's CUDA-event window; a replayed step takes at most 1.5x as long stamped (plus 20 us); and no SM
    holds more programs of a launch at once than an SM of these GPUs can. (An eager step's time with stamps is
    not compared: a stamped launch takes Triton's own launch path, which costs the host more; on the H200 the
    eager steps took 1.1-1.7x longer stamped.)"""
    model, _ = load_model(name, device="cuda", dtype=torch.bfloat16)
    got = timeline.record(model.with_fusion(fusion), context=100, graph=graph)
    assert got["problems"] == []
    assert got["stamped_ms"] > 0 and got["step_ms"] > 0
    if graph:
        assert got["stamped_ms"] <= 1.5 * got["step_ms"] + 0.02, (got["stamped_ms"], got["step_ms"])
    frame, tasks = got["frame"], got["tasks"]
    assert set(frame.sm) <= set(range(got["sms"]))
    if fusion == "megakernel":  # every task of the step stamped itself, inside its program (check() above)
        from explorer.model.cache import KVCache
        from kernels.ops.decode_step import plan, shape_of
        from kernels.ops.decode_step import tasks as task_list

        cache = KVCache.for_model(model, 1, 102)  # as record() makes it: context + 2 positions
        shape = shape_of(model.step_parts(), (cache.k, cache.v))
        assert len(tasks) == sum(n for _, _, n in task_list(1, shape, 102, torch.bfloat16, model.device))
        assert tasks.program.max() < plan(1, shape, 102, torch.bfloat16, model.device).programs
    else:
        assert tasks.empty
    for _, launch_rows in frame.groupby("launch"):
        assert timeline.most_at_once(launch_rows) <= 32  # the most programs an SM of these GPUs holds


def test_the_shipped_recording_draws_each_bundled_model_at_each_rung_and_says_how_it_ran(tmp_path):
    from explorer.app import timelines

    rec = timelines.latest()
    assert rec is not None and rec.meta["gpu"]
    for step in rec.steps:  # every recorded step passed the checks and holds every program it launched
        assert step["problems"] == [] and len(step["programs"]["sm"]) > 0
        assert max(step["programs"]["sm"]) < step["sms"]
    fig, why = timelines.figure(DEFAULT_MODEL, "overlap")
    assert why is None and fig.data
    title = " ".join(re.sub("<[^>]+>", " ", fig.layout.title.text).split())
    step = rec.find(DEFAULT_MODEL, "overlap")
    how = "replayed from a CUDA graph" if step.get("graph") else "launched eagerly"
    assert f"at the overlap rung, bfloat16, batch 1, {step['context']} tokens of cache, {how}" in title
    assert f"the step took {step['step_ms']:.3f} ms" in title
    assert timelines.figure("gpt2", "overlap") == (None, timelines.figure("gpt2", "overlap")[1])
    assert "recorded for bundled, bundled-llama" in timelines.figure("gpt2", "overlap")[1]
    assert timelines.figure(DEFAULT_MODEL, "overlap", folder=tmp_path)[1].startswith("No timeline is recorded")


def test_the_page_shows_the_recorded_step_at_its_model_and_rung_and_refuses_what_was_not_recorded():
    import gradio as gr

    from explorer.app.ui import _timeline

    shown = _timeline(DEFAULT_MODEL, "triton", "decode")
    assert shown["visible"] is True and "at the decode rung" in shown["value"].layout.title.text
    with pytest.raises(gr.Error, match="pick the triton backend"):
        _timeline(DEFAULT_MODEL, "torch", "overlap")
    with pytest.raises(gr.Error, match="A timeline is recorded for bundled, bundled-llama"):
        _timeline("gpt2", "triton", "overlap")


@pytest.mark.parametrize(
    "model,fusion", [(DEFAULT_MODEL, "overlap"), (BUNDLED_LLAMA, "decode"), (DEFAULT_MODEL, "persistent")]
)
def test_the_recorded_timeline_matches_the_grids_and_residency_compiled_here(model, fusion):
    """The GPU's recording against what this CPU computes for the H200 (explorer.measure.occupancy, compiled for
    sm_90): the same launches with the same programs, each step replayed and eager. Eagerly, on each launch's
    busiest SM as many programs at once as the scheduler spreading the grid over the SMs allows, at most the
    compiled kernel's residency; replayed, where a launch starts while SMs still run the one before (programmatic
    dependent launch), the scheduler packs the SMs it finds free, never past the residency."""
    from explorer.app import timelines
    from explorer.measure import occupancy

    recorded = timelines.latest()
    steps = [s for s in recorded.steps if s["model"] == model and s["fusion"] == fusion]
    assert {bool(s.get("graph")) for s in steps} == {True, False}
    first = steps[0]  # both steps ran at the same settings: one placement serves both
    settings = dict(model=model, dtype=first["dtype"], fusion=fusion, batch=1, prompt_tokens=first["context"])
    rows = [r for r in occupancy.run(90, settings)["rows"] if r["phase"] == "decode"]
    for step in steps:
        assert (step["dtype"], step["context"]) == (first["dtype"], first["context"])
        frame = pd.DataFrame(step["programs"])
        assert len(rows) == frame.launch.nunique()
        for i, row in enumerate(rows):
            programs = frame[frame.launch == i]
            assert len(programs) == row["programs"] and programs.kernel.iloc[0] == row["kernel"], (i, row)
            spread = -(-row["programs"] // step["sms"])
            seen = timeline.most_at_once(programs)
            if step.get("graph"):
                assert spread <= seen <= row["resident"], (i, row)
            else:
                assert seen == min(row["resident"], spread), (i, row)
