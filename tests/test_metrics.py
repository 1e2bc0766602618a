"""The measurement layer's pure parts, checked against numbers worked out by hand."""

import dataclasses
import math
import re
import statistics
import time

import pytest
import torch

from explorer.measure import metrics
from explorer.measure.profile import Profiler, sample_positions
from explorer.measure.traffic import op_traffic, step_traffic
from kernels import TileConfig
from kernels.config import SECTOR, Traffic
from kernels.ops.attention.kernel import traffic, traffic_naive
from kernels.ops.decode_attention.kernel import decode_traffic
from kernels.ops.layer_norm.kernel import traffic as ln_traffic
from kernels.ops.layer_norm.kernel import traffic_unfused as ln_unfused
from kernels.ops.linear.kernel import traffic as lin_traffic
from kernels.ops.linear.kernel import traffic_unfused as lin_unfused
from tests.steps import DECODE, FFN, PREFILL, profile, step


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
    assert u.bytes_written == 2 * 32 * 16 * 2  # the matmul's output, then GELU's
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
    from explorer.model.cache import KVCache

    cache = KVCache(3, 2, 4, 10, 16, dtype=torch.float16, device="cpu")
    per_token = metrics.kv_bytes_per_token(3, 4, 16, 2)
    assert cache.bytes_per_token == per_token == 2 * 3 * 4 * 16 * 2
    assert cache.allocated_bytes == cache.k.numel() * 2 + cache.v.numel() * 2 == per_token * 2 * 10
    cache.set_lengths([3, 7])
    assert cache.used_bytes == per_token * 10


def test_an_operation_is_booked_at_the_tiles_it_ran_with():
    # FFN: 4 x 16 input, 32 x 16 weight, one 16x32 tile: input, weight and bias read once, output once.
    t = op_traffic(FFN)
    assert (t.bytes_read, t.bytes_written) == (4 * 16 * 2 + 32 * 16 * 2 + 32 * 2, 4 * 32 * 2)
    assert t.flops == 2 * 4 * 32 * 16 + 4 * 32 * 11
    torch_ffn = op_traffic(dataclasses.replace(FFN, backend="torch"))  # F.linear, then a separate GELU pass
    assert torch_ffn.bytes == t.bytes + 2 * 4 * 32 * 2


def test_names_map_to_chart_categories():
    assert [op.category for op in (FFN, DECODE, PREFILL)] == ["ffn", "decode attention", "attention"]
    assert dataclasses.replace(FFN, name="attn.c_proj").category == "qkv/out proj"
    assert dataclasses.replace(FFN, name="ln_f", kernel="layer_norm").category == "layer_norm"


def test_decode_attention_is_booked_at_each_steps_own_lengths():
    # The same captured operations, replayed at positions 6 and 40: the cache read grows with the keys.
    early, late = step(1, 1.0), step(35, 1.0)
    row = 2 * 16 * 2  # heads x head_dim x fp16
    growth = step_traffic(late)["decode attention"].bytes_read - step_traffic(early)["decode attention"].bytes_read
    assert growth == 2 * (40 - 6) * row  # K and V, 34 more positions each
    assert step_traffic(late)["ffn"] == step_traffic(early)["ffn"] == op_traffic(FFN)
    twice = step(1, 1.0, ops=(FFN, FFN))
    assert step_traffic(twice)["ffn"].bytes == 2 * op_traffic(FFN).bytes


