"""Figures carry the right traces and the data they were given."""

import math
import re
import types

import numpy as np
import pandas as pd
import pytest

from explorer.app import hierarchy, plots, units
from explorer.measure import metrics
from explorer.measure.traffic import op_traffic
from tests.steps import FFN, profile, step


def _steps(n=5, kv=True):
    out = []
    for i in range(n):
        s = step(i, 10.0 if i == 0 else 2.0 + i, kv=(4 + i) * 1024 if kv else 0)
        s.positions, s.context_tokens = [4 + i], 1 if kv and i else 4 + i
        s.kv_allocated_bytes = 64 * 1024 if kv else 0
        out.append(s)
    return out


def _profiled(n=5, launch_ms=math.nan):
    """Every decode step profiled: 1 ms of FFN and 0.5 ms of decode attention."""
    rows = [
        (i, "decode", 4 + i, op, kind, ms, launch)
        for i in range(1, n)
        for op, kind, ms, launch in (
            ("mlp.c_fc", "ffn", 1.0, 2 * launch_ms),
            ("attn", "decode attention", 0.5, launch_ms),
        )
    ]
    return profile(rows)


def test_latency_figure_marks_prefill_apart():
    fig = plots.latency_figure(metrics.step_frame(_steps()))
    names = [t.name for t in fig.data]
    assert names == ["prefill", "decode"]
    assert list(fig.data[0].y) == [10.0] and list(fig.data[1].y) == [3.0, 4.0, 5.0, 6.0]
    assert fig.layout.uirevision == "keep"


def test_overlaid_runs_get_their_own_traces():
    a = metrics.step_frame(_steps()).assign(run="A")
    b = metrics.step_frame(_steps(3)).assign(run="B")
    fig = plots.latency_figure(pd.concat([a, b]))
    assert [t.name for t in fig.data] == ["A prefill", "A decode", "B prefill", "B decode"]


def test_traffic_figure_stacks_hbm_bytes_per_kind_under_the_l2_line():
    kernels = metrics.kernel_frame(_steps())
    fig = plots.traffic_figure(kernels)
    by_name = {t.name: t for t in fig.data}
    assert set(by_name) == {"ffn", "attention", "decode attention", "SM requests (tiles)"}
    assert fig.layout.barmode == "stack"
    assert list(by_name["ffn"].x) == [0, 1, 2, 3, 4]
    assert by_name["ffn"].y[0] == op_traffic(FFN).hbm_bytes / metrics.MB
    line = by_name["SM requests (tiles)"]
    assert list(line.y) == pytest.approx(list(kernels.groupby("step").modeled_mb.sum()))
    assert all(l2 >= hbm for l2, hbm in zip(line.y, kernels.groupby("step").hbm_mb.sum(), strict=True))


def test_traffic_legend_is_laid_out_under_the_plot_and_the_figure_grows_to_hold_it():
    heights = []
    for kinds in (["ffn"], list(plots.KIND_COLORS)):
        kernels = pd.DataFrame([dict(step=s, kind=k, hbm_mb=1.0, modeled_mb=2.0) for s in range(4) for k in kinds])
        fig = plots.traffic_figure(kernels)
        entries = len(kinds) + 1  # and the L2 line
        m = fig.layout.margin
        assert fig.layout.height - m.t - m.b >= 250  # the plot's own height, whatever the legend
        assert m.b >= 60 + 22 * math.ceil(entries / 2)  # two entries a row in a 380 px column
        heights.append(fig.layout.height)
    assert heights[1] > heights[0]


def test_kv_figure_shows_cache_or_recompute():
    with_cache = plots.kv_figure(metrics.step_frame(_steps()))
    assert [t.name for t in with_cache.data] == ["used", "allocated"]
    assert list(with_cache.data[0].y) == [(4 + i) / 1024 for i in range(5)]
    without = plots.kv_figure(metrics.step_frame(_steps(kv=False)))
    assert [t.name for t in without.data] == ["cache off: tokens recomputed"]
    assert list(without.data[0].y) == [4, 5, 6, 7, 8]


