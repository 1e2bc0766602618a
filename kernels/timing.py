"""Device time of a short GPU function, free of Python launch overhead.

Small kernels (a few microseconds) launched from Python are timed mostly as launch overhead by any
host-driven loop, do_bench included. Capturing `reps` calls in a CUDA graph and timing its replays
with events leaves only the device's own time per call.
"""

import statistics

import torch


def device_ms(fn, reps: int = 50, samples: int = 15) -> float:
    """Median ms of one fn() call, timed as replays of a CUDA graph that holds `reps` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on the capture stream: compilation, cuBLAS handles, workspaces
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(reps):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return statistics.median(times)
