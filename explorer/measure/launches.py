"""GPU kernels and memory operations per decode step, counted by torch.profiler (CUPTI), not booked.

A step's count is the difference between two otherwise identical generations, one decode step apart:
whatever a decode step launches (the model's kernels, the sampler's, the token copied back, the cache
lengths advanced; or one graph replay's kernels) is in it, and nothing of the prefill or warm-up is.
CUPTI reports each kernel of a replayed CUDA graph, so a graph step counts the kernels it replays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..model.generate import generate


@dataclass(frozen=True)
class StepLaunches:
    kernels: int  # GPU kernels the step ran
    memory_ops: int  # copies and fills (memcpy, memset)
    graph: bool  # whether they were replayed from a CUDA graph

    @property
    def total(self) -> int:
        return self.kernels + self.memory_ops


def device_activity(fn) -> tuple[int, int]:
    """(kernels, memory operations) the device ran during fn(), counted by torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = memory = 0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        name = event.name.lower()
        if name.startswith(("memcpy", "memset")):
            memory += 1
        else:
            kernels += 1
    return kernels, memory


def decode_step_launches(model, prompt_ids, *, cache: bool = True, graph: bool | None = None, **kw) -> StepLaunches:
    """What one decode step launches with these settings (GPU only): a 3-token generation less a
    2-token one. Both run once first, so nothing counted compiles, and with a graph each captures its
    own (the lengths differ) and keeps it with the model (explorer.model.graphs.GraphPool): the counted
    runs replay without capturing. Where nothing is kept (ZeroGPU), both counted runs capture, alike."""
    if model.device.type != "cuda":
        raise ValueError("kernel launches are counted on a GPU; the interpreter launches none")

    def run(n):
        return lambda: list(
            generate(model, prompt_ids, max_new_tokens=n, cache=cache, graph=graph, warmup=False, eos_token_id=-1, **kw)
        )

    run(3)()  # compile and autotune outside the counts
    run(2)()
    k3, m3 = device_activity(run(3))
    k2, m2 = device_activity(run(2))
    replayed = bool(graph) or (graph is None and cache)
    return StepLaunches(k3 - k2, m3 - m2, replayed)