def test_summary_keeps_prefill_warmup_device_steps_and_the_wall_clock_apart():
    # Device steps of 2, 4, 6 and 8 ms, but tokens reached the caller 0.1 s apart (a slow host).
    walls = [1.0, 1.1, 1.2, 1.3, 1.4]
    steps = [
        step(i, ms, wall_s=w, peak=(i + 1) * 2**20)
        for i, (ms, w) in enumerate(zip([30.0, 2, 4, 6, 8], walls, strict=True))
    ]
    s = metrics.summary(steps, metrics.Peaks(bandwidth_gbs=1.0, tflops=1.0, label="test"))
    assert s["ttft_ms"] == 30.0 and s["warmup_ms"] == 50.0
    assert s["step_ms_p50"] == pytest.approx(5.0)
    assert s["step_ms_p90"] == pytest.approx(7.4)
    assert s["wall_tokens_per_s"] == pytest.approx(4 / 0.4)  # 4 tokens after the first, over 0.4 s
    assert s["device_tokens_per_s"] == pytest.approx(1000 / 5.0)
    assert s["peak_memory_mb"] == 5.0  # the largest max_memory_allocated a step saw
    moved = [sum(t.hbm_bytes for t in step_traffic(x).values()) for x in steps[1:]]
    assert s["achieved_gbs"] == pytest.approx(
        statistics.median(m / ms / 1e6 for m, ms in zip(moved, [2, 4, 6, 8], strict=True))
    )
    assert s["bandwidth_fraction"] == pytest.approx(s["achieved_gbs"])
    assert "kernels_per_step" not in s  # only when counted


def test_kernel_frame_takes_times_from_the_nearest_profiled_step_of_its_phase():
    steps = [step(i, 1.0) for i in range(8)]
    prof = profile(
        [
            (0, "prefill", 5, "mlp.c_fc", "ffn", 9.0, 0.5),
            (1, "decode", 6, "mlp.c_fc", "ffn", 1.0, 0.1),
            (1, "decode", 6, "attn", "decode attention", 0.2, 0.1),
            (7, "decode", 12, "mlp.c_fc", "ffn", 3.0, 0.1),
        ]
    )
    frame = metrics.kernel_frame(steps, prof)
    ffn = frame[frame.kind == "ffn"].set_index("step")
    assert ffn.kernel_ms.tolist() == [9.0, 1.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0]  # steps 2-4 nearer 1, 5-7 nearer 7
    assert ffn.profiled_step.tolist() == [0, 1, 1, 1, 1, 7, 7, 7]
    attn = frame[frame.kind == "decode attention"].set_index("step")
    assert attn.kernel_ms[3] == 0.2 and math.isnan(attn.kernel_ms[6])  # step 7 did not time attention
    assert metrics.kernel_frame(steps).kernel_ms.isna().all()  # no profile, no times
    assert "decode positions 6, 12" in metrics.profiled_note(prof)


def test_profile_positions_spread_over_the_run():
    assert sample_positions(list(range(1, 101)), 5) == [1, 26, 51, 75, 100]
    assert sample_positions([1, 2], 5) == [1, 2]
    assert sample_positions([3], 5) == [3] and sample_positions([], 5) == []


def test_profiler_times_calls_on_cpu_and_returns_their_result():
    prof = Profiler()
    assert prof(FFN, lambda: 41 + 1) == 42
    prof(FFN, lambda: time.sleep(0.002))
    prof(DECODE, lambda: None)
    rows = {r["op"]: r for r in prof.take()}
    assert rows["mlp.c_fc"]["calls"] == 2 and rows["mlp.c_fc"]["kernel_ms"] >= 2.0
    assert rows["attn"]["kind"] == "decode attention"
    assert math.isnan(rows["attn"]["launch_ms"])  # host launch time is a GPU profiling figure
    assert prof.take() == []  # taken once


class _SimulatedGPU:
    """Enough of torch.cuda for the Profiler's GPU branch: one stream on a GPU whose clock is low for its first three
    spins (each takes 4x as long as once it has risen), and a host clock that only a kernel's launch advances."""

    def __init__(self, launch_ms: float, kernel_ms: float):
        self.launch_ms, self.kernel_ms = launch_ms, kernel_ms
        self.host = self.free_at = 0.0  # ms: the host's clock; when the stream finishes what it was given
        self.spins = 0

    def sleep(self, cycles: int) -> None:
        self.spins += 1
        self.free_at = max(self.free_at, self.host) + cycles * (2e-6 if self.spins <= 3 else 0.5e-6)

    def kernel(self) -> None:
        self.host += self.launch_ms
        self.free_at = max(self.free_at, self.host) + self.kernel_ms

    def event_type(self) -> type:
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):  # done when the stream reaches it
                self.t = gpu.free_at = max(gpu.free_at, gpu.host)

            def elapsed_time(self, other):
                return other.t - self.t

            def synchronize(self):  # the host waits for the stream to reach it
                gpu.host = max(gpu.host, self.t)

        return Event


