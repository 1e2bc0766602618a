"""The Llama-family decoder against transformers' LlamaForCausalLM on small random checkpoints saved to disk and
loaded through explorer.model.weights: grouped-query heads (6 over 2), rotary positions, RMSNorm, SwiGLU with a
feed-forward width that is no power of two, tied and untied heads."""

import json
import math
import re

import pytest
import torch

from explorer.model.cache import KVCache
from explorer.model.generate import generate
from explorer.model.weights import load_model
from tests.test_model import (
    check_half_precision_logits,
    check_long_generations,
    check_prefill_on_torch,
    max_rel_err,
    small_tokenizer,
)

TOL = 1e-4  # fp32 in the interpreter and on the GPU, as for GPT-2 (test_model)


def _save(folder, tie: bool, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    fast = small_tokenizer()
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=96,
        intermediate_size=200,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=96,
        rope_theta=100000.0,
        tie_word_embeddings=tie,
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
    )
    hf = LlamaForCausalLM(cfg).eval()
    for p in hf.parameters():  # transformers starts RMSNorm weights at 1: random ones test that they are read
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5)
    hf.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder, hf


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("random-llama"), tie=True, seed=4321)


def hf_greedy(hf, prompt, n):
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_logits_match_transformers(checkpoint, backend, device):
    folder, hf = checkpoint
    model, _ = load_model(folder, backend=backend, device=device)
    ids = torch.randint(0, hf.config.vocab_size, (2, 45))
    assert max_rel_err(model(ids.to(device)).cpu(), hf(ids).logits) <= TOL


def test_a_prefill_on_the_torch_backend_feeds_our_decode_steps(checkpoint, device):
    """The profiling pass's rebuilt cache (test_model's check): rotary keys and grouped heads written by PyTorch's
    prefill, read by our decode steps."""
    check_prefill_on_torch(*checkpoint, hf_greedy, device)


def test_an_untied_head_is_its_own_matrix(tmp_path, device):
    folder, hf = _save(tmp_path, tie=False, seed=99)
    model, _ = load_model(folder, device=device)
    assert model.lm_head is not None
    ids = torch.randint(0, hf.config.vocab_size, (1, 17))
    assert max_rel_err(model(ids.to(device)).cpu(), hf(ids).logits) <= TOL


@pytest.mark.parametrize(
    "backend,fusion", [("torch", "epilogue"), ("triton", "none"), ("triton", "decode"), ("triton", "megakernel")]
)
def test_cached_prefill_and_decode_logits_match_transformers(checkpoint, backend, fusion, device):
    folder, hf = checkpoint
    model, _ = load_model(folder, backend=backend, device=device)
    model = model.with_fusion(fusion)
    ids = torch.randint(0, hf.config.vocab_size, (2, 24))
    ref = hf(ids).logits
    ids = ids.to(device)
    cache = KVCache.for_model(model, 2, 30)
    assert cache.k.shape[2] == 2  # the cache holds the key/value heads only
    logits = model.prefill(ids[:, :17], cache, [17, 17])
    assert max_rel_err(logits.cpu(), ref[:, 16]) <= TOL
    for t in range(17, 24):
        assert max_rel_err(model.decode(ids[:, t], cache).cpu(), ref[:, t]) <= TOL
    assert cache.host_lengths == [24, 24]


@pytest.mark.parametrize("cache,fusion", [(True, "overlap"), (False, "overlap"), (True, "megakernel")])
def test_greedy_generation_matches_transformers(checkpoint, cache, fusion, device):
    folder, hf = checkpoint
    model, tok = load_model(folder, device=device)
    prompt = torch.randint(0, hf.config.vocab_size, (7,)).tolist()
    expected = hf_greedy(hf, prompt, 12)
    kw = dict(cache=cache, eos_token_id=-1, tokenizer=tok, fusion=fusion)
    steps = list(generate(model, prompt, max_new_tokens=12, **kw))
    assert [s.token_id for s in steps] == expected
    assert "".join(s.text for s in steps) == tok.decode(expected)


