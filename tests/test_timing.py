"""The one timing method (kernels.timing) and the autotuner that uses it. The rotation arithmetic, the input
copies, the capture clean-up and pick's bookkeeping run on CPU; the timings themselves need a GPU."""

import contextlib
import statistics

import pytest
import torch
from triton.runtime.errors import OutOfResources

from kernels import autotune, timing
from kernels.config import TileConfig
from kernels.operations import CANDIDATES

MB = 1 << 20
H200_L2 = 60 * MB


@pytest.mark.parametrize(
    ("bytes_per_set", "l2"),
    [(25 * MB, H200_L2), (5 * MB, 40 * MB), (100 * MB, 128 * MB), (7 * MB, 50 * MB)],
)
def test_enough_sets_to_rotate_past_l2(bytes_per_set, l2):
    n = timing.input_sets(bytes_per_set, l2)
    assert n * bytes_per_set >= timing.ROTATE_FACTOR * l2
    assert n * bytes_per_set >= timing.ROTATE_FLOOR
    assert (n - 1) * bytes_per_set < max(timing.ROTATE_FLOOR, timing.ROTATE_FACTOR * l2)  # and no more than that


def test_one_set_when_it_already_streams_past_the_target():
    assert timing.input_sets(2 << 30, H200_L2) == 1
    assert timing.input_sets(0, H200_L2) == timing.MAX_SETS  # an empty set cannot reach it: capped, not a division


def test_sets_are_capped_by_count_and_by_free_memory():
    assert timing.input_sets(4096, H200_L2) == timing.MAX_SETS
    assert timing.input_sets(25 * MB, H200_L2, free_bytes=100 * MB) == 2  # half of 100 MB holds two sets
    assert timing.input_sets(25 * MB, H200_L2, free_bytes=10 * MB) == 1  # never fewer than one


def test_random_copies_are_fresh_random_memory_with_the_same_layout():
    cache = torch.zeros(2, 3, 16, 8)
    k, v = cache[:, :, :10], cache[:, :, 10:]  # views of one buffer, as a KV cache slice would be
    lengths = torch.tensor([10, 7], dtype=torch.int32)
    copy = timing.random_like((k, v, lengths, None, 1e-5))
    for old, new in zip((k, v, lengths), copy, strict=False):
        assert new.shape == old.shape and new.stride() == old.stride() and new.dtype == old.dtype
        assert new.untyped_storage().data_ptr() != old.untyped_storage().data_ptr()
    assert copy[0].untyped_storage().data_ptr() == copy[1].untyped_storage().data_ptr()  # still one buffer
    assert (copy[0] != 0).all() and (copy[1] != 0).all() and copy[0].std() > 0.5
    assert torch.equal(copy[2], lengths)  # lengths stay valid lengths
    assert copy[3:] == (None, 1e-5)
    assert timing.set_bytes(copy) == cache.untyped_storage().nbytes() + lengths.untyped_storage().nbytes()


def test_a_view_of_a_bigger_buffer_copies_only_its_part():
    cache = torch.zeros(12, 1, 4, 32, 8)  # (layers, B, H, T, D): the model's KV cache is one buffer
    k, v = cache[5], cache[6]
    copy = timing.random_like((k, v))
    assert copy[0].untyped_storage().nbytes() == 2 * k.numel() * 4  # layers 5 and 6, not all twelve
    assert timing.set_bytes((k,)) == k.numel() * 4 and timing.set_bytes((k, v)) == 2 * k.numel() * 4
    assert copy[0].data_ptr() % 16 == 0 and copy[1].data_ptr() - copy[0].data_ptr() == v.data_ptr() - k.data_ptr()
    x = torch.arange(10, dtype=torch.int64)[3:]  # offset not a multiple of 16 bytes: kept as it was
    assert torch.equal(timing.random_like((x,))[0], x) and timing.random_like((x,))[0].data_ptr() % 16 == 8


