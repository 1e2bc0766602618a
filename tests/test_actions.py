"""The app's actions called directly: validation messages, tile choices, handlers' outputs."""

import gradio as gr
import pytest
import torch

from explorer.app import actions, ui
from explorer.measure.ladder import RUNGS
from kernels import TileConfig


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(prompt="  "), "prompt is empty"),
        (dict(new_tokens=0), "New tokens must be between 1 and 2048"),
        (dict(batch=17), "Batch size must be between 1 and 16"),
        (dict(backend="cuda"), "Backend must be 'triton' or 'torch'"),
        (dict(temperature=-1.0), "must not be negative"),
    ],
)
def test_settings_are_refused_with_a_reason(change, message):
    with pytest.raises(actions.UserError, match=message):
        actions.check(actions.RunSettings(**change))


def test_dtype_not_on_this_device_is_refused():
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour")
    with pytest.raises(
        actions.UserError, match=r"bfloat16 is not available on this device \(allowed: float32, float16\)"
    ):
        actions.check(actions.RunSettings(dtype="bfloat16"))


def test_tiles_from_controls():
    tiles = actions.tiles_from(
        {
            "attention": {"block_m": "64", "block_n": "default", "autotune": False},
            "linear": {"block_m": "default", "autotune": True},
            "layer_norm": {"block_m": "default", "num_warps": "default", "autotune": False},
        }
    )
    assert tiles.attention == TileConfig(block_m=64)
    assert tiles.linear == "autotune"
    assert tiles.layer_norm is None and tiles.decode_attention is None


def test_prompt_length_repeats_or_cuts_to_exactly_n_tokens():
    _, tok = actions.load_model("bundled")
    ids = actions.prompt_ids(tok, actions.RunSettings(prompt="def f(x):", prompt_tokens=50), 1024)
    assert len(ids) == 50
    with pytest.raises(actions.UserError, match="leaves no room: the model has 1024 positions"):
        actions.prompt_ids(tok, actions.RunSettings(prompt_tokens=1024), 1024)


def test_out_of_memory_becomes_advice():
    err = actions._friendly(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert "ran out of memory" in str(err) and "lower the batch" in str(err)
    assert (
        str(actions._friendly(ValueError("linear: block_k=512 is not allowed"))) == "linear: block_k=512 is not allowed"
    )


def test_generate_handler_streams_and_keeps_the_run_in_state():
    values = ["default"] * len(ui.TILE_NAMES)
    values = [False if name.endswith("autotune") else v for name, v in zip(ui.TILE_NAMES, values, strict=True)]
    settings = ("bundled", "import os", 0, 3, 1, actions.default_dtype(), "triton", "decode", True, True, 0, 0, 0)
    outputs = list(ui.generate(*settings, True, ui.NEW_STATE, *values))
    # On CPU one per token, then the profiling notice, then the run with its kernel times; a GPU may decode
    # several tokens within one 0.1 s text interval.
    assert len(outputs) == 5 if not torch.cuda.is_available() else 3 <= len(outputs) <= 5
    assert "profiling the kernels at" in outputs[-2][1] and "fusion rung | decode:" in outputs[-1][1]
    assert all(len(o) == 10 for o in outputs)
    assert outputs[-1][0].startswith("import os") and "time to first token" in outputs[-1][1]
    if torch.cuda.is_available():  # the box is ticked: decode steps replay a graph, and kernels are counted
        assert "replayed as one CUDA graph" in outputs[-1][1] and "counted by torch.profiler" in outputs[-1][1]
    else:  # on CPU the box is ignored and the summary says the steps launched from Python
        assert "each launched from Python" in outputs[-1][1] and "CUDA graph" not in outputs[-1][1]
        assert "kernels are counted on a GPU" in outputs[-1][1]
    assert "| kernel times | timed at decode positions" in outputs[-1][1]
    state = outputs[-1][-1]
    assert list(state["steps"].step) == [0, 1, 2] and state["previous"] is None


def test_use_best_sends_the_sweep_winner_to_the_tile_controls():
    best = TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=2)
    updates = ui.use_best({"best": ("attention", best)})
    assert len(updates) == len(ui.TILE_NAMES)
    named = dict(zip(ui.TILE_NAMES, updates, strict=True))
    assert named["attention_block_m"]["value"] == "64" and named["attention_num_stages"]["value"] == "2"
    assert named["attention_autotune"]["value"] is False
    assert isinstance(named["linear_block_m"], type(gr.skip()))