def test_batch_of_unequal_prompts_matches_each_alone(checkpoint, device):
    folder, hf = checkpoint
    model, _ = load_model(folder, device=device)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,)).tolist() for n in (3, 11, 6)]
    steps = list(generate(model, prompts, max_new_tokens=8, eos_token_id=-1))
    for b, prompt in enumerate(prompts):
        assert [s.token_ids[b] for s in steps] == hf_greedy(hf, prompt, 8), f"sequence {b}"


def test_grouped_heads_shrink_the_cache_and_the_measure_layer_books_every_operation(checkpoint, device):
    from explorer.measure.traffic import step_traffic

    folder, _ = checkpoint
    model, _ = load_model(folder, device=device)
    steps = list(generate(model, [[1, 2, 3]], max_new_tokens=3, eos_token_id=-1, warmup=False))
    per_token = 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 key/value heads of 16 dims, fp32: a third of 6 heads'
    assert steps[1].kv_used_bytes - steps[0].kv_used_bytes == per_token
    assert {"rms_norm", "rotary", "swiglu", "grouped_attention", "token_embedding"} <= {
        op.kernel for op in steps[0].ops
    }
    # The decode rung (the default): RMSNorm, rotary, the cache write and SwiGLU ride in the projections.
    assert {op.kernel for op in steps[1].ops} == {"decode_linear", "grouped_decode_attention", "token_embedding"}
    prefill = step_traffic(steps[0])
    decode = step_traffic(steps[1])
    assert {"layer_norm", "rotary", "ffn", "attention", "embedding"} <= set(prefill)
    assert "decode attention" in decode and all(t.bytes_read > 0 for t in decode.values())


def test_what_the_kernels_do_not_run_is_refused_by_name(tmp_path):
    from transformers import LlamaConfig

    from explorer.model.weights import config_from_hf

    base = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=96)
    with pytest.raises(ValueError, match="biases in its projections"):
        config_from_hf(LlamaConfig(attention_bias=True, **base))
    with pytest.raises(ValueError, match="rotary scaling 'linear'"):
        config_from_hf(LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}, **base))
    with pytest.raises(ValueError, match="activation 'gelu'"):
        config_from_hf(LlamaConfig(hidden_act="gelu", **base))
    assert config_from_hf(LlamaConfig(**base)).n_kv_head == 2


def test_the_generate_job_charts_a_llama_run(checkpoint):
    """The page's Generate job on a Llama-family checkpoint: its text, and every chart it draws for GPT-2."""
    from explorer.app import jobs, settings

    folder, _ = checkpoint
    s = settings.RunSettings(model=str(folder), prompt="the quick", new_tokens=3, dtype="float32")
    updates = list(jobs.JOBS["generate"]({"settings": s}, jobs.Control(lambda: False, float("inf"))))
    text = [u["text"] for u in updates if "text" in u][-1]
    last = updates[-1]
    assert text.startswith("the") and len(text) > len("the quick")  # the small tokenizer keeps its Ġ markers
    assert list(last["state"]["steps"].step) == [0, 1, 2]
    assert {"latency", "traffic", "kv", "share", "bandwidth", "hierarchy", "roofline"} <= set(last)
    assert '"rotary"' in last["traffic"] and "null" not in last["share"]  # its own category, with its colour
    # The KV chart says why it grows as it does: 2 x 2 layers x 2 KV heads x 16 dims x 4 bytes = 512 bytes a token
    title = " ".join(re.sub(r"</?sup>|<br>", " ", json.loads(last["kv"])["layout"]["title"]["text"]).split())
    assert "2 layers × 2 KV heads × 16 dims × 4 B = 0.5 KB; 6 query heads share them, 3× less" in title


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_half_precision_logits_match_transformers(checkpoint, device, dtype, backend):
    """As for GPT-2, with the same bound: relative to the largest logit, a few 2^-8 per layer in bf16."""
    check_half_precision_logits(checkpoint, device, dtype, backend)