def test_kernel_share_uses_measured_time_when_profiled():
    fig = plots.kernel_share_figure(metrics.kernel_frame(_steps(), _profiled()))
    pie = fig.data[0]
    assert dict(zip(pie.labels, pie.values, strict=True)) == {"ffn": 4.0, "decode attention": 2.0}
    assert "device time" in fig.layout.title.text


def test_a_long_note_is_wrapped_under_the_title_and_the_margin_grows_to_hold_it():
    note = "CPU timings (Triton interpreter); timed at decode positions 9, 11, 12; other steps use the nearest"
    fig = plots.kernel_share_figure(metrics.kernel_frame(_steps(), _profiled()), note, "CPU time")
    title, *lines = fig.layout.title.text.split("<br>")
    assert title == "Where a decode step goes (CPU time)"
    lines = [line.removeprefix("<sup>").removesuffix("</sup>") for line in lines]
    assert " ".join(lines) == note and len(lines) == 2
    assert all(len(line) <= 64 for line in lines)  # what a chart beside another fits (tests/test_figure_layout.py)
    assert fig.layout.margin.t >= 36 + 22 * len(lines)
    short = plots.kernel_share_figure(metrics.kernel_frame(_steps(), _profiled()), "", "CPU time")
    assert short.layout.margin.t < fig.layout.margin.t


def test_sweep_heatmap_marks_invalid_cells():
    sweep = pd.DataFrame(
        [
            dict(block_m=16, block_n=16, valid=True, reason="", ms=2.0),
            dict(block_m=16, block_n=16, valid=True, reason="", ms=1.5),
            dict(
                block_m=32,
                block_n=16,
                valid=False,
                reason="attention: ... needs about 1 bytes of shared memory",
                ms=None,
            ),
        ]
    )
    fig = plots.sweep_heatmap(sweep, "block_m", "block_n")
    heat = fig.data[0]
    assert list(heat.x) == ["16", "32"] and list(heat.y) == ["16"]
    assert heat.z[0][0] == 1.5 and heat.z[0][1] is None
    assert heat.text[0][1] == "✗ shared memory"


def test_sweep_heatmap_marks_the_fastest_cell_and_only_it():
    rng = np.random.default_rng(3)
    rows = [
        dict(block_m=m, block_n=n, valid=True, reason="", ms=float(rng.uniform(1, 9)))
        for m in (16, 32, 64)
        for n in (16, 48)
    ]
    rows.append(dict(block_m=128, block_n=48, valid=False, reason="needs too much shared memory", ms=None))
    sweep = pd.DataFrame(rows)
    fig = plots.sweep_heatmap(sweep, "block_m", "block_n")
    heat = fig.data[0]
    fastest = sweep[sweep.valid].ms.idxmin()
    i = ["16", "32", "64", "128"].index(str(sweep.block_m[fastest]))
    j = ["16", "48"].index(str(sweep.block_n[fastest]))
    starred = [(r, c) for r, row in enumerate(heat.text) for c, t in enumerate(row) if t.startswith("★")]
    assert starred == [(j, i)], (starred, heat.text)
    (box,) = fig.layout.shapes
    assert (box.x0 + box.x1) / 2 == i and (box.y0 + box.y1) / 2 == j
    rates = plots.sweep_heatmap(sweep.assign(gbs=1e3 / sweep.ms), "block_m", "block_n", "gbs")  # higher is better
    top = fastest
    k = ["16", "32", "64", "128"].index(str(sweep.block_m[top]))
    assert rates.data[0].text[["16", "48"].index(str(sweep.block_n[top]))][k].startswith("★")


def test_bandwidth_figure_draws_the_peak():
    fig = plots.bandwidth_figure(metrics.step_frame(_steps()), peak_gbs=4300.0)
    assert any("4300" in (a.text or "") for a in fig.layout.annotations)