def test_the_profiler_times_a_slow_launch_behind_a_spin_as_long_as_the_gpu_ran_it(monkeypatch):
    """A launch that takes longer than the spin before it leaves the GPU idle between the events: the profiler must
    spin longer and time it again. The spin's length is read as the GPU ran it, at the clock it then had: a rate
    measured once, while the clock was low, would take a spin of 0.2 ms for one of 0.8 and count the 0.3 ms the
    host was still launching as the kernel's."""
    import types

    from explorer.measure import profile

    gpu = _SimulatedGPU(launch_ms=0.5, kernel_ms=0.01)
    monkeypatch.setattr(torch.cuda, "Event", gpu.event_type())
    monkeypatch.setattr(torch.cuda, "_sleep", gpu.sleep)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: setattr(gpu, "host", max(gpu.host, gpu.free_at)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(profile, "time", types.SimpleNamespace(perf_counter=lambda: gpu.host / 1e3))
    monkeypatch.setattr(profile, "_spin", profile._Spin())
    op = types.SimpleNamespace(name="attn", category="decode attention", device=torch.device("cuda", 0))
    prof = Profiler()
    for _ in range(4):
        prof(op, gpu.kernel)
    assert gpu.spins > 3  # the clock rose while the profiler ran
    (row,) = prof.take()
    assert row["calls"] == 4 and row["kernel_ms"] == pytest.approx(4 * 0.01)
    assert row["launch_ms"] == pytest.approx(4 * 0.5)  # the launches that counted, not those run again


def test_roofline_marks_memory_and_compute_bound():
    prof = profile(
        [(1, "decode", 6, "attn", "decode attention", 1e-4, 0.0), (1, "decode", 6, "mlp.c_fc", "ffn", 1e-6, 0)]
    )
    frame = metrics.kernel_frame([step(1, 1.0)], prof).set_index("kind")
    peaks = metrics.Peaks(bandwidth_gbs=1000.0, tflops=100.0, label="test")  # ridge at 100 FLOP/byte
    r = metrics.roofline(frame.reset_index(), peaks).set_index("kind")
    for kind in ("decode attention", "ffn"):
        intensity = frame.loc[kind, "gflop"] * 1e9 / (frame.loc[kind, "hbm_mb"] * metrics.MB)
        assert r.loc[kind, "intensity"] == pytest.approx(intensity)
        assert r.loc[kind, "ceiling_tflops"] == pytest.approx(min(100.0, intensity * 1.0))
        assert r.loc[kind, "bound"] == ("memory" if intensity < 100 else "compute")


def test_export_round_trips(tmp_path):
    frame = metrics.step_frame([step(0, 1.0), step(1, 2.0)])
    import pandas as pd

    assert pd.read_csv(metrics.export(frame, str(tmp_path / "a.csv"))).latency_ms.tolist() == [1.0, 2.0]
    assert pd.read_json(metrics.export(frame, str(tmp_path / "a.json"))).latency_ms.tolist() == [1.0, 2.0]


def test_summary_reports_how_decode_steps_were_launched_and_the_graph_capture():
    from explorer.measure.launches import StepLaunches

    eager = [step(0, 3.0)] + [step(i, 2.0) for i in (1, 2)]
    s = metrics.summary(eager)
    assert s["cuda_graph"] is False and s["operations_per_step"] == 2
    graphed = [step(0, 3.0)] + [step(i, 0.5, graph=True) for i in (1, 2, 3)]
    graphed[1].warmup_ms = 7.0  # the capture, before the first decode step
    s = metrics.summary(graphed, launches=StepLaunches(kernels=163, memory_ops=2, graph=True))
    assert s["cuda_graph"] is True and s["warmup_ms"] == 57.0
    assert (s["kernels_per_step"], s["memory_ops_per_step"]) == (163, 2)
    assert list(metrics.step_frame(graphed).graph) == [False, True, True, True]


@pytest.mark.parametrize("name", ["bundled", "bundled-llama"])
def test_the_megakernels_step_is_split_into_the_operations_it_runs_as_the_overlap_rungs_kernels_move_them(name):
    """One launch runs a whole decode step on the megakernel rung; its bytes are still each operation's. Booked by
    operation, each category's HBM bytes and floor are what the overlap rung's separate kernels move for it (their
    own models, the reference here; the SMs' requests differ where the two rungs tile rows differently), and the
    counters the tasks wait on hold a sector each way per arrival (kernels.ops.decode_step.counts), which stay in L2.
    Two unequal prompts, so the rows' lengths differ."""
    from explorer.model.generate import generate
    from explorer.model.weights import load_model
    from kernels.ops import decode_step

    model = load_model(name, device=torch.device("cpu"), dtype=torch.float32)[0]
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in (1, 17)]
    once = dict(max_new_tokens=3, warmup=False, graph=False, eos_token_id=-1)
    frames = {}
    for fusion in ("overlap", "megakernel"):
        steps = list(generate(model.with_fusion(fusion), prompts, fusion=fusion, **once))
        frames[fusion] = metrics.kernel_frame(steps)
        if fusion == "megakernel":
            decode = [s for s in steps if s.phase == "decode"]
    mega, over = (frames[f][frames[f].phase == "decode"].set_index(["step", "kind"]) for f in ("megakernel", "overlap"))
    assert set(mega.index) == set(over.index) | {(s.index, "counters") for s in decode}
    columns = ["hbm_read", "hbm_written", "floor_mb"]
    assert mega.loc[over.index, columns].to_numpy() == pytest.approx(over[columns].to_numpy(), rel=1e-9)
    for s in decode:
        (op,) = s.ops
        stages, heads = decode_step.counts(len(s.positions), op.sizes.shape, op.sizes.max_len, op.dtype, op.device)
        counters = mega.loc[(s.index, "counters")]
        assert counters.bytes_read == counters.bytes_written == SECTOR * (sum(stages) + sum(heads))
        assert counters.hbm_read == counters.hbm_written == 0
        whole = op_traffic(op, tuple(s.positions))  # the launch's book, unsplit
        assert mega.loc[s.index].bytes_read.sum() == whole.bytes_read
        assert mega.loc[s.index].hbm_written.sum() == whole.hbm_written


