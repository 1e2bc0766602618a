"""The app launched in-process and driven through gradio_client, as an API user would."""

import base64
import json

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest
import torch

from explorer.app import lessons, models
from kernels import timing
from tests.serve import running_app

gradio_client = pytest.importorskip("gradio_client")


@pytest.fixture(scope="module")
def client():
    with running_app() as url:
        yield gradio_client.Client(url, verbose=False)


def _values(array):
    """Plotly sends numeric arrays as typed base64 buffers ({'dtype', 'bdata'}) or plain lists."""
    if isinstance(array, dict) and "bdata" in array:
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=np.dtype(array["dtype"]))
    return np.asarray(array)


def _points(plot) -> int:
    """Number of latency points this run drew in a streamed plot output (-1 for an update that skipped the
    chart). Without a GPU the chart has two panels, the GPU's answer and this CPU's run: the second is the run's."""
    if not isinstance(plot, dict) or "plot" not in plot:
        return -1
    traces = json.loads(plot["plot"])["data"]
    if any(t.get("xaxis") == "x2" for t in traces):
        traces = [t for t in traces if t.get("xaxis") == "x2"]
    return sum(len(_values(t["x"])) for t in traces)


def test_generation_streams_text_and_growing_charts(client):
    job = client.submit(prompt="def add(a, b):", new_tokens=5, api_name="/generate")
    final = job.result()
    outputs = job.outputs()
    assert len(outputs) >= 3, "the text should arrive token by token"
    texts = [o[0] for o in outputs if isinstance(o[0], str)]  # a status before the first token leaves it as it is
    assert texts and all(t.startswith("def add(a, b):") for t in texts)
    assert len(texts[-1]) > len("def add(a, b):")
    points = [_points(o[2]) for o in outputs if _points(o[2]) >= 0]
    assert points == sorted(points) and points[-1] == 5, "the latency chart gains a point per token"
    if not torch.cuda.is_available():  # a token a second: charts while it runs. A GPU's 5 tokens take
        assert points[0] < points[-1]  # milliseconds, less than the wait before its first charts (the text goes first)
    assert "tokens/s" in final[1] and "time to first token" in final[1]
    # the memory-hierarchy table after the run, both levels
    assert "MB SM requests (tiles)" in final[7] and "MB HBM (modeled)" in final[7]
    assert pio.from_json(final[8]["plot"]).layout.xaxis.type == "log"  # and the roofline


def test_bad_inputs_are_clear_errors_and_the_app_keeps_serving(client):
    with pytest.raises(gradio_client.exceptions.AppError, match="prompt is empty"):
        client.predict(prompt="   ", new_tokens=2, api_name="/generate")
    with pytest.raises(gradio_client.exceptions.AppError, match="shared memory"):
        # 128x256 matmul tiles, 128 deep, in 4 stages need ~384 KB: more than any GPU's shared memory (the
        # H200's 227 KB included). A 32-token prompt takes the tiled (prefill) path these tiles are for.
        client.predict(
            prompt="x = 1",
            prompt_tokens=32,
            new_tokens=2,
            linear_block_m="128",
            linear_block_n="256",
            linear_block_k="128",
            linear_num_stages="4",
            api_name="/generate",
        )
    text = client.predict(prompt="x = 1", new_tokens=2, api_name="/generate")[0]
    assert text.startswith("x = 1") and len(text) > len("x = 1")


def test_export_of_the_last_run(client):
    client.predict(prompt="import os", new_tokens=3, api_name="/generate")
    path = client.predict("last run: steps", "csv", api_name="/export")
    frame = pd.read_csv(path)
    assert frame.step.tolist() == [0, 1, 2] and set(frame.phase) == {"prefill", "decode"}
    with pytest.raises(gradio_client.exceptions.AppError, match="Nothing to export"):
        client.predict("compare", "json", api_name="/export")


def test_tile_sweep_endpoint(client):
    heat, table, best, *_ = client.predict(
        "layer_norm", "M=8,C=64", models.default_dtype(), "block_m", "num_warps", "ms", api_name="/sweep"
    )
    rows = pd.DataFrame(table["data"], columns=table["headers"])
    assert len(rows) == 20 and "Fastest valid" in best
    figure = pio.from_json(heat["plot"])
    assert figure.data[0].type == "heatmap"
    # The chart and every row say how they were timed: rotated graph replays on a GPU, one call on CPU.
    # On a GPU a shape this small cannot be rotated past L2 in 64 copies, and says so.
    regimes = {timing.COLD_REGIME, timing.WARM_REGIME} if torch.cuda.is_available() else {timing.CPU_REGIME}
    assert any(r in figure.layout.title.text for r in regimes) and any(r in best for r in regimes)
    # The table a person reads: marks, not booleans; microseconds, rounded; the best config as fields.
    assert set(rows.runs) <= {"✓", "✗"} and "ms" in rows.columns and "TileConfig(" not in best


def test_named_endpoints(client):
    api = client.view_api(print_info=False, return_format="dict")
    endpoints = {"/generate", "/sweep", "/compare", "/ladder", "/export", "/lesson", "/occupancy"}
    assert endpoints <= set(api["named_endpoints"])
    names = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert names[:3] == ["model", "prompt", "prompt_tokens"] and "attention_block_m" in names
    (choice,) = api["named_endpoints"]["/lesson"]["parameters"]
    assert choice["parameter_name"] == "lesson" and "kv-cache" in choice["type"]["enum"]


def test_a_lesson_through_the_api_quotes_its_own_chart(client):
    text, plot, recorded, _ = client.predict(lesson="tiling", api_name="/lesson")
    assert text.startswith("#### Tiling and shared memory, measured just now on ")
    figure = pio.from_json(plot["plot"])
    times = next(t for t in figure.data if t.name == "time")
    per_us = {"µs": 1.0, "ms": 1e3, "s": 1e6}[figure.layout.yaxis2.title.text]  # the axis takes the times' unit
    fastest = min(_values(times.y)) * per_us
    assert f"at {lessons.base.duration(fastest)}**" in text  # the time in the text is the chart's lowest bar
    assert (
        recorded == "" if torch.cuda.is_available() else ("recorded on" in recorded or "No GPU recording" in recorded)
    )
    with pytest.raises(gradio_client.exceptions.AppError, match=r"lesson must be one of 'memory', .* got 'nope'"):
        client.predict(lesson="nope", api_name="/lesson")