def test_fusion_and_hierarchy_use_the_models_numbers():
    from explorer.model import GPTConfig

    cfg = GPTConfig(vocab_size=100, n_positions=64, n_embd=64, n_layer=2, n_head=4)
    lessons = metrics.fusion_lessons(cfg, 32, 2)
    fig = plots.fusion_figure(lessons)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    fused, unfused = list(bars["fused (ours)"].y), list(bars["unfused"].y)
    assert all(f < u for f, u in zip(fused, unfused, strict=True))
    html = hierarchy.hierarchy_html(metrics.kernel_frame(_steps()), None, lessons)
    assert "decode attention" in html and "fewer bytes" in html and "CPU" in html


def test_roofline_puts_each_kind_under_the_measured_ceiling():
    steps = _steps()
    peaks = metrics.Peaks(bandwidth_gbs=4000.0, tflops=800.0, label="test")
    fig = plots.roofline_figure(metrics.roofline(metrics.kernel_frame(steps, _profiled()), peaks), peaks)
    names = [t.name for t in fig.data]
    assert names[0] == "ceiling, bf16 on tensor cores" and {"ffn (decode)", "decode attention (decode)"} <= set(names)
    ceiling = fig.data[0]
    assert max(ceiling.y) == 800.0 and fig.layout.xaxis.type == "log"


def _interpreter_points():
    """metrics.roofline's rows as the interpreter makes them: FLOPs over hundreds of ms, 1e-7 to 3e-5 TFLOP/s."""
    rows = [
        ("decode", "ffn", 0.50, 7.2e-6),
        ("decode", "decode attention", 0.43, 1.1e-7),
        ("decode", "embedding", 0.083, 2.3e-6),
        ("prefill", "ffn", 3.6, 3.4e-5),
        ("prefill", "attention", 1.1, 3.1e-7),
        ("prefill", "kv write", 0.0, 0.0),  # no arithmetic: no place on log axes
    ]
    return pd.DataFrame(rows, columns=["phase", "kind", "intensity", "achieved_tflops"])


def test_roofline_on_cpu_says_there_is_no_roof_and_reads_in_plain_numbers():
    fig = plots.roofline_figure(_interpreter_points(), None, "CPU interpreter timings")
    assert "CPU" in fig.layout.title.text and "no roofline" in fig.layout.title.text
    assert not any(t.name.startswith("ceiling") for t in fig.data)
    # A rate of 1e-7 TFLOP/s is 0.1 MFLOP/s: ticks 0.1, 1, 10, never 100n or 10µ.
    assert fig.layout.yaxis.title.text == "MFLOP/s"
    ys = [y for t in fig.data for y in t.y]
    assert max(ys) == pytest.approx(34.0) and min(ys) == pytest.approx(0.11)
    assert fig.layout.xaxis.exponentformat == fig.layout.yaxis.exponentformat == "none"
    # The x axis spans the points, a little either side, not decades of nothing.
    lo, hi = fig.layout.xaxis.range
    assert lo <= math.log10(0.083) and hi >= math.log10(3.6) and hi - lo <= math.log10(3.6 / 0.083) + 1


def test_roofline_on_a_gpu_keeps_tflops_and_the_ridge_in_view():
    points = _interpreter_points().assign(achieved_tflops=lambda f: f.achieved_tflops * 1e7)  # 1 to 340 TFLOP/s
    fig = plots.roofline_figure(points, metrics.Peaks(bandwidth_gbs=4000.0, tflops=800.0, label="test"))
    assert fig.layout.title.text.startswith("Roofline") and fig.layout.yaxis.title.text == "TFLOP/s"
    lo, hi = fig.layout.xaxis.range
    assert hi > math.log10(800.0 * 1e3 / 4000.0)  # the ridge, at 200 FLOP/byte, where the roof turns flat


