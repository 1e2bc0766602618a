"""The fusion ladder: each rung's decode step, its launches, bytes and time, side by side."""

import pytest
import torch

from explorer.measure.ladder import RUNGS, ladder_rows
from tests.test_graphs import random_model


def test_each_rung_up_the_ladder_launches_fewer_kernels_and_moves_no_more_bytes(device):
    model = random_model(device, n_layer=2, n_embd=64, n_head=4, vocab=97, n_positions=64)
    rows = {row["rung"]: row for row in ladder_rows(model, context=17, replays=3)}
    assert list(rows) == list(RUNGS)
    none, epilogue, decode = rows["none"], rows["epilogue"], rows["decode"]
    # Separate bias, GELU and residual launches read and write the activations again; fusing the
    # LayerNorms and the cache write saves their round trips.
    assert none["launches_modeled"] > epilogue["launches_modeled"] > decode["launches_modeled"]
    assert none["hbm_mb"] > epilogue["hbm_mb"] > decode["hbm_mb"]
    assert none["operations"] > epilogue["operations"] > decode["operations"]
    assert decode["operations"] == 1 + 5 * 2 + 1  # embedding, five launches per layer, ln_f + lm_head
    # The persistent rung: each block in one launch, the same bytes up to its tiles and stage counters.
    persistent = rows["persistent"]
    assert persistent["operations"] == persistent["launches_modeled"] - 2 == 1 + 2 + 1  # the embedding makes 3
    assert persistent["hbm_mb"] == pytest.approx(decode["hbm_mb"], rel=0.02)
    assert rows["torch"]["launches_modeled"] is None  # PyTorch's kernels per operation are its own choice
    for row in rows.values():
        assert row["step_ms"] > 0 and row["context"] == 17
    if device.type == "cuda":  # counted by torch.profiler over one replay
        assert none["kernels"] > epilogue["kernels"] > decode["kernels"] > persistent["kernels"]
    else:
        assert all(row["kernels"] is None for row in rows.values())
        assert "interpreter" in rows["decode"]["timer"]


def test_the_ladder_refuses_a_context_the_model_cannot_hold(device):
    model = random_model(device, n_positions=32)
    with pytest.raises(ValueError, match="context=32 must be between 1 and 31"):
        next(ladder_rows(model, context=32))
    with pytest.raises(ValueError, match="rung 'fused' is not known"):
        next(ladder_rows(model, context=4, rungs=("fused",)))


def test_cli_ladder_prints_every_rung(capsys):
    from explorer.cli import main

    main(
        ["ladder", "--model", "bundled", "--context", "8", "--dtype", "float32"]
        + (["--device", "cpu"] if not torch.cuda.is_available() else [])
    )
    out = capsys.readouterr().out
    for rung in RUNGS:
        assert f"  {rung}: " in out
