"""Kernels per decode step are counted by torch.profiler, not booked: on CPU there is nothing to count,
and on a GPU the count equals a profile of exactly one decode step, taken here by hand."""

import pytest
import torch

from explorer.measure.launches import decode_step_launches, device_activity
from explorer.model.cache import KVCache
from explorer.model.graphs import DecodeGraph
from tests.test_graphs import random_model


def test_counting_needs_a_gpu(device):
    if device.type == "cuda":
        pytest.skip("CPU behaviour")
    with pytest.raises(ValueError, match="counted on a GPU"):
        decode_step_launches(random_model(device), [1, 2, 3])


@pytest.mark.gpu
@pytest.mark.parametrize(
    "backend,fusion",
    [
        ("triton", "none"),
        ("triton", "epilogue"),
        ("triton", "decode"),
        ("triton", "overlap"),
        ("triton", "persistent"),
        ("triton", "megakernel"),
        ("torch", "epilogue"),
    ],
)
@pytest.mark.parametrize("graph", [False, True])
def test_one_decode_step_launches_what_the_profiler_sees(backend, fusion, graph, device):
    model = random_model(device, torch.float16, n_layer=3).with_fusion(fusion)
    prompt = [5, 6, 7, 8]
    counted = decode_step_launches(model, prompt, graph=graph, backend=backend)
    assert counted.graph is graph

    # By hand: a cache holding the prompt, then one step as generate runs it: the forward pass (or the
    # replay, after copying the fed token into the graph's input), the sampler, the token copied back.
    cache = KVCache.for_model(model, 1, len(prompt) + 3)
    ids = torch.tensor([prompt], device=device)
    logits = model.prefill(ids, cache, [len(prompt)], backend=backend)
    fed = logits.argmax(dim=-1)
    if graph:
        g = DecodeGraph(model, cache, backend=backend)
        step = lambda: g.step(fed)
    else:
        step = lambda: model.decode(fed, cache, backend=backend)
    step()  # warm: compile, allocate
    host = torch.empty(1, dtype=torch.long, pin_memory=True)

    def one_step():
        host.copy_(step().argmax(dim=-1), non_blocking=True)

    kernels, memory = device_activity(one_step)
    assert (counted.kernels, counted.memory_ops) == (kernels, memory)
    # Every layer launches at least its four projections and the attention (the decode rung 5), but the
    # persistent rung, which runs a layer in one launch (the megakernel rung's one launch: test_model).
    if fusion != "megakernel":
        assert counted.kernels >= (1 if fusion == "persistent" else 5) * 3