def test_hierarchy_sets_measured_device_and_launch_time_next_to_the_bandwidth_floor():
    html = hierarchy.hierarchy_html(metrics.kernel_frame(_steps(), _profiled(launch_ms=0.125)), 4000.0)
    assert "device time measured" in html and "host time launching it" in html and "CUDA graph" in html
    ffn_row = next(row for row in html.split("<tr>") if row.startswith("<td>ffn</td>"))
    assert "<td>1.00 ms</td>" in ffn_row and "<td>250 µs</td>" in ffn_row
    plain = hierarchy.hierarchy_html(metrics.kernel_frame(_steps(), _profiled()), 4000.0)  # no launch times: no column
    assert "host time launching it" not in plain


@pytest.mark.parametrize(
    "ms, shown",
    [
        (877.5749, "878 ms"),  # the interpreter's hundreds of ms, not 877574.9 µs
        (12_345.6, "12.3 s"),
        (999.7, "1.00 s"),  # rounded to three digits it is a second
        (1.0, "1.00 ms"),
        (0.25, "250 µs"),
        (0.0123, "12.3 µs"),
        (math.nan, ""),
    ],
)
def test_a_duration_takes_the_unit_its_size_calls_for(ms, shown):
    assert units.duration(ms) == shown


def test_hierarchy_writes_interpreter_times_in_ms_and_s():
    kernels = metrics.kernel_frame(_steps(), _profiled()).assign(kernel_ms=877.5749)
    html = hierarchy.hierarchy_html(kernels, None)
    assert "interpreter time" in html and "<td>878 ms</td>" in html and "µs" not in html
    gpu = hierarchy.hierarchy_html(kernels.assign(kernel_ms=0.0123), 4000.0)
    assert "<td>12.3 µs</td>" in gpu


def test_interpreter_sized_times_read_in_seconds_on_the_other_charts():
    steps = metrics.step_frame(_steps())
    slow = plots.latency_figure(steps.assign(latency_ms=steps.latency_ms * 1000))  # 3 to 10 s a token
    assert slow.layout.yaxis.title.text == "s" and list(slow.data[0].y) == [10.0]
    assert plots.latency_figure(steps).layout.yaxis.title.text == "ms"
    sweep = pd.DataFrame([dict(block_m=16, block_n=16, valid=True, reason="", ms=1196.0)])
    heat = plots.sweep_heatmap(sweep, "block_m", "block_n")
    assert heat.data[0].text[0][0] == "★ 1.20" and heat.data[0].colorbar.title.text == "s"  # not 1.2e+03 ms
    rows = [
        dict(backend="triton", cache="on", prompt_tokens=4, phase="decode", position=p, latency_ms=2500.0)
        for p in (4, 5)
    ]
    compare = plots.compare_figure(pd.DataFrame(rows))
    assert compare.layout.yaxis.title.text == "s per token (log)" and compare.layout.yaxis.exponentformat == "none"


def test_compare_draws_one_line_per_run_with_how_it_launched():
    rows = []
    for mode, ms in (("eager", 8.0), ("CUDA graph", 0.5)):
        for pos in (4, 5, 6):
            rows.append(
                dict(
                    backend="triton",
                    cache="on",
                    launch_mode=mode,
                    prompt_tokens=4,
                    phase="decode",
                    position=pos,
                    latency_ms=ms,
                )
            )
    fig = plots.compare_figure(pd.DataFrame(rows))
    assert [t.name for t in fig.data] == [
        "triton · cache on · eager · prompt 4",
        "triton · cache on · CUDA graph · prompt 4",
    ]
    assert list(fig.data[1].y) == [0.5, 0.5, 0.5]
    assert fig.layout.yaxis.type == "log"  # a 16x gap: on a linear axis the graph line would lie flat at 0


