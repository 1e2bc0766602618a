"""The sweep tab on a machine without a GPU: the GPU's recorded sweep of the same kernel first (where one is
shipped, assets/recorded/sweeps_<gpu>.json), its fastest tile marked."""

import json

import numpy as np
import pytest
import torch

from explorer.app import jobs

NEVER = jobs.Control(lambda: False, float("inf"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="what a visitor without a GPU sees")
def test_on_cpu_the_sweep_shows_the_gpus_recorded_heatmap_first_with_its_fastest_tile_marked(tmp_path, monkeypatch):
    """A recording of every kernel's sweep on a GPU (scripts/record_sweeps.py), here one made of an interpreter
    sweep with its times scrambled: the sweep tab draws it, named as recorded, its own fastest tile starred."""
    from explorer.app import gpu_sweeps, recordings
    from explorer.measure import sweeps

    shape = {"M": 4, "C": 32}
    rows = [row for _, _, row in sweeps.tile_sweep_rows("layer_norm", shape, dtype=torch.float32, device="cpu")]
    frame = sweeps.sweep_frame("layer_norm", shape, rows)
    frame["ms"] = np.random.default_rng(0).uniform(0.001, 0.01, len(frame))  # another GPU's times
    meta = dict(gpu="Test GPU", date="2026-12-05T00:00:00+00:00", dtype="bfloat16")
    gpu_sweeps.save(tmp_path / "sweeps_test.json", meta, {"layer_norm": frame})
    monkeypatch.setattr(recordings, "FOLDER", tmp_path)
    payload = dict(kernel="layer_norm", shape=shape, dtype="float32", x="block_m", y="num_warps", value="ms")
    last = {}
    for update in jobs.JOBS["sweep"](payload, NEVER):
        last |= update
    figure = json.loads(last["heat_gpu"])
    assert figure["layout"]["title"]["text"].startswith("Test GPU, recorded: Tile sweep")
    assert "recorded 2026-12-05 at M=4,C=32, bfloat16" in figure["layout"]["title"]["text"]
    fastest = frame.loc[frame.ms.idxmin()]
    heat = figure["data"][0]
    i = [str(v) for v in heat["x"]].index(str(fastest.block_m))
    j = [str(v) for v in heat["y"]].index(str(fastest.num_warps))
    assert heat["text"][j][i].startswith("★"), heat["text"]
    assert sum(t.startswith("★") for row in heat["text"] for t in row) == 1
    monkeypatch.setattr(recordings, "FOLDER", tmp_path / "none")  # no recording: no GPU heatmap
    last = {}
    for update in jobs.JOBS["sweep"](payload, NEVER):
        last |= update
    assert last["heat_gpu"] is None