@pytest.mark.gpu
def test_smollm2_shaped_model_generates_256_tokens_cache_on_and_off(device):
    """Random weights of SmolLM2-135M's shape in bf16 (30 layers, 9 query heads over 3, SwiGLU 1536), both backends
    and every rung, cache on and off, each token checked against transformers in float32 teacher-forced on the
    run's own tokens, within GPT-2's bf16 margin (test_model.check_long_generations)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from explorer.model.weights import config_from_hf, from_hf_state_dict

    torch.manual_seed(0)
    shape = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9)
    cfg = LlamaConfig(
        vocab_size=49152, num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0, **shape
    )
    hf = LlamaForCausalLM(cfg).eval()
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device=device, dtype=torch.bfloat16)
    check_long_generations(model, hf.to(device), device)


def test_the_ladder_and_compare_jobs_run_a_llama(checkpoint):
    """The page's ladder and Compare on a Llama checkpoint: every rung measured (the persistent rung as overlap, said
    in the status; the megakernel rung's step in one launch), and Compare's runs, each prompt length with the cache
    on and off."""
    from explorer.app import jobs, settings

    never = jobs.Control(lambda: False, float("inf"))
    s = settings.RunSettings(model=str(checkpoint[0]), prompt="the quick", new_tokens=2, dtype="float32")
    out = {}
    for update in jobs.JOBS["ladder"]({"settings": s, "context": 9}, never):
        out |= update
    ladder = out["state"]["ladder"].set_index("rung")
    assert list(ladder.index) == ["none", "epilogue", "decode", "overlap", "persistent", "megakernel", "torch"]
    ops = ladder.operations
    assert ops["none"] > ops["epilogue"] > ops["decode"] == ops["overlap"] == ops["persistent"] > ops["megakernel"] == 1
    assert "a Llama model runs the persistent rung as overlap" in out["status"]
    out = {}
    for update in jobs.JOBS["compare"]({"settings": s, "lengths": [5]}, never):
        out |= update
    runs = out["state"]["compare"]
    assert set(zip(runs.prompt_tokens, runs.cache, strict=True)) == {(5, "on"), (5, "off")}
    assert (runs[runs.cache == "on"].kv_used_mb > 0).all() and (runs[runs.cache == "off"].kv_used_mb == 0).all()


@pytest.mark.parametrize(
    "kernel,shape,grid",
    [
        ("rms_norm", dict(M=17, C=96), dict(block_m=[1, 4], num_warps=[1])),
        ("swiglu", dict(M=5, K=96, F=100), dict(block_m=[16], block_n=[32], block_k=[32, 64], num_stages=[1])),
        ("grouped_decode_attention", dict(B=2, H=6, KV=2, T=40, D=32), dict(block_n=[16, 32], split_k=[1, 2])),
    ],
)
def test_the_tile_sweep_runs_the_llama_familys_kernels(kernel, shape, grid, device):
    """Each config timed and booked with its traffic model; the sweep's inputs are the kernels' own checks'."""
    from explorer.measure.sweeps import tile_sweep

    frame = tile_sweep(kernel, shape, dtype=torch.float32, device=device, grid=grid)
    assert len(frame) == math.prod(len(v) for v in grid.values())
    assert frame.valid.all() and (frame.ms > 0).all() and (frame.modeled_mb > 0).all(), frame.reason.tolist()


def test_the_sweep_handler_takes_grouped_heads_and_refuses_uneven_groups():
    from explorer.app import handlers, models
    from explorer.app.runner import InlineRunner
    from tests.test_jobs import collect

    job = handlers.make(handlers.Context(InlineRunner(), device=models.device().type))["sweep"]
    values = dict(kernel="grouped_decode_attention", dtype="float32", x="block_n", y="split_k", value="ms")
    with pytest.raises(Exception, match="H=6 query heads cannot share KV=4 key/value heads evenly"):
        collect(job(values | {"shape": "B=1,H=6,KV=4,T=40,D=32"}, handlers.NEW_STATE))
    views = collect(job(values | {"shape": "B=1,H=6,KV=2,T=40,D=32"}, handlers.NEW_STATE))
    assert "Fastest valid" in views[-1][2]  # the best config's line, after every config ran