def test_export_without_a_run_is_a_clear_error():
    with pytest.raises(gr.Error, match="Nothing to export yet"):
        ui.export("last run: steps", "csv", ui.NEW_STATE)


def test_tiles_that_cannot_run_are_refused_before_any_launch(monkeypatch):
    import kernels

    launched = []
    monkeypatch.setattr(kernels, "layer_norm", lambda *a, **k: launched.append(1))
    # Too large for any GPU's shared memory, the H200's 227 KB included.
    tiles = actions.Tiles(linear_decode=TileConfig(block_n=256, block_k=256, num_stages=8))
    s = actions.RunSettings(new_tokens=2, tiles=tiles)
    with pytest.raises(actions.UserError, match="linear: .* shared memory"):
        list(actions.run_generation(s))
    assert launched == []


def test_summary_names_each_rate_by_its_clock_and_counts_kernels_only_where_counted():
    base = dict(
        timer="cuda events around each step (device clock)",
        ttft_ms=1.0,
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
    graphed = actions.summary_markdown({**base, "cuda_graph": True, "kernels_per_step": 163, "memory_ops_per_step": 1})
    assert "| tokens/s delivered (wall clock, first to last token) | 679.0 tokens/s |" in graphed
    assert "| decode step p50 / p90 (device clock, CUDA events) | 0.607 / 0.700 ms |" in graphed
    assert "163 GPU kernels + 1 memory operations (counted by torch.profiler)" in graphed
    assert "171 named operations, replayed as one CUDA graph" in graphed
    eager = actions.summary_markdown({**base, "cuda_graph": False})
    assert "171 named operations, each launched from Python (counting after the run)" in eager
    cpu = actions.summary_markdown({**base, "timer": "cpu perf_counter (Triton interpreter)", "cuda_graph": False})
    assert "kernels are counted on a GPU" in cpu and "(CPU clock)" in cpu


def test_compare_table_keeps_eager_and_graph_runs_apart():
    import pandas as pd

    rows = []
    for mode, ms in (("eager", 8.0), ("CUDA graph", 0.5)):
        rows.append(
            dict(
                backend="triton",
                cache="on",
                launch_mode=mode,
                prompt_tokens=4,
                phase="prefill",
                latency_ms=3.0,
                modeled_mb=1.0,
            )
        )
        rows += [
            dict(
                backend="triton",
                cache="on",
                launch_mode=mode,
                prompt_tokens=4,
                phase="decode",
                latency_ms=ms + i,
                modeled_mb=2.0,
            )
            for i in range(3)
        ]
    table = actions.compare_table(pd.DataFrame(rows)).set_index("launch_mode")
    assert table.loc["eager", "decode_ms_p50"] == 9.0 and table.loc["CUDA graph", "decode_ms_p50"] == 1.5
    assert table.loc["CUDA graph", "last_step_ms"] == 2.5 and set(table.ttft_ms) == {3.0}


def test_ladder_handler_shows_each_rung_as_it_is_measured():
    outputs = list(ui.ladder("bundled", "float32", 1))
    assert len(outputs) == len(RUNGS)  # one update per rung
    figure, table = outputs[-1]
    assert list(table.rung) == list(RUNGS)
    assert (table["ms per step"] > 0).all() and "× torch" in table
    counted = table["kernels (counted)"]
    assert counted.notna().all() if torch.cuda.is_available() else counted.isna().all()
    assert "fusion ladder" in figure.layout.title.text
    with pytest.raises(gr.Error, match="batch"):
        next(ui.ladder("bundled", "float32", 0))
