"""Device time of a short GPU function, free of Python launch overhead and of a warm L2: the one method that
the benchmarks (kernels.bench), the autotuner and the tile sweeps share.

Small kernels (a few microseconds) launched from Python are timed mostly as launch overhead by any
host-driven loop, do_bench included. Capturing the calls in a CUDA graph and timing its replays with
events leaves only the device's own time per call.

Replaying the same inputs every call times a warm L2 instead: decode attention at B=1, H=12, 8192 keys
measured 8.8 us that way and 12.9 us with inputs rotated past L2, and a real decode step streams ~250 MB,
far past any L2. So the graph calls fn once per input set, over enough random sets that together they
exceed the L2 several times (ROTATE_FACTOR, ROTATE_FLOOR) and each call reads from memory, as in a model.
A number timed otherwise carries its own label (WARM_REGIME, SAME_INPUTS_REGIME, CPU_REGIME).
"""

import contextlib
import gc
import statistics
import sys
import time
from dataclasses import dataclass

import torch

COLD_REGIME = "device time: CUDA-graph replays, inputs rotated past L2 (cold L2)"
WARM_REGIME = "device time: CUDA-graph replays, rotated inputs fit in L2 (warm L2)"
SAME_INPUTS_REGIME = "device time: CUDA-graph replays, the same inputs every call (warm L2 where they fit)"
CPU_REGIME = "CPU: Triton interpreter wall time of one call (perf_counter), not GPU time"

ROTATE_FACTOR = 4  # the working set of all sets together, in L2 sizes: LRU-ish caches keep little of it
ROTATE_FLOOR = 256 << 20  # more than the H200's 60 MB of L2 (and any other GPU's) even where L2 is misreported
MAX_SETS = 64  # a graph of a few dozen calls is enough; more only costs capture time and memory
MEMORY_FRACTION = 0.5  # of the free device memory, at most, for all the copies together


def require_cuda(what: str) -> None:
    """For a script that times compiled kernels: without a CUDA GPU, say so in one line and exit 2."""
    if not torch.cuda.is_available():
        print(f"{what} needs a CUDA GPU: it times compiled kernels, and torch sees no GPU here.", file=sys.stderr)
        raise SystemExit(2)


class CaptureError(RuntimeError):
    """fn failed while being captured; the capture was ended and the graph reset, so the stream is clean."""


@dataclass(frozen=True)
class Timing:
    ms: float  # median per call
    regime: str  # one of the *_REGIME labels: show it next to the number
    sets: int = 1  # input sets the calls rotated through
    working_set_bytes: int = 0  # all the sets together