def test_a_run_of_one_step_shows_its_point_on_every_line_chart():
    """Compare with 2 new tokens has one decode step a run, Generate with 1 one step: a line alone through a
    single point draws nothing, so such a chart would be empty."""
    rows = [
        dict(backend=b, cache=c, prompt_tokens=8, phase=phase, position=pos, latency_ms=ms)
        for b in ("triton", "torch")
        for c in ("on", "off")
        for phase, pos, ms in (("prefill", 8, 30.0), ("decode", 9, 3.0))
    ]
    fig = plots.compare_figure(pd.DataFrame(rows))
    assert len(fig.data) == 4 and all(len(t.x) == 1 and "markers" in t.mode for t in fig.data)
    one = metrics.step_frame(_steps(1))
    assert all("markers" in t.mode for t in plots.kv_figure(one).data)
    line = [t for t in plots.traffic_figure(metrics.kernel_frame(_steps(1))).data if t.type == "scatter"]
    assert len(line) == 1 and "markers" in line[0].mode
    share = plots.kernel_share_figure(metrics.kernel_frame(_steps(1)))  # no decode step: the prefill, named so
    assert share.layout.title.text.startswith("Where the prefill goes (modeled HBM bytes)")
    long = metrics.step_frame(_steps(plots.FEW_POINTS + 1))  # a long run: lines alone, its points too dense
    assert [t.mode for t in plots.kv_figure(long).data] == ["lines", "lines"]


def test_recorded_counters_sit_beside_the_models_on_the_hierarchy_tab():
    from explorer.measure.counters import recorded

    meta, rows = recorded()
    assert meta["gpu"] and meta["date"] and meta["torch"] and meta["triton"]
    # Every kernel family was measured, each at both levels.
    assert {"layer_norm", "linear", "attention", "decode attention", "kv_write"} <= {
        c.split("+")[0].split(" M=")[0].split(" causal")[0].split(" B")[0] for c in rows.case
    }
    for column in ("counter_l2_read_mb", "counter_hbm_read_mb", "counter_hbm_write_mb"):
        assert rows[column].gt(0).all()
    html = hierarchy.counters_html(meta, rows)
    assert meta["gpu"] in html and html.count("<tr>") == len(rows) + 1
    first = rows.iloc[0]
    assert "<td>12.6 / 12.6 (0%)</td>" in html  # the first row's HBM read, three digits
    assert f"{first.model_hbm_read_mb:.3g} / {first.counter_hbm_read_mb:.3g}" in html
    assert hierarchy.counters_html({}, pd.DataFrame()) == ""


def _counter_table(html: str) -> tuple[dict[str, list[str]], str]:
    """{case: its cells} of counters_html's table, and the text under it."""
    table, text = html.split("</table>")
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in table.split("<tr>")[2:]]
    return {cells[0]: cells for cells in rows}, re.sub(r"<[^>]+>", "", text)


def test_each_counter_verdict_agrees_with_the_numbers_in_its_row():
    from explorer.measure.counters import recorded

    meta, rows = recorded()
    cells, _ = _counter_table(hierarchy.counters_html(meta, rows))
    for r in rows.itertuples():
        tma = r.requests_counter == "none (TMA)"  # no counter sees TMA copies: HBM alone judges the row
        judged = [cells[r.case][i] for i in ((3, 4) if tma else (1, 3, 4))]  # SMs' requests, HBM read, write
        shown = [int(p) for p in re.findall(r"\(([+-]?\d+)%\)", " ".join(judged))]
        verdict = cells[r.case][-1]
        assert len(shown) == len(judged), cells[r.case]
        assert verdict.startswith("within 15%") == all(abs(p) <= 15 for p in shown), (r.case, shown, verdict)
        assert not verdict.startswith("over 15%"), (r.case, verdict)  # every level agrees, at L1 where recorded
        # The requests at L1 where the row has an L1 count, and then the L2 figure is the counter's alone.
        if tma:
            assert "no counter" in cells[r.case][1] and "without the TMA copies" in cells[r.case][2]
            continue
        assert cells[r.case][1].split(" (")[0].endswith("at " + r.requests_counter), cells[r.case]
        l2 = cells[r.case][2]
        assert l2.startswith(units.digits3(r.counter_l2_read_mb)) and ("fewer than requested" in l2) == (
            r.counter_l2_read_mb < 0.85 * r.model_l2_read_mb
        )
    # The cache write of one sequence: a few KB apart at HBM, a large percentage, under the 64 KiB of noise.
    kv_row = rows.set_index("case").loc["kv_write B1 H12 D64 cache 1024"]
    kv = cells["kv_write B1 H12 D64 cache 1024"]
    assert f"({kv_row.hbm_read_diff_pct:.0f}%)" in kv[3] and kv_row.hbm_read_diff_pct < -15
    assert not kv[-1].startswith("within 15%") and "HBM read" in kv[-1] and "65.5 KB" in kv[-1]
    apart_kb = (kv_row.counter_hbm_read_mb - kv_row.model_hbm_read_mb) * 1e3
    assert f"{units.digits3(apart_kb)} KB" in kv[-1]
    # The tiled linear: the SMs request exactly what the model counts; the L2 sees fewer (merged misses).
    linear = cells["linear M=1024 768->3072 +GELU"]
    row = rows.set_index("case").loc["linear M=1024 768->3072 +GELU"]
    fewer = 100 * (1 - row.counter_l2_read_mb / row.model_l2_read_mb)
    assert linear[1] == "113 / 113 at L1 (0%)" and fewer > 15
    assert linear[2] == f"{units.digits3(row.counter_l2_read_mb)} ({fewer:.0f}% fewer than requested)"
    assert linear[-1] == "within 15%"


