"""Which program reads which tile (explorer.measure.tile_reads) and its picture: the walks against the traffic models'
SM-request level (itself checked against the kernels' loops in tests/ops), against the properties the kernels'
loops promise (every output tile computed once, GROUP_M row tiles at a time; every key a query may see read, the
masked tiles exactly those the diagonal or the keys' end crosses), and on recorded launches."""

import json
import re

import pytest
import torch

import kernels.ops.attention.kernel as attention_mod
import kernels.ops.linear.kernel as linear_mod
from explorer.app.tile_figure import tile_reads_figure
from explorer.measure import occupancy, tile_reads
from explorer.measure.tile_reads import MASKED, WHOLE
from explorer.model.weights import BUNDLED_LLAMA, DEFAULT_MODEL, load_model
from kernels.config import TileConfig, cdiv
from tests.ops.limits import BF16, H200

LINEAR = [  # rows, out, inp, tiles: one row, ragged edges on both sides, a group taller than the grid
    (1, 17, 40, TileConfig(block_m=16, block_n=16, block_k=32, group_m=4)),
    (17, 100, 64, TileConfig(block_m=16, block_n=32, block_k=32, group_m=2)),
    (127, 300, 96, TileConfig(block_m=32, block_n=64, block_k=32, group_m=8)),
    (1000, 768, 256, TileConfig(block_m=64, block_n=128, block_k=64, group_m=8)),
]


@pytest.mark.parametrize("rows,out,inp,cfg", LINEAR)
def test_the_linear_walk_requests_what_the_traffic_model_counts(rows, out, inp, cfg):
    t = linear_mod.traffic(rows, out, inp, 2, bias=True, config=cfg, dtype=BF16, device=H200)
    cfg = linear_mod.resolve_config(cfg, rows, out, inp, BF16, H200)
    r = tile_reads.linear(rows, out, inp, cfg.block_m, cfg.block_n, cfg.group_m)
    bias = cdiv(rows, cfg.block_m) * out * 2  # each row tile's programs read the bias once between them
    assert r.requested(2) + bias == t.bytes_read
    assert r.unique(2) == (rows + out) * inp * 2 <= r.requested(2)


@pytest.mark.parametrize("rows,out,inp,cfg", LINEAR)
def test_every_output_tile_is_computed_once_group_m_row_tiles_at_a_time(rows, out, inp, cfg):
    r = tile_reads.linear(rows, out, inp, cfg.block_m, cfg.block_n, cfg.group_m)
    tiles_m, tiles_n = cdiv(rows, cfg.block_m), cdiv(out, cfg.block_n)
    steps = sorted(s for row in r.order for s in row)
    assert steps == list(range(tiles_m * tiles_n))
    at = {r.order[m][n]: (m, n) for m in range(tiles_m) for n in range(tiles_n)}
    group = cfg.group_m * tiles_n
    for first in range(0, tiles_m * tiles_n, group):  # a group's steps cover its row tiles, every column
        band = {at[s][0] for s in range(first, min(first + group, tiles_m * tiles_n))}
        lo = first // tiles_n
        assert band == set(range(lo, min(lo + cfg.group_m, tiles_m)))
    # each x row is requested by every column tile of its row tile (and by wrapped bands past the edge)
    assert all(n >= tiles_n for n in r.x_requests) and all(n >= tiles_m for n in r.w_requests)
    persistent = tile_reads.linear(rows, out, inp, cfg.block_m, cfg.block_n, cfg.group_m, programs=3)
    assert all(persistent.program[m][n] == r.order[m][n] % 3 for m in range(tiles_m) for n in range(tiles_n))


ATTENTION = [(1, 1, 16, 16), (17, 17, 16, 16), (17, 40, 16, 32), (127, 127, 64, 32), (100, 300, 32, 64)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk,bm,bn", ATTENTION)
def test_the_attention_walk_requests_what_the_traffic_model_counts(tq, tk, bm, bn, causal):
    b, h, d, item = 2, 3, 64, 2
    t = attention_mod.traffic(b, h, tq, tk, d, item, causal=causal, config=TileConfig(block_m=bm, block_n=bn))
    a = tile_reads.attention(tq, tk, bm, bn, causal)
    q = b * h * tq * d * item
    assert t.bytes_read == q + 2 * b * h * d * item * a.requested_keys()


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk,bm,bn", ATTENTION)
def test_every_key_a_query_may_see_is_read_and_only_edge_tiles_are_masked(tq, tk, bm, bn, causal):
    a = tile_reads.attention(tq, tk, bm, bn, causal)
    offset = tk - tq
    for i, row in enumerate(a.kinds):
        positions = range(i * bm, min((i + 1) * bm, tq))
        seen = {k for p in positions for k in range(tk) if not causal or k <= offset + p}
        read = {k for j, kind in enumerate(row) if kind for k in range(j * bn, min((j + 1) * bn, tk))}
        assert seen <= read
        for j, kind in enumerate(row):
            keys = range(j * bn, min((j + 1) * bn, tk))
            hidden = causal and any(k > offset + p for p in positions for k in keys)  # some query may not see it
            if kind == WHOLE:  # read without a mask: a whole tile every query of the tile sees
                assert len(keys) == bn and not hidden
            elif kind == MASKED:  # the diagonal crosses it, or the keys end inside it
                assert hidden or len(keys) < bn


def test_the_figure_draws_both_grids_and_says_how_often_bytes_are_requested():
    lin = tile_reads.linear(127, 300, 96, 32, 64, 2)
    att = tile_reads.attention(127, 127, 32, 32)
    fig = tile_reads_figure(lin, att, 2, {"linear": "attn.c_attn", "attention": "attn"}, "at 127 tokens")
    heat_l, heat_a = fig.data
    assert (len(heat_l.z), len(heat_l.z[0])) == (4, 5) and (len(heat_a.z), len(heat_a.z[0])) == (4, 4)
    assert "program" in heat_l.customdata[3][4] and "masked" in heat_a.customdata[1][1]
    title = " ".join(re.sub("<[^>]+>", " ", fig.layout.title.text).split())  # the note's wrapped lines as one
    x_times, w_times = sum(lin.x_requests) / 127, sum(lin.w_requests) / 300  # rows past the edge wrap: more
    assert f"Each x row is requested {x_times:.3g} times, each weight row {w_times:.3g}" in title
    assert f"{lin.requested(2) / 1e6:.2f} MB requested from L2 for {lin.unique(2) / 1e3:.1f} KB" in title
    assert "6 read whole (blue), 4 masked (orange)" in title and title.endswith("at 127 tokens")


@pytest.mark.parametrize("name", [DEFAULT_MODEL, BUNDLED_LLAMA])
def test_the_prefills_matmul_and_attention_are_found_in_its_recorded_launches(name):
    model, _ = load_model(name, dtype=torch.float16)
    got = tile_reads.from_launches(occupancy.recorded(model, batch=1, prompt=40, decode=False))
    assert got["linear"]["operation"] == "attn.c_attn" and got["linear"]["rows"] == 40
    assert got["linear"]["inp"] == model.config.n_embd
    assert got["attention"]["tq"] == got["attention"]["tk"] == 40 and got["attention"]["causal"]
    if name == BUNDLED_LLAMA:  # the grouped kernel: a program's rows are its positions times the group's heads
        assert got["attention"]["positions"] * (model.config.n_head // model.config.n_kv_head) <= 128
    json.dumps(got)  # crosses from the compiling process as JSON