def test_one_launchs_time_is_a_row_of_its_own_and_the_share_chart_says_why_it_shows_bytes():
    """The megakernel rung's profile times its one launch ("decode step"), which no operation has alone: the time
    is a row without bytes, the bytes stay split, and the share of the step is drawn from the bytes, saying why."""
    from explorer.app import plots
    from explorer.model.generate import generate
    from explorer.model.weights import load_model

    model = load_model("bundled", device=torch.device("cpu"), dtype=torch.float32)[0].with_fusion("megakernel")
    steps = list(generate(model, [5, 6, 7], max_new_tokens=3, fusion="megakernel", warmup=False, graph=False))
    timed = profile([(s.index, s.phase, s.positions[0], "step", "decode step", 0.2 + s.index, 0.01) for s in steps])
    frame = metrics.kernel_frame(steps, timed)
    alone = frame[(frame.phase == "decode") & (frame.kind == "decode step")]
    assert list(alone.kernel_ms) == [1.2, 2.2] and (alone.modeled_mb == 0).all() and alone.achieved_gbs.isna().all()
    split = frame[(frame.phase == "decode") & (frame.kind != "decode step")]
    assert split.kernel_ms.isna().all() and set(split.kind) >= {"qkv/out proj", "ffn", "lm_head", "counters"}
    share = plots.kernel_share_figure(frame, "timed at two positions")
    title = re.sub(r"<br>|</?sup>", " ", share.layout.title.text)
    assert "(modeled HBM bytes)" in title and plots.ONE_LAUNCH in " ".join(title.split())
    with_bytes = split[split.hbm_mb > 0].groupby("kind", sort=False).hbm_mb.sum()
    assert list(share.data[0].labels) == list(with_bytes.index)
    assert list(share.data[0].values) == pytest.approx(list(with_bytes.values))
    bars = [t.name for t in plots.traffic_figure(frame).data if t.type == "bar"]
    assert "decode step" not in bars and "counters" not in bars and "ffn" in bars