def test_rotated_inputs_are_distinct_sets_from_make_inputs():
    make = lambda: (torch.randn(1024, 1024), torch.randn(1024))  # ~4 MB a set
    sets = timing.rotated_inputs(make, l2_bytes=8 * MB)
    assert len(sets) == timing.input_sets(timing.set_bytes(sets[0]), 8 * MB) > 1
    assert len({s[0].untyped_storage().data_ptr() for s in sets}) == len(sets)
    assert all((s[0] != 0).any() for s in sets)
    assert len(timing.rotated_inputs(make, bytes_per_set=1 << 40, l2_bytes=8 * MB)) == 1


def test_cpu_measure_is_one_labelled_interpreter_call():
    calls = []
    t = timing.measure(lambda x: calls.append(x.shape), lambda: (torch.randn(4, 4),), torch.device("cpu"))
    assert calls == [(4, 4)] and t.regime == timing.CPU_REGIME and t.ms >= 0 and t.sets == 1


class FakeGraph:
    """Records what capture does to a graph; capture_end can be told to fail as an invalidated capture does."""

    def __init__(self, end_fails=False):
        self.log, self.end_fails = [], end_fails

    def capture_begin(self, capture_error_mode="global"):
        self.log.append("begin")
        assert capture_error_mode == "thread_local"  # another thread's CUDA call cannot spoil a timing

    def capture_end(self):
        self.log.append("end")
        if self.end_fails:
            raise RuntimeError("operation failed due to a previous error during capture")

    def reset(self):
        self.log.append("reset")


def test_a_failure_while_capturing_ends_the_capture_and_resets_the_graph():
    def body():
        raise ValueError("block_m=256 does not fit")

    for end_fails in (False, True):
        graph = FakeGraph(end_fails)
        with pytest.raises(timing.CaptureError, match="ValueError: block_m=256") as info:
            timing.capture(body, None, graph)  # stream None: torch.cuda.stream(None) is a no-op on CPU
        assert graph.log == ["begin", "end", "reset"]
        assert isinstance(info.value.__cause__, ValueError)


def test_the_collector_waits_while_capturing_and_resumes_after_even_on_failure():
    """A collection mid-capture could destroy an older graph, which spoils the capture: gc is off inside."""
    import gc

    seen = []
    for fails in (False, True):

        def body(fails=fails):
            seen.append(gc.isenabled())
            if fails:
                raise ValueError("refused")

        with contextlib.suppress(timing.CaptureError):
            timing.capture(body, None, FakeGraph())
        assert gc.isenabled()
    assert seen == [False, False]


def test_a_capture_that_does_not_end_cleanly_is_reset():
    graph = FakeGraph(end_fails=True)
    with pytest.raises(timing.CaptureError, match="did not end cleanly"):
        timing.capture(lambda: None, None, graph)
    assert graph.log == ["begin", "end", "reset"]
    graph = FakeGraph()
    assert timing.capture(lambda: None, None, graph) is graph and graph.log == ["begin", "end"]


def test_pick_uses_the_defaults_on_cpu():
    tuner = autotune.Tuner()
    x = torch.randn(4, 8)
    assert tuner.pick("layer_norm", (4, 8), lambda c, x: x, torch.device("cpu"), inputs=(x,)) is None
    assert tuner.best == {}


