"""Sweeps and the CLI, end to end on CPU (small shapes, the bundled model)."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from explorer import cli
from explorer.measure import sweeps
from kernels import TileConfig


def test_tile_sweep_keeps_impossible_configs_with_the_reason(device):
    seen = []
    grid = {"block_m": [1, 4], "block_n": [64, 512], "num_warps": [2]}
    sweep = sweeps.tile_sweep(
        "layer_norm", {"M": 9, "C": 100}, device=device, grid=grid, progress=lambda i, n, d: seen.append((i, n))
    )
    assert len(sweep) == 4
    too_narrow = sweep[sweep.block_n == 64]
    assert not too_narrow.valid.any()
    assert too_narrow.reason.str.contains("smaller than the row width 100").all()
    fine = sweep[sweep.valid]
    assert len(fine) == 2 and (fine.ms > 0).all() and (fine.modeled_mb > 0).all()
    assert seen[0] == (0, 4) and seen[-1] == (4, 4)
    assert sweeps.best_config(sweep) in (
        TileConfig(block_m=1, block_n=512, num_warps=2),
        TileConfig(block_m=4, block_n=512, num_warps=2),
    )


def test_grid_is_the_product_of_its_axes():
    configs = sweeps.grid_configs("attention", {"block_m": [16, 32], "block_n": [16, 32, 64]})
    assert len(configs) == 6 and configs[0] == TileConfig(block_m=16, block_n=16)


def test_cli_sequence_sweep_writes_a_csv(tmp_path, capsys):
    out = tmp_path / "seq.csv"
    cli.main(
        ["sequence", "--prompt-lengths", "3", "--new-tokens", "3", "--backend", "triton", "torch", "--out", str(out)]
    )
    table = pd.read_csv(out)
    assert set(table.backend) == {"triton", "torch"} and set(table.cache) == {"on", "off"}
    # CUDA graphs replay the cache-on steps where there is a GPU; on CPU every step is launched eagerly.
    graphs = torch.cuda.is_available()
    assert set(table[table.cache == "on"].launch_mode) == ({"CUDA graph"} if graphs else {"eager"})
    assert set(table[table.cache == "off"].launch_mode) == {"eager"}
    assert len(table) == 2 * 2 * 3
    off = table[(table.cache == "off") & (table.backend == "triton")]
    assert off.context_tokens.tolist() == [3, 4, 5]  # the recompute that grows with the cache off
    on = table[(table.cache == "on") & (table.backend == "triton")]
    assert on.kv_used_mb.is_monotonic_increasing and on.context_tokens.tolist() == [3, 1, 1]
    printed = capsys.readouterr().out
    assert ("measured" if graphs else "Triton interpreter") in printed
    assert "wrote" in printed


def test_step_budget_sets_kernel_sums_at_the_first_profiled_position_next_to_eager_and_graph_steps():
    per_kind = pd.DataFrame(
        dict(
            backend=["triton"] * 4,
            cache=["on"] * 4,
            phase=["decode", "decode", "decode", "prefill"],
            position=[6, 6, 90, 5],
            kind=["ffn", "layer_norm", "ffn", "ffn"],
            kernel_ms=[0.3, 0.1, 0.7, 9.0],
            launch_ms=[2.0, 1.0, 4.0, 9.0],
        )
    )
    summaries = pd.DataFrame(
        dict(backend=["triton", "triton"], cache=["on", "on"], cuda_graph=[False, True], step_ms_p50=[8.0, 0.5])
    )
    row = cli.step_budget(per_kind, summaries).iloc[0]
    assert row.position == 6
    assert row.kernels_ms == pytest.approx(0.4) and row.launching_ms == pytest.approx(3.0)
    assert (row.step_eager_ms, row.step_graph_ms) == (8.0, 0.5)


def test_cli_tiles_reach_the_kernels_and_bad_ones_are_refused_with_the_reason(tmp_path):
    tiles = cli.parse_tiles(["attention:block_m=32,num_warps=2", "linear_decode:autotune"])
    assert tiles.attention == TileConfig(block_m=32, num_warps=2) and tiles.linear_decode == "autotune"
    assert tiles.layer_norm is None
    with pytest.raises(SystemExit, match="KERNEL one of layer_norm"):
        cli.parse_tiles(["attn:block_m=32"])
    with pytest.raises(SystemExit, match="FIELD one of block_m"):
        cli.parse_tiles(["attention:blockm=32"])
    # A config the kernel refuses comes back as one line that says why, not a trace.
    with pytest.raises(SystemExit, match="error: layer_norm: block_m=3"):
        cli.main(
            ["generate", "--new-tokens", "2", "--backend", "triton", "--cache", "on", "--tiles", "layer_norm:block_m=3"]
        )
    out = tmp_path / "gen.csv"
    cli.main(
        [
            "generate",
            "--new-tokens",
            "2",
            "--backend",
            "triton",
            "--cache",
            "on",
            "--tiles",
            "decode_attention:block_n=16,split_k=2",
            "--out",
            str(out),
        ]
    )
    assert pd.read_csv(out).tokens.tolist() == [2]


def _bench(*args):
    """python -m explorer.bench in a fresh process, without TRITON_INTERPRET in its environment."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(
        [sys.executable, "-m", "explorer.bench", *args], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )


def test_cli_chooses_the_interpreter_itself_and_fails_when_no_config_could_run():
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour: on a GPU the kernels compile")
    ok = _bench("tiles", "--kernel", "layer_norm", "--shape", "M=3,C=40", "--grid", "block_m=1;num_warps=1,2")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "timed by: CPU: Triton interpreter" in ok.stdout and "True" in ok.stdout
    # A row of 100 does not fit 16-wide tiles: every config is refused, and the exit status says so.
    none = _bench("tiles", "--kernel", "layer_norm", "--shape", "M=3,C=100", "--grid", "block_n=16;block_m=1,2")
    assert none.returncode != 0
    assert "error: none of the 2 configs could run on this device" in none.stderr
    assert "smaller than the row width 100" in none.stderr


@pytest.mark.parametrize(
    "shape, message",
    [
        ("M=1_0,C=4", "numbers written with the digits 0-9; 'M=1_0' is not one"),
        ("M=3,M=4,C=4", "--shape gives M twice"),
        ("M=3", "must give every size of this kernel (M=...,C=...); missing C"),
        ("M=3,C=4,X=2", "X is not a size of this kernel; it takes M, C"),
    ],
)
def test_cli_shape_is_read_as_the_app_reads_it(shape, message):
    """--shape refuses what the app's shape field refuses, with the same message, before anything runs."""
    done = _bench("tiles", "--kernel", "layer_norm", "--shape", shape)
    assert done.returncode != 0 and message in done.stderr, done.stderr[-2000:]