def test_the_text_under_the_counters_says_what_its_rows_show():
    from explorer.measure.counters import recorded

    meta, rows = recorded()
    _, text = _counter_table(hierarchy.counters_html(meta, rows))
    assert "within 1% for every kernel" not in text  # the cache write's row is tens of percent apart
    assert f"All {len(rows)} cases agree at every level" in text
    # The largest HBM read difference, and what it is in bytes.
    worst = rows.loc[rows.hbm_read_diff_pct.abs().idxmax()]
    apart_kb = abs(worst.counter_hbm_read_mb - worst.model_hbm_read_mb) * 1e3
    assert f"{worst.hbm_read_diff_pct:.0f}% ({worst.case}), is {units.digits3(apart_kb)} KB" in text
    # Beyond the noise, HBM reads agree within the largest difference of those rows.
    big = rows[rows.counter_hbm_read_mb * 1e6 >= 64 * 1024]
    assert f"within {big.hbm_read_diff_pct.abs().max():.1f}%" in text
    # Where the L2 sees fewer than the SMs request, by as much as those rows show.
    merged = rows[rows.counter_l2_read_mb < 0.85 * rows.counter_l1_read_mb]
    fewer = 100 * (1 - merged.counter_l2_read_mb / merged.counter_l1_read_mb)
    assert f"{fewer.min():.0f}-{fewer.max():.0f}% fewer" in text
    assert "an L2 figure is shown only where the L2 counted it" in text
    # The largest HBM write difference, a write-back counted in a later case, and the 1 MiB allowed for it.
    gap = (rows.counter_hbm_write_mb - rows.model_hbm_write_mb).abs()
    write = rows.loc[gap.idxmax()]
    assert f"{units.digits3(gap.max() * 1e3)} KB ({write.case}), within the 1.05 MB allowed" in text
    # Other rows, other sentences: every number comes from the rows.
    tight = rows.assign(counter_hbm_read_mb=rows.model_hbm_read_mb, counter_l2_read_mb=rows.model_l2_read_mb)
    tight = tight.assign(hbm_read_diff_pct=0.0, l2_read_diff_pct=0.0, verdict="PASS")
    _, tight_text = _counter_table(hierarchy.counters_html(meta, tight))
    assert f"All {len(rows)} cases agree" in tight_text and "within 0.0%" in tight_text