def test_pick_skips_refused_candidates_times_copies_and_caches():
    """pick's bookkeeping with the GPU timing faked: each candidate's 'time' is its block_m."""
    x = torch.zeros(4, 8)
    refused = {1: ValueError("too big"), 2: OutOfResources(1, 0, "shared memory"), 4: timing.CaptureError("x")}
    seen, last = [], []

    def run(cfg, x_copy):
        seen.append(x_copy)
        last.append(cfg)
        if cfg.block_m in refused:
            raise refused[cfg.block_m]

    def fake_time(fn, sets, **kwargs):
        fn(*sets[0])
        return timing.Timing(float(last[-1].block_m), timing.COLD_REGIME, len(sets))

    tuner, cuda = autotune.Tuner(time=fake_time, l2_bytes=MB), torch.device("cuda")
    best = tuner.pick("layer_norm", (4, 8), run, cuda, inputs=(x,))
    allowed = [c for c in CANDIDATES["layer_norm"] if c.block_m not in refused]
    assert best == min(allowed, key=lambda c: c.block_m)
    assert all(s is not x and (s != 0).all() for s in seen)  # the caller's zeros were never timed
    assert tuner.choice("layer_norm", (4, 8), cuda).timing.regime == timing.COLD_REGIME
    n = len(seen)
    assert tuner.pick("layer_norm", (4, 8), run, cuda, inputs=(x,)) is best and len(seen) == n  # cached
    assert autotune.choice("layer_norm", (4, 8), cuda) is None  # the launchers' tuner never saw it


def test_pick_falls_back_to_the_defaults_when_every_candidate_is_refused():
    def refuse(fn, sets, **kwargs):
        raise ValueError("no")

    tuner = autotune.Tuner(time=refuse)
    assert tuner.pick("layer_norm", (1, 8), lambda c: None, torch.device("cuda")) is None
    assert tuner.choice("layer_norm", (1, 8), torch.device("cuda")) == autotune.Choice(None, None)


# --- GPU: the timings themselves ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_copy_bandwidth_past_l2_matches_a_plain_large_copy(gpu_alone):
    from triton.testing import do_bench

    n = 1 << 27  # 512 MB of fp32 read and 512 MB written: L2 holds none of it
    make = lambda: (torch.randn(n, device="cuda"), torch.empty(n, device="cuda"))
    # A kernel that copies (x * 1): a plain copy_ is captured as a memcpy node, which a graph runs on a
    # copy engine at ~2.5 TB/s on the H200 instead of the SMs' ~4.2 TB/s, and would compare unlike things.
    scale = lambda src, dst: torch.mul(src, 1.0, out=dst)
    src, dst = make()
    graphed, eager = [], []
    # The best of three alternating measurements of each: the least disturbed one.
    for _ in gpu_alone:
        t = timing.device_time(scale, make)
        assert t.sets == 1 and t.regime == timing.COLD_REGIME
        graphed.append(2 * n * 4 / t.ms / 1e6)
        eager.append(2 * n * 4 / do_bench(lambda: scale(src, dst), warmup=10, rep=50, return_mode="median") / 1e6)
    gbs, eager = max(graphed), max(eager)
    assert 200 < gbs < 10_000, gbs  # a GPU's HBM, not L2 (tens of TB/s) nor a host link
    assert 0.8 < gbs / eager < 1.25, (gbs, eager)  # at 1 GB launch overhead is nothing: the two must agree


@pytest.mark.gpu
def test_rotated_inputs_are_not_faster_than_warm_l2(gpu_alone):
    """Decode attention at B=1, H=12, 8192 keys reads a ~25 MB cache: within an H200's L2 when replayed."""
    from kernels import decode_attention

    def make():
        q = torch.randn(1, 12, 1, 64, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(1, 12, 8192, 64, device="cuda", dtype=torch.float16) for _ in range(2))
        return q, k, v, torch.full((1,), 8192, device="cuda", dtype=torch.int32)

    same = make()
    for _ in gpu_alone:
        cold = timing.device_time(decode_attention, make)
        warm = timing.device_time(lambda: decode_attention(*same))
        if cold.ms >= 0.95 * warm.ms:
            break
    assert cold.regime == timing.COLD_REGIME and cold.sets > 1 and warm.regime == timing.SAME_INPUTS_REGIME
    assert cold.ms >= 0.95 * warm.ms, (cold, warm)


