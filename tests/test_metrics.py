"""The measurement layer's pure parts, checked against numbers worked out by hand."""

import math

import pytest
import torch

from explorer import metrics
from explorer.generate import Step
from kernels import TileConfig
from kernels.attention import decode_traffic, traffic, traffic_naive
from kernels.config import SECTOR, Traffic
from kernels.layer_norm import traffic as ln_traffic
from kernels.layer_norm import traffic_unfused as ln_unfused
from kernels.linear import traffic as lin_traffic
from kernels.linear import traffic_unfused as lin_unfused


def test_layer_norm_traffic_by_hand():
    # 4 rows of 8 fp16 values in programs of 2 rows: x and residual read, y and the sum written once;
    # weight and bias (16 B each) read by each of the 2 programs.
    t = ln_traffic(4, 8, 2, residual=True, config=TileConfig(block_m=2))
    assert (t.bytes_read, t.bytes_written, t.flops) == (2 * 64 + 2 * 32, 2 * 64, 4 * 8 * 9)
    assert t.min_bytes == 2 * 64 + 32 + 2 * 64
    # Unfused: the add reads 2 and writes 1 row-set, LayerNorm reads 1 and writes 1: 5 passes vs 4.
    u = ln_unfused(4, 8, 2, residual=True)
    assert u.bytes == 5 * 64 + 32
    assert u.bytes - t.bytes == 64 - 32  # one pass over the rows saved, one extra weight read paid