def input_sets(bytes_per_set: int, l2_bytes: int, free_bytes: int | None = None) -> int:
    """How many input sets to rotate through so that together they exceed the L2 ROTATE_FACTOR times.
    At least 1 (a set bigger than the target already streams past L2 on its own), at most MAX_SETS, and
    never more than MEMORY_FRACTION of free_bytes."""
    bytes_per_set = max(1, int(bytes_per_set))
    target = max(ROTATE_FLOOR, ROTATE_FACTOR * int(l2_bytes))
    n = min(-(-target // bytes_per_set), MAX_SETS)
    if free_bytes is not None:
        n = min(n, int(free_bytes * MEMORY_FRACTION) // bytes_per_set)
    return max(1, n)


def set_bytes(inputs) -> int:
    """Bytes of memory one input set addresses; tensors that share a storage count the span they cover once."""
    return sum(hi - lo for lo, hi in _spans(inputs).values())


def random_like(inputs) -> tuple:
    """A new set like `inputs`: same shapes, strides, alignment and storage sharing, in fresh memory. Only the
    part of a storage that the tensors address is made (one layer's view of a whole-model KV cache copies
    that layer). Floating storages are filled with randn (never zeros, which some units compress or skip);
    the others (lengths, indices) are copied so that they stay valid; a storage takes the kind of its first
    tensor. Anything not a tensor (None, flags) is passed through."""
    spans, bases = _spans(inputs), {}

    def copy(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.numel() == 0:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        key = t.untyped_storage().data_ptr()
        lo, hi = spans[key]
        if key not in bases:
            raw = torch.empty(hi - lo, dtype=torch.uint8, device=t.device)
            if t.is_floating_point():
                n = (hi - lo) // t.element_size()
                torch.empty(0, dtype=t.dtype, device=t.device).set_(raw.untyped_storage(), 0, (n,), (1,)).normal_()
            else:
                raw.copy_(torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage(), lo, (hi - lo,)))
            bases[key] = raw.untyped_storage()
        offset = (t.storage_offset() * t.element_size() - lo) // t.element_size()
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(bases[key], offset, t.size(), t.stride())

    return tuple(copy(t) for t in inputs)


def rotated_inputs(make_inputs, *, bytes_per_set: int | None = None, l2_bytes: int | None = None) -> list[tuple]:
    """Enough sets from make_inputs() (each call returns fresh random tensors) to rotate past L2; see
    input_sets. A sweep makes them once and passes the list to every config's device_time."""
    first = tuple(make_inputs())
    per_set = bytes_per_set or set_bytes(first)
    device = next((t.device for t in _tensors(first)), torch.device("cpu"))
    free = None
    if device.type == "cuda":
        l2_bytes = l2_bytes if l2_bytes is not None else torch.cuda.get_device_properties(device).L2_cache_size
        free = torch.cuda.mem_get_info(device)[0]
    if l2_bytes is None:
        raise ValueError("rotated_inputs: l2_bytes is needed for inputs that are not on a CUDA device")
    n = input_sets(per_set, l2_bytes, free)
    return [first, *(tuple(make_inputs()) for _ in range(n - 1))]


def device_time(fn, inputs=None, *, bytes_per_set: int | None = None, reps: int = 20, samples: int = 15) -> Timing:
    """Median ms of one fn(*inputs) call: replays of a CUDA graph that calls fn once per input set, in order,
    round after round, at least `reps` calls in all.

    inputs: a make_inputs() returning one fresh random set (the sets are made here, see rotated_inputs),
    or a list of sets already made; None times fn() on whatever it closes over, labelled SAME_INPUTS_REGIME.
    (triton.testing.do_bench_cudagraph replays one call on one set of inputs, which stay in L2 between replays;
    rotating the sets needs them inside the graph, hence this.)
    """
    if inputs is None:
        sets, per_set = [()], 0
    else:
        sets = rotated_inputs(inputs, bytes_per_set=bytes_per_set) if callable(inputs) else list(inputs)
        per_set = bytes_per_set or set_bytes(sets[0])
    calls = len(sets) * -(-reps // len(sets))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the sets were made on the current stream
    with torch.cuda.stream(stream):  # warm up on the capture stream: compilation, cuBLAS handles, workspaces
        fn(*sets[0])
        for s in sets:
            fn(*s)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()

    def body():  # a plain loop: each output is freed before the next call, so the graph's pool reuses it
        for i in range(calls):
            fn(*sets[i % len(sets)])

    graph = capture(body, stream)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    working = len(sets) * per_set
    if inputs is None:
        regime = SAME_INPUTS_REGIME
    else:
        device = next((t.device for t in _tensors(sets[0])), torch.device("cuda", torch.cuda.current_device()))
        l2 = torch.cuda.get_device_properties(device).L2_cache_size
        regime = COLD_REGIME if working > l2 else WARM_REGIME
    return Timing(statistics.median(times), regime, len(sets), working)


def device_ms(fn, inputs=None, **kwargs) -> float:
    """device_time(...).ms, for callers that only want the number (they should still show its regime)."""
    return device_time(fn, inputs, **kwargs).ms


def measure(fn, inputs, device, *, bytes_per_set: int | None = None, reps: int = 20) -> Timing:
    """device_time on a GPU; in the CPU interpreter, the perf_counter wall time of one fn(*inputs[0]) call
    (the interpreter has nothing to compile and is slow, so one call), labelled CPU_REGIME."""
    if torch.device(device).type == "cuda":
        return device_time(fn, inputs, bytes_per_set=bytes_per_set, reps=reps)
    first = tuple(inputs()) if callable(inputs) else tuple(inputs[0])
    t0 = time.perf_counter()
    fn(*first)
    return Timing((time.perf_counter() - t0) * 1e3, CPU_REGIME, 1, set_bytes(first))


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector held off for the block: run during a capture, it may free an older
    CUDA graph, and destroying a graph is a call a capturing thread may not make, so the capture would be
    spoiled ("operation failed due to a previous error during capture") at a moment no test can choose."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def capture(body, stream, graph=None):
    """A CUDA graph of body() captured on `stream`. If body or the capture fails, the capture is ended and
    the graph reset before CaptureError is raised, so neither the stream nor the allocator stays in capture
    mode and the next candidate starts clean (torch.cuda.graph leaves the stream context entered when
    capture_end raises)."""
    graph = graph if graph is not None else torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), collector_paused():
        graph.capture_begin(capture_error_mode="thread_local")  # other threads' CUDA calls cannot spoil it
        try:
            body()
        except Exception as e:
            with contextlib.suppress(RuntimeError):  # raises when the failure already invalidated the capture
                graph.capture_end()
            _reset(graph)
            raise CaptureError(f"failed while capturing: {type(e).__name__}: {e}") from e
        try:
            graph.capture_end()
        except RuntimeError as e:
            _reset(graph)
            raise CaptureError(f"capture did not end cleanly: {e}") from e
    return graph


def _reset(graph):
    with contextlib.suppress(RuntimeError):
        graph.reset()


def _spans(inputs) -> dict[int, tuple[int, int]]:
    """Per storage, the bytes [lo, hi) its tensors address. lo is rounded down to 16 bytes so that a copy
    keeps every view's alignment, which Triton specialises its kernels on."""
    spans = {}
    for t in _tensors(inputs):
        if t.numel() == 0:
            continue
        start = t.storage_offset() * t.element_size()
        end = start + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))) * t.element_size()
        key = t.untyped_storage().data_ptr()
        lo, hi = spans.get(key, (start, end))
        spans[key] = (min(lo, start) // 16 * 16, max(hi, end))
    return spans


def _tensors(inputs):
    return [t for t in inputs if isinstance(t, torch.Tensor)]