@pytest.mark.parametrize("dtype, roof", [("bfloat16", "bf16 on tensor cores"), ("float32", "fp32 on CUDA cores")])
def test_one_ridge_for_the_roofline_and_the_lessons_from_one_function(dtype, roof, monkeypatch):
    """The roofline's title and the prefill and memory lessons' texts name the dtype their peak is of and the ridge,
    each from roofs.ridge: with that function's answer replaced, every one of them shows the replacement."""
    from explorer.app.lessons import memory, prefill_decode
    from explorer.measure import roofs

    peaks = metrics.Peaks(bandwidth_gbs=4247.0, tflops=791.0, label="test", dtype=dtype)
    assert roofs.ridge(peaks.tflops, peaks.bandwidth_gbs) == pytest.approx(791.0e12 / 4247.0e9)  # FLOP/s over B/s
    points = _interpreter_points().assign(achieved_tflops=lambda f: f.achieved_tflops * 1e7)
    prefill = dict(prompt=256, prefill_ms=2.0, prefill_per_token_ms=0.01, decode_ms=1.0, prefill_gflop=80.0)
    prefill |= dict(prefill_mb=300.0, decode_gflop=0.3, decode_mb=300.0, decode_position=300, prefill_kernel_ms=1.5)
    prefill |= dict(decode_kernel_ms=0.1, prefill_tflops=53.0, decode_tflops=3.0, prefill_intensity=254.0)
    prefill |= dict(decode_intensity=0.95, peak_tflops=peaks.tflops, peak_gbs=peaks.bandwidth_gbs, peak_dtype=dtype)
    decode = dict(weights_mb=250.0, hbm_mb=260.0, l2_mb=270.0, position=300, last_floor_mb=255.0, top_kind="ffn")
    decode |= dict(top_share=0.6, step_ms=0.1, achieved_gbs=2600.0, last_gflop=0.3, last_hbm_mb=260.0, intensity=1.1)
    decode |= dict(peak_tflops=peaks.tflops, peak_gbs=peaks.bandwidth_gbs, peak_dtype=dtype)
    run = lambda facts: types.SimpleNamespace(facts=facts, settings={"model": "bundled"}, device="NVIDIA H200")  # noqa: E731

    def shown(ridge: str) -> None:
        assert f"Roofline, {roof}" in (title := plots.roofline_figure(points, peaks).layout.title.text), title
        assert f"ridge {ridge} FLOP/byte" in title
        for lesson, facts in ((prefill_decode, prefill), (memory, decode)):
            text = lesson.explain(run(facts))
            assert f"{ridge} FLOP per byte" in text and roof in text, text

    shown("186")
    monkeypatch.setattr(roofs, "ridge", lambda tflops, gbs: 123.0)
    shown("123")


def test_sweep_heatmap_hover_names_each_cells_fastest_config_and_where_it_sat_on_the_sms():
    """A GPU's recorded sweep carries each config's registers, programs per SM, limiter and waves: the hover shows
    them for the config the cell's colour is."""
    rows = [
        dict(
            block_m=16,
            num_warps=4,
            valid=True,
            reason="",
            ms=2.0,
            registers=64,
            per_sm=8,
            limiter="registers",
            waves=0.4,
        ),
        dict(
            block_m=16, num_warps=8, valid=True, reason="", ms=1.0, registers=40, per_sm=6, limiter="warps", waves=0.5
        ),
        dict(block_m=32, num_warps=4, valid=False, reason="needs 300 KB of shared memory", ms=None),
    ]
    sweep = pd.DataFrame(rows)
    heat = plots.sweep_heatmap(sweep, "block_m", "num_warps").data[0]
    cells = zip(heat.y, heat.customdata, strict=True)
    hover = {(y, x): h for y, row in cells for x, h in zip(heat.x, row, strict=True)}
    assert (
        hover[("8", "16")]
        == "block_m=16, num_warps=8<br>40 registers a thread, 6 programs per SM (limited by warps), 0.50 waves"
    )
    assert hover[("4", "16")].startswith("block_m=16, num_warps=4<br>64 registers a thread, 8 programs per SM")
    assert hover[("4", "32")] == "needs 300 KB of shared memory"
    interpreter = plots.sweep_heatmap(
        sweep.drop(columns=["registers", "per_sm", "limiter", "waves"]), "block_m", "num_warps"
    )
    assert interpreter.data[0].customdata[0][0] == "block_m=16, num_warps=4"
