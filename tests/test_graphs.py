"""Decode steps replayed from a CUDA graph give exactly what eager steps give, and the profiling pass
times kernels on the device rather than their launches."""

import pytest
import torch

from explorer.measure.clock import timed
from explorer.measure.profile import profile_run
from explorer.measure.traffic import step_traffic
from explorer.model import graphs
from explorer.model.generate import generate
from explorer.model.graphs import GraphPool
from explorer.model.weights import config_from_hf, from_hf_state_dict

BACKENDS = ["torch", "triton"]
RUNS = [  # (backend, fusion): the torch backend, and the Triton backend on every rung of the fusion ladder
    ("torch", "epilogue"),
    ("triton", "none"),
    ("triton", "epilogue"),
    ("triton", "decode"),
    ("triton", "overlap"),
    ("triton", "persistent"),
    ("triton", "megakernel"),
]


def random_model(device, dtype=torch.float32, n_positions=64, n_layer=2, n_embd=64, n_head=4, vocab=97):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    cfg = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions, vocab_size=vocab)
    hf = GPT2LMHeadModel(cfg).eval()
    return from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device=device, dtype=dtype)


def test_graph_needs_a_gpu_and_the_cache(device):
    model = random_model(device)
    if device.type != "cuda":
        with pytest.raises(ValueError, match="CUDA graphs need a CUDA GPU"):
            next(generate(model, [1, 2, 3], max_new_tokens=2, graph=True, warmup=False))
        steps = list(generate(model, [1, 2, 3], max_new_tokens=3, warmup=False))  # the default falls back to eager
        assert not any(s.graph for s in steps)
    with pytest.raises(ValueError, match="KV cache on"):
        next(generate(model, [1, 2, 3], max_new_tokens=2, cache=False, graph=True, warmup=False))


