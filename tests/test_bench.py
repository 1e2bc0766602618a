"""Sweeps and the CLI, end to end on CPU (small shapes, the bundled model)."""

import pandas as pd
import pytest

from explorer import bench
from kernels import TileConfig


def test_tile_sweep_keeps_impossible_configs_with_the_reason(device):
    seen = []
    grid = {"block_m": [1, 4], "block_n": [64, 512], "num_warps": [2]}
    sweep = bench.tile_sweep("layer_norm", {"M": 9, "C": 100}, device=device, grid=grid,
                             progress=lambda i, n, d: seen.append((i, n)))  # fmt: skip
    assert len(sweep) == 4
    too_narrow = sweep[sweep.block_n == 64]
    assert not too_narrow.valid.any()
    assert too_narrow.reason.str.contains("smaller than the row width 100").all()
    fine = sweep[sweep.valid]
    assert len(fine) == 2 and (fine.ms > 0).all() and (fine.modeled_mb > 0).all()
    assert seen[0] == (0, 4) and seen[-1] == (4, 4)
    assert bench.best_config(sweep) in (TileConfig(block_m=1, block_n=512, num_warps=2),
                                        TileConfig(block_m=4, block_n=512, num_warps=2))  # fmt: skip


def test_grid_is_the_product_of_its_axes():
    configs = bench.grid_configs("attention", {"block_m": [16, 32], "block_n": [16, 32, 64]})
    assert len(configs) == 6 and configs[0] == TileConfig(block_m=16, block_n=16)


def test_cli_sequence_sweep_writes_a_csv(tmp_path, capsys):
    out = tmp_path / "seq.csv"
    bench.main(["sequence", "--prompt-lengths", "3", "--new-tokens", "3", "--backend", "triton", "torch",
                "--out", str(out)])  # fmt: skip
    table = pd.read_csv(out)
    assert set(table.backend) == {"triton", "torch"} and set(table.cache) == {"on", "off"}
    assert set(table.launch_mode) == {"eager"}  # no CUDA graphs on CPU
    assert len(table) == 2 * 2 * 3
    off = table[(table.cache == "off") & (table.backend == "triton")]
    assert off.context_tokens.tolist() == [3, 4, 5]  # the recompute that grows with the cache off
    on = table[(table.cache == "on") & (table.backend == "triton")]
    assert on.kv_used_mb.is_monotonic_increasing and on.context_tokens.tolist() == [3, 1, 1]
    printed = capsys.readouterr().out
    assert "Triton interpreter" in printed or "measured" in printed
    assert "wrote" in printed


def test_step_budget_sets_kernel_sums_next_to_eager_and_graph_steps():
    per_kind = pd.DataFrame(
        dict(backend=["triton"] * 3, cache=["on"] * 3, phase=["decode", "decode", "prefill"],
             kind=["ffn", "layer_norm", "ffn"], kernel_ms=[0.3, 0.1, 9.0], launch_ms=[2.0, 1.0, 9.0],
             modeled_mb=[100.0, 1.0, 9.0])
    )  # fmt: skip
    summaries = pd.DataFrame(dict(backend=["triton", "triton"], cache=["on", "on"], cuda_graph=[False, True],
                                  ms_per_token_p50=[8.0, 0.5]))  # fmt: skip
    row = bench.step_budget(per_kind, summaries).iloc[0]
    assert row.kernels_ms == pytest.approx(0.4) and row.launching_ms == pytest.approx(3.0)
    assert row.modeled_mb == pytest.approx(101.0)
    assert (row.step_eager_ms, row.step_graph_ms) == (8.0, 0.5)


def test_cli_tiles_reach_the_kernels_and_bad_ones_are_refused_with_the_reason(tmp_path):
    tiles = bench.parse_tiles(["attention:block_m=32,num_warps=2", "linear_decode:autotune"])
    assert tiles.attention == TileConfig(block_m=32, num_warps=2) and tiles.linear_decode == "autotune"
    assert tiles.layer_norm is None
    with pytest.raises(SystemExit, match="KERNEL one of layer_norm"):
        bench.parse_tiles(["attn:block_m=32"])
    with pytest.raises(SystemExit, match="FIELD one of block_m"):
        bench.parse_tiles(["attention:blockm=32"])
    # A config the kernel refuses comes back as one line that says why, not a trace.
    with pytest.raises(SystemExit, match="error: layer_norm: block_m=3"):
        bench.main(["generate", "--new-tokens", "2", "--backend", "triton", "--cache", "on",
                    "--tiles", "layer_norm:block_m=3"])  # fmt: skip
    out = tmp_path / "gen.csv"
    bench.main(["generate", "--new-tokens", "2", "--backend", "triton", "--cache", "on", "--tiles",
                "decode_attention:block_n=16,split_k=2", "--out", str(out)])  # fmt: skip
    assert pd.read_csv(out).tokens.tolist() == [2]