@pytest.mark.gpu
def test_a_failed_capture_leaves_the_stream_clean():
    # Only failures raised from Python: one that CUDA raises itself (a host sync while capturing) leaves
    # the CUDA generator in a capture's bookkeeping, which no reset undoes ("Offset increment outside
    # graph capture"). device_time warms fn up before capturing, so such failures surface there instead.
    def fn(x):
        if torch.cuda.is_current_stream_capturing():
            raise ValueError("refused mid-capture")
        return x * 2

    with pytest.raises(timing.CaptureError):
        timing.device_time(fn, lambda: (torch.randn(1024, device="cuda"),))
    assert not torch.cuda.is_current_stream_capturing()
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    a, b = torch.randn(4, device="cuda"), torch.randn(4, device="cuda")
    assert not torch.equal(a, b)  # the RNG is not left in a capture's bookkeeping
    t = timing.device_time(lambda x: x * 2, lambda: (torch.randn(1024, device="cuda"),))
    assert t.ms > 0


def _kinds():
    """(kind, run, inputs) per autotuned kernel, at the shapes the model decodes and prefills."""
    from kernels import attention, decode_attention, layer_norm, linear

    r = lambda *s: torch.randn(*s, device="cuda", dtype=torch.float16)
    decode = (r(1, 12, 1, 64), r(1, 12, 4096, 64), r(1, 12, 4096, 64), torch.full((1,), 4096, device="cuda"))
    return [
        ("layer_norm", lambda c, x, w, b: layer_norm(x, w, b, config=c), (r(1, 768), r(768), r(768))),
        ("linear", lambda c, x, w, b: linear(x, w, b, config=c), (r(1024, 768), r(3072, 768) / 28, r(3072))),
        ("linear_decode", lambda c, x, w, b: linear(x, w, b, config=c), (r(1, 768), r(3072, 768) / 28, r(3072))),
        ("attention", lambda c, q, k, v: attention(q, k, v, config=c), tuple(r(1, 12, 512, 64) for _ in range(3))),
        ("decode_attention", lambda c, *a: decode_attention(*a, config=c), decode),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(5))
def test_autotune_picks_a_valid_config_per_kernel_and_caches_it(case):
    kind, run, inputs = _kinds()[case]
    tuner, device = autotune.Tuner(), torch.device("cuda")
    best = tuner.pick(kind, ("test",), run, device, inputs=inputs)
    assert isinstance(best, TileConfig) and best in CANDIDATES[kind]
    assert tuner.choice(kind, ("test",), device).timing.ms > 0
    run(best, *inputs)  # the winner runs on the caller's tensors

    def no_timing(*a, **k):
        raise AssertionError("a cached pick must not time again")

    tuner.time = no_timing
    assert tuner.pick(kind, ("test",), run, device, inputs=inputs) is best
    # Timed without inputs (the launchers' current closures): the same graph method, labelled as warm.
    tuner = autotune.Tuner()
    assert tuner.pick(kind, ("closure",), lambda c: run(c, *inputs), device) in CANDIDATES[kind]
    assert tuner.choice(kind, ("closure",), device).timing.regime == timing.SAME_INPUTS_REGIME


@pytest.mark.gpu
def test_cold_timings_are_steady():
    make = lambda: (torch.randn(1 << 22, device="cuda"),)
    runs = [timing.device_ms(lambda x: x.sum(), make) for _ in range(3)]
    assert max(runs) < 1.5 * statistics.median(runs), runs


def test_the_kernel_benchmark_table_names_its_regimes():
    from kernels import bench

    row = dict(
        kernel="decode attention",
        shape="B=1 cache=8192",
        l2="cold",
        sets=11,
        ours_ms=0.0129,
        torch_ms=0.02,
        ours_rate=1950.0,
        torch_rate=1250.0,
        unit="GB/s",
        ratio=1.55,
        eager_ratio=1.2,
    )
    assert bench.HEADER.splitlines()[0].count("|") == bench._format_row(row).count("|")
    assert timing.COLD_REGIME in bench.REGIMES and "launch overhead included" in bench.REGIMES