@pytest.mark.gpu
@pytest.mark.parametrize("backend,fusion", RUNS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy, picked in the graph", "sampled"])
def test_graph_replays_equal_eager_steps(backend, fusion, dtype, temperature, device):
    """Same kernels, same inputs: the tokens of a batch of unequal prompts, the modeled traffic and the
    cache bookkeeping of every step are identical with and without the graph, on every rung (the decode
    rung's launches finish their own reductions through arrival counters, which every replay must find
    at zero). Greedy graphs pick each token inside the replay and feed it to the next one."""
    model = random_model(device, dtype).with_fusion(fusion)
    prompts = [[5, 6, 7], list(range(1, 18)), [9]]
    kw = dict(max_new_tokens=40, backend=backend, eos_token_id=-1, temperature=temperature, top_k=20, seed=3)
    eager = list(generate(model, prompts, graph=False, **kw))
    graphed = list(timed(model, prompts, graph=True, **kw))
    assert [s.graph for s in graphed] == [False] + [True] * 39
    assert [s.token_ids for s in graphed] == [s.token_ids for s in eager]
    for g, e in zip(graphed, eager, strict=True):
        assert step_traffic(g) == step_traffic(e) and [op.name for op in g.ops] == [op.name for op in e.ops]
        assert (g.positions, g.kv_used_bytes, g.context_tokens) == (e.positions, e.kv_used_bytes, e.context_tokens)
    assert graphed[1].warmup_ms > 0  # the capture, reported with the warm-up


@pytest.mark.gpu
def test_the_collector_waits_while_a_decode_graph_is_captured(device):
    """A model dropped with its pooled graphs is a reference cycle (model -> pool -> graph -> model). Were the
    collector to free it while another graph is captured, destroying its graph would spoil that capture."""
    import gc
    import weakref

    old = random_model(device, torch.float16)
    list(generate(old, [[5, 6, 7]], max_new_tokens=3, graph=True, warmup=False))
    gone = weakref.ref(old)
    del old
    model, capturing = random_model(device, torch.float16), []

    def started(phase, info):  # gc's own hook: for each collection, whether a graph was being captured then
        if phase == "start":
            capturing.append(torch.cuda.is_current_stream_capturing())

    threshold = gc.get_threshold()
    gc.callbacks.append(started)
    gc.set_threshold(1)  # a collection at nearly every allocation, wherever the collector is enabled
    try:
        steps = list(generate(model, [[5, 6, 7], [9]], max_new_tokens=4, graph=True, warmup=False))
    finally:
        gc.callbacks.remove(started)
        gc.set_threshold(*threshold)
    assert any(s.graph for s in steps)
    assert capturing and not any(capturing)  # collections ran, none while a graph was captured
    assert gc.isenabled()
    gc.collect()
    assert gone() is None


def test_the_pool_lends_each_graph_to_one_generation_and_keeps_the_newest():
    pool = GraphPool()
    pool.give("a", 1)
    assert pool.take("a") == 1 and pool.take("a") is None  # lent out: a second generation captures its own
    for key in "abc":
        pool.give(key, key)
    assert list(pool.entries) == list("abc"[-graphs.KEEP :])


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_kept_graph_replays_for_the_next_generation_of_the_same_shape(temperature, device):
    """The second generation of the same shape captures nothing and still matches eager steps, though the
    cache it inherits held another prompt's keys; a third of another length captures its own."""
    model = random_model(device, torch.float16)
    kw = dict(max_new_tokens=30, eos_token_id=-1, temperature=temperature, top_k=20, seed=5)
    first = list(timed(model, [[5, 6, 7], [8, 9]], graph=True, **kw))
    second = list(timed(model, [[1, 2], [3, 4, 5]], graph=True, **kw))
    eager = list(generate(model, [[1, 2], [3, 4, 5]], graph=False, **kw))
    assert first[1].warmup_ms > 0 and second[1].warmup_ms == 0  # captured once, then replayed
    assert [s.token_ids for s in second] == [s.token_ids for s in eager]
    other = list(timed(model, [[1, 2], [3, 4, 5]], graph=True, **(kw | dict(max_new_tokens=31))))
    assert other[1].warmup_ms > 0 and [s.token_ids for s in other[:30]] == [s.token_ids for s in eager]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_stops_at_the_position_limit(backend, device):
    model = random_model(device, torch.float16, n_positions=24)
    kw = dict(max_new_tokens=100, backend=backend, eos_token_id=-1)
    steps = list(generate(model, list(range(1, 11)), graph=True, **kw))
    eager = list(generate(model, list(range(1, 11)), graph=False, **kw))
    assert steps[-1].stop_reason.startswith("reached the model's position limit") and steps[-1].graph
    assert [s.token_ids for s in steps] == [s.token_ids for s in eager]


@pytest.mark.gpu
def test_profiling_times_the_device_not_the_launches(device, gpu_alone):
    """GPT-2-small-shaped layers launch ~14 operations each, and their launches take longer on the host
    than their kernels on the device. The profiled device time of a decode step must come out near the
    step replayed from a graph (device time only), far below the eager step that pays every launch."""
    model = random_model(device, torch.bfloat16, n_positions=256, n_layer=6, n_embd=768, n_head=12, vocab=4096)
    prompt = list(range(1, 33))
    for _ in gpu_alone:
        graphed = list(timed(model, prompt, max_new_tokens=24, eos_token_id=-1, graph=True))
        replay_ms = sorted(s.latency_ms for s in graphed[4:])[len(graphed[4:]) // 2]
        prof = profile_run(model, [prompt], graphed, cache=True, samples=3)
        decode = prof[prof.phase == "decode"]
        per_step = decode.groupby("step")[["kernel_ms", "launch_ms"]].sum()
        device_ms, launch_ms = per_step.kernel_ms.median(), per_step.launch_ms.median()
        if device_ms < 1.5 * replay_ms + 0.05:
            break
    assert sorted(set(decode.step)) == [1, 12, 23]  # the run's first, middle and last decode steps
    assert set(decode[decode.step == 1].op) == {op.name for op in graphed[1].ops}
    assert (decode.kernel_ms > 0).all()
    assert device_ms < 1.5 * replay_ms + 0.05, (device_ms, replay_ms, launch_ms)