def test_flash_attention_reads_kv_once_per_query_tile():
    row = 16 * 2  # D=16 in fp16
    # Tq = Tk = 64, causal, 16x16 tiles: query tile m reads keys up to its diagonal, 16 * (m + 1).
    small = traffic(1, 1, 64, 64, 16, 2, config=TileConfig(block_m=16, block_n=16))
    assert small.bytes_read == 64 * row + 2 * (16 + 32 + 48 + 64) * row
    # One 64-row tile reads K and V once: taller query tiles, fewer passes over K and V.
    tall = traffic(1, 1, 64, 64, 16, 2, config=TileConfig(block_m=64, block_n=16))
    assert tall.bytes_read == 64 * row + 2 * 64 * row
    assert small.bytes_written == tall.bytes_written == 64 * row
    assert small.flops == tall.flops == 4 * 16 * (64 * 65 // 2)
    # Naive attention writes and reads back the 64 x 64 score and probability matrices.
    naive = traffic_naive(1, 1, 64, 64, 16, 2)
    assert naive.bytes == small.min_bytes + 4 * 64 * 64 * 2


def test_attention_with_a_cache_prefix_sees_bottom_right_keys():
    # 4 new queries over 20 keys: query i sees keys [0, 16 + i], 17 + 18 + 19 + 20 = 74 pairs.
    t = traffic(1, 1, 4, 20, 16, 2, config=TileConfig(block_m=16, block_n=16))
    assert t.flops == 4 * 16 * 74
    assert t.bytes_read == 4 * 32 + 2 * 20 * 32  # one query tile; key tiles clipped at Tk


def test_linear_traffic_by_hand():
    # 32 x 8 input, 16 x 8 weight, 16x16 tiles: 2 row tiles each read the weight and bias, 1 column tile
    # reads the input once.
    t = lin_traffic(32, 16, 8, 2, bias=True, activation="gelu", config=TileConfig(block_m=16, block_n=16, block_k=16))
    assert t.bytes_read == 32 * 8 * 2 + 2 * (16 * 8 * 2 + 16 * 2)
    assert t.bytes_written == 32 * 16 * 2
    assert t.flops == 2 * 32 * 16 * 8 + 32 * 16 * 11
    # The unfused GELU reads and writes the 32 x 16 activation once more.
    u = lin_unfused(32, 16, 8, 2, bias=True, activation="gelu")
    assert u.bytes - u.bytes_read + u.bytes_read == u.bytes
    assert u.bytes == (32 * 8 + 16 * 8 + 16) * 2 + 32 * 16 * 2 + 2 * 32 * 16 * 2


def test_split_k_decode_path_reads_the_weight_once():
    t = lin_traffic(1, 64, 256, 2, bias=False, config=TileConfig(block_m=16, block_n=32, block_k=32, split_k=4))
    partials = 4 * 1 * 64 * 4
    assert t.bytes_read == 256 * 2 * 2 + 64 * 256 * 2 + partials  # input once per column tile, weight once
    assert t.bytes_written == partials + 64 * 2


def test_decode_attention_reads_only_valid_positions():
    cfg = TileConfig(block_n=16, split_k=2)
    t = decode_traffic([3, 5], 2, 32, 16, 2, config=cfg)
    programs, q_row = 2 * 2 * 2, 16 * 2  # sequences x heads x splits; one head's query in fp16
    kv = 2 * (3 + 5) * 2 * q_row  # K and V up to each length, never the 32 allocated
    # Each program loads q and its length and stores a partial and two scalars (a sector each); the
    # merge reads the partials and each head's maxes and sums.
    merge = programs * 16 * 4 + 2 * 4 * SECTOR
    assert t.bytes_read == programs * (q_row + SECTOR) + kv + merge
    assert t.bytes_written == programs * (16 * 4 + 2 * SECTOR) + 2 * 2 * q_row
    assert t.flops == 4 * 2 * 16 * 8


def test_traffic_adds_up():
    assert Traffic(1, 2, 3, 4) + Traffic(10, 20, 30, 40) == Traffic(11, 22, 33, 44)
    assert Traffic(1, 2, 3, 4).bytes == 3


@pytest.mark.parametrize(
    "values,q,expected",
    [([1, 2, 3, 4], 50, 2.5), (list(range(1, 11)), 90, 9.1), ([7.0], 90, 7.0), ([3, 1, 2], 0, 1), ([3, 1, 2], 100, 3)],
)
def test_percentile(values, q, expected):
    assert metrics.percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan():
    assert math.isnan(metrics.percentile([], 50))


def test_kv_bytes_per_token_matches_the_cache_tensors():
    from explorer.cache import KVCache

    cache = KVCache(3, 2, 4, 10, 16, dtype=torch.float16, device="cpu")
    per_token = metrics.kv_bytes_per_token(3, 4, 16, 2)
    assert cache.bytes_per_token == per_token == 2 * 3 * 4 * 16 * 2
    assert cache.allocated_bytes == cache.k.numel() * 2 + cache.v.numel() * 2 == per_token * 2 * 10
    cache.set_lengths([3, 7])
    assert cache.used_bytes == per_token * 10


def _step(i, ms, batch=1, kv=0, traffic=None, kernel_ms=None):
    return Step(index=i, phase="prefill" if i == 0 else "decode", token_ids=[1] * batch, texts=[""] * batch,
                positions=[5 + i] * batch, context_tokens=batch, latency_ms=ms, timer="test", kv_used_bytes=kv,
                kv_allocated_bytes=100, traffic=traffic or {"ffn": Traffic(1000, 1000, 10**6, 2000)},
                kernel_ms=kernel_ms or {}, warmup_ms=50.0 if i == 0 else 0.0)  # fmt: skip


def test_summary_keeps_prefill_and_warmup_apart():
    steps = [_step(0, 30.0)] + [_step(i, ms) for i, ms in enumerate([2.0, 4.0, 6.0, 8.0], start=1)]
    s = metrics.summary(steps, metrics.Peaks(bandwidth_gbs=1.0, tflops=1.0, label="test"))
    assert s["ttft_ms"] == 30.0 and s["warmup_ms"] == 50.0
    assert s["ms_per_token_p50"] == pytest.approx(5.0)
    assert s["ms_per_token_p90"] == pytest.approx(7.4)
    assert s["tokens_per_s"] == pytest.approx(4 / 0.020)
    # The median of the per-step rates, 2000 B over 2, 4, 6 and 8 ms.
    assert s["achieved_gbs"] == pytest.approx((2000 / 4 + 2000 / 6) / 2 / 1e6)
    assert s["bandwidth_fraction"] == pytest.approx(s["achieved_gbs"])


def test_frames_are_tidy():
    steps = [_step(0, 10.0, batch=2, kernel_ms={"ffn": 4.0}), _step(1, 5.0, batch=2)]
    per_step = metrics.step_frame(steps)
    assert list(per_step.step) == [0, 1] and list(per_step.batch) == [2, 2]
    per_kernel = metrics.kernel_frame(steps)
    assert len(per_kernel) == 2 and set(per_kernel.kind) == {"ffn"}
    assert per_kernel.kernel_ms.iloc[0] == 4.0 and math.isnan(per_kernel.kernel_ms.iloc[1])
    assert per_kernel.intensity.iloc[0] == pytest.approx(10**6 / 2000)


def test_roofline_marks_memory_and_compute_bound():
    steps = [
        _step(1, 1.0, traffic={"decode attention": Traffic(10**6, 0, 10**6, 10**6), "ffn": Traffic(10**6, 0, 10**9, 0)},
              kernel_ms={"decode attention": 0.01, "ffn": 1.0})
    ]  # fmt: skip
    peaks = metrics.Peaks(bandwidth_gbs=1000.0, tflops=100.0, label="test")  # ridge at 100 FLOP/byte
    r = metrics.roofline(metrics.kernel_frame(steps), peaks).set_index("kind")
    assert r.loc["decode attention", "bound"] == "memory"
    assert r.loc["ffn", "bound"] == "compute"
    assert r.loc["decode attention", "ceiling_tflops"] == pytest.approx(1.0)  # 1 FLOP/byte x 1 TB/s


def test_export_round_trips(tmp_path):
    frame = metrics.step_frame([_step(0, 1.0), _step(1, 2.0)])
    import pandas as pd

    assert pd.read_csv(metrics.export(frame, str(tmp_path / "a.csv"))).latency_ms.tolist() == [1.0, 2.0]
    assert pd.read_json(metrics.export(frame, str(tmp_path / "a.json"))).latency_ms.tolist() == [1.0, 2.0]


def test_summary_reports_how_decode_steps_were_launched_and_the_graph_capture():
    eager = [_step(0, 3.0)] + [_step(i, 2.0) for i in (1, 2)]
    for s in eager:
        s.launches = 99
    s = metrics.summary(eager)
    assert s["cuda_graph"] is False and s["launches_per_step"] == 99
    graphed = [_step(0, 3.0)] + [_step(i, 0.5) for i in (1, 2, 3)]
    graphed[1].warmup_ms = 7.0  # the capture, before the first decode step
    for s in graphed[1:]:
        s.graph, s.launches = True, 99
    s = metrics.summary(graphed)
    assert s["cuda_graph"] is True and s["warmup_ms"] == 57.0
    assert list(metrics.step_frame(graphed).graph) == [False, True, True, True]


def test_recorder_books_growing_traffic_and_can_book_it_again_at_other_lengths():
    from explorer.ops import Recorder

    rec = Recorder()
    rec.add("ffn", Traffic(10, 20, 30, 30))
    rec.add_per_length("decode attention", [3, 5], lambda lengths: Traffic(100 * sum(lengths), 1, 0, 1))
    assert rec.traffic["decode attention"] == Traffic(800, 1, 0, 1)
    assert dict(rec.launches) == {"ffn": 1, "decode attention": 1}
    ((kind, model),) = rec.per_length
    assert kind == "decode attention" and model([10, 10]) == Traffic(2000, 1, 0, 1)


def test_recorder_times_calls_on_cpu_and_returns_their_result():
    from explorer.ops import Recorder

    rec = Recorder(timed=True)
    assert rec.call("ffn", torch.device("cpu"), lambda: 41 + 1) == 42
    rec.call("ffn", torch.device("cpu"), lambda: None)
    times = rec.times_ms()
    assert set(times) == {"ffn"} and times["ffn"] >= 0
    assert rec.launch_ms() == {}  # host launch time is a GPU profiling figure
    assert Recorder().call("ffn", torch.device("cpu"), lambda: 7) == 7 and Recorder().times_ms() == {}
