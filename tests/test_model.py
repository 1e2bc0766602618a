"""The decoder against transformers' GPT-2 on a small random checkpoint saved to disk and loaded
through explorer.model.weights, like any other checkpoint."""

import pytest
import torch

from explorer.model.cache import KVCache
from explorer.model.generate import generate
from explorer.model.ops import DECODE_RUNGS
from explorer.model.weights import load_model
from tests.test_graphs import RUNS

BACKENDS = ["torch", "triton"]
# RUNS (backend, fusion): the torch backend, and the Triton backend on every rung of the fusion ladder.
# The overlap rung differs from decode only where a GPU has programmatic dependent launch: on CPU it would
# repeat the decode rung's run exactly, so it runs on a GPU only.
RUN_PARAMS = [pytest.param(*run, marks=pytest.mark.gpu) if run[1] == "overlap" else run for run in RUNS]


def max_rel_err(actual, expected):
    return ((actual.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


def small_tokenizer():
    """A byte-level BPE of 300 tokens, trained here, GPT-2's kind (the checkpoints' own cannot be downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("random-gpt2")
    fast = small_tokenizer()
    torch.manual_seed(1234)
    cfg = GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=64,
        n_positions=96,
        vocab_size=len(fast),
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
    )
    hf = GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder, hf


def hf_greedy(hf, prompt, n):
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        pad_token_id=hf.config.eos_token_id,
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
def test_logits_match_transformers(checkpoint, backend, device):
    folder, hf = checkpoint
    model, _ = load_model(folder, backend=backend, device=device)
    ids = torch.randint(0, hf.config.vocab_size, (2, 45))
    assert max_rel_err(model(ids.to(device)).cpu(), hf(ids).logits) <= 1e-4


@pytest.mark.parametrize("backend,fusion", RUN_PARAMS)
def test_cached_prefill_and_decode_logits_match_transformers(checkpoint, backend, fusion, device):
    folder, hf = checkpoint
    model, _ = load_model(folder, backend=backend, device=device)
    model = model.with_fusion(fusion)
    ids = torch.randint(0, hf.config.vocab_size, (2, 24))
    ref = hf(ids).logits  # (B, T, vocab)
    ids = ids.to(device)
    cache = KVCache.for_model(model, 2, 30)
    logits = model.prefill(ids[:, :17], cache, [17, 17])
    assert max_rel_err(logits.cpu(), ref[:, 16]) <= 1e-4
    for t in range(17, 24):
        logits = model.decode(ids[:, t], cache)
        assert max_rel_err(logits.cpu(), ref[:, t]) <= 1e-4
    assert cache.host_lengths == [24, 24]
    assert cache.lengths.tolist() == [24, 24]


def _with_cache_on_and_off():
    """Every run with the cache on; with it off only the runs that differ: a pass without the cache has no decode
    steps, so the decode rungs would repeat the epilogue rung's run exactly."""
    for cache in (True, False):
        for run in RUN_PARAMS:
            values, marks = (run.values, run.marks) if hasattr(run, "values") else (run, ())
            if cache or values[1] not in DECODE_RUNGS:
                yield pytest.param(*values, cache, marks=marks)


@pytest.mark.parametrize("backend,fusion,cache", list(_with_cache_on_and_off()))
def test_greedy_generation_matches_transformers(checkpoint, backend, fusion, cache, device):
    folder, hf = checkpoint
    model, tok = load_model(folder, backend=backend, device=device)
    prompt = torch.randint(0, hf.config.vocab_size, (7,)).tolist()
    n = 12  # past 16 positions: the cache-off passes leave the decode-shaped rows (at most 16) for the tiled ones
    expected = hf_greedy(hf, prompt, n)
    steps = list(generate(model, prompt, max_new_tokens=n, cache=cache, eos_token_id=-1, tokenizer=tok, fusion=fusion))
    assert [s.token_id for s in steps] == expected
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * (n - 1)
    assert [s.position for s in steps] == list(range(7, 7 + n))
    assert steps[-1].stop_reason == f"reached max new tokens ({n})"
    assert "".join(s.text for s in steps) == tok.decode(expected)


def test_a_prefill_on_the_torch_backend_feeds_our_decode_steps(checkpoint, device):
    check_prefill_on_torch(*checkpoint, hf_greedy, device)


def check_prefill_on_torch(folder, hf, greedy, device):
    """The profiling pass rebuilds a cache with PyTorch's prefill (it compiles nothing) and times our decode step
    on it: the prefill's operations are the torch backend's, the steps' ours, and the tokens still transformers'."""
    model, _ = load_model(folder, backend="triton", device=device)
    prompt = torch.randint(0, hf.config.vocab_size, (9,)).tolist()
    steps = list(generate(model, prompt, max_new_tokens=4, eos_token_id=-1, prefill_backend="torch", graph=False))
    assert [s.token_id for s in steps] == greedy(hf, prompt, 4)
    assert {op.backend for op in steps[0].ops} == {"torch"}
    assert all({op.backend for op in s.ops} == {"triton"} for s in steps[1:])


def test_the_profiling_pass_rebuilds_every_step_on_a_cache_of_the_runs_size(checkpoint, device, monkeypatch):
    """Triton specialises a kernel on the cache's size: a rebuilt step on a cache of its own length would compile
    anew at many of the positions sampled. A larger cache than a run needs gives the same tokens (the lengths
    mask the rest), and the warm-up and every rebuilt step, prefill and decode, run on a cache of the run's size."""
    from explorer.measure.profile import profile_run

    folder, hf = checkpoint
    model, _ = load_model(folder, backend="triton", device=device)
    prompt = torch.randint(0, hf.config.vocab_size, (5,)).tolist()
    roomy = list(generate(model, prompt, max_new_tokens=6, eos_token_id=-1, positions=hf.config.n_positions))
    assert [s.token_id for s in roomy] == hf_greedy(hf, prompt, 6)
    sizes, made = [], KVCache.for_model
    monkeypatch.setattr(KVCache, "for_model", lambda m, b, n: sizes.append(n) or made(m, b, n))
    steps = list(generate(model, prompt, max_new_tokens=7, eos_token_id=-1, graph=False, warmup=True))
    assert sizes == [5 + 7, 5 + 7]  # the warm-up's two steps compile what the run's steps launch
    sizes.clear()  # (on a GPU the pass runs each step once more first, untimed)
    profiled = profile_run(model, [prompt], steps, cache=True, samples=3)
    assert profiled.step.nunique() == 4 and len(sizes) >= 4 and set(sizes) == {12}  # the prefill, 3 decode steps
    sizes.clear()
    profile_run(model, [prompt], steps[:4], cache=True, samples=2, positions=12)  # a run that ended early
    assert len(sizes) >= 3 and set(sizes) == {12}


def test_the_torch_backends_attention_plans_nothing_per_length(checkpoint, device, monkeypatch):
    """With the cache off every step's attention meets a new length, and so does each prefill that rebuilds a
    profiled step's cache: on Hopper cuDNN's attention, PyTorch's choice, would build a plan for each (61 ms a
    length on an H200). The torch backend's attention runs with cuDNN's left out, and PyTorch's choice is back
    after it; the Triton backend's runs never call PyTorch's attention."""
    import torch.nn.functional as F

    from explorer.measure.profile import profile_run

    folder, hf = checkpoint
    prompt = torch.randint(0, hf.config.vocab_size, (5,)).tolist()
    expected = hf_greedy(hf, prompt, 3)  # transformers' GPT-2 calls PyTorch's attention too: before it is watched
    seen, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(
        F,
        "scaled_dot_product_attention",
        lambda *a, **k: seen.append((a[0].shape[2], torch.backends.cuda.cudnn_sdp_enabled())) or sdpa(*a, **k),
    )
    assert torch.backends.cuda.cudnn_sdp_enabled()
    torch_model, _ = load_model(folder, backend="torch", device=device)
    off = list(generate(torch_model, prompt, max_new_tokens=3, cache=False, eos_token_id=-1, warmup=False))
    assert [s.token_id for s in off] == expected
    assert sorted({rows for rows, _ in seen}) == [5, 6, 7] and not any(on for _, on in seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    model, _ = load_model(folder, backend="triton", device=device)
    steps = list(generate(model, prompt, max_new_tokens=4, eos_token_id=-1, graph=False))
    seen.clear()
    profile_run(model, [prompt], steps, cache=True, samples=2)
    prefills = [on for rows, on in seen if rows > 1]
    assert prefills and not any(prefills)  # every rebuilding prefill, with cuDNN's attention off
    assert torch.backends.cuda.cudnn_sdp_enabled()  # and back on after


def test_a_step_read_as_zeros_is_timed_again_then_reported(checkpoint, device, monkeypatch):
    """A GPU shared with other work can time every operation of a step as zero: the pass times that step again,
    and only a step that reads zeros in every try is reported as unmeasured."""
    from explorer.measure import profile

    folder, hf = checkpoint
    model, _ = load_model(folder, backend="triton", device=device)
    prompt = torch.randint(0, hf.config.vocab_size, (5,)).tolist()
    steps = list(generate(model, prompt, max_new_tokens=3, eos_token_id=-1, graph=False))
    take, zeroed = profile.Profiler.take, []

    def shared(times):  # the first `times` steps taken read as zeros
        def read(self):
            rows = take(self)
            if len(zeroed) < times:
                zeroed.append(len(rows))
                rows = [dict(r, kernel_ms=0.0) for r in rows]
            return rows

        return read

    monkeypatch.setattr(profile.Profiler, "take", shared(profile._STEP_TRIES - 1))
    profiled = profile.profile_run(model, [prompt], steps, cache=True, samples=1)
    assert len(zeroed) == profile._STEP_TRIES - 1 and (profiled.groupby("step").kernel_ms.sum() > 0).all()
    zeroed.clear()
    monkeypatch.setattr(profile.Profiler, "take", shared(profile._STEP_TRIES))
    with pytest.raises(profile.NoKernelTime, match=f"in {profile._STEP_TRIES} tries"):
        profile.profile_run(model, [prompt], steps, cache=True, samples=1)


@pytest.mark.parametrize("cache,fusion", [(True, "decode"), (True, "none"), (False, "decode")])
def test_batch_of_unequal_prompts_matches_each_alone(checkpoint, cache, fusion, device):
    folder, hf = checkpoint
    model, _ = load_model(folder, backend="triton", device=device)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,)).tolist() for n in (3, 11, 6)]
    steps = list(generate(model, prompts, max_new_tokens=7, cache=cache, eos_token_id=-1, fusion=fusion))
    for b, prompt in enumerate(prompts):
        assert [s.token_ids[b] for s in steps] == hf_greedy(hf, prompt, 7), f"sequence {b}"
    assert steps[0].positions == [3, 11, 6]


def test_kv_cache_bytes_match_its_tensors(checkpoint, device):
    folder, hf = checkpoint
    model, _ = load_model(folder, device=device)
    steps = list(generate(model, [[1, 2, 3], [4, 5, 6, 7, 8]], max_new_tokens=5, eos_token_id=-1, warmup=False))
    cfg = hf.config
    per_token = 2 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * 4
    cache = KVCache.for_model(model, 2, 5 + 5)
    assert steps[0].kv_allocated_bytes == cache.k.numel() * 4 + cache.v.numel() * 4 == per_token * 2 * 10
    # After the prefill the cache holds the prompts; each decode step adds one position per sequence.
    assert [s.kv_used_bytes for s in steps] == [per_token * (8 + 2 * i) for i in range(5)]
    off = list(generate(model, [[1, 2, 3]], max_new_tokens=3, cache=False, eos_token_id=-1, warmup=False))
    assert all(s.kv_used_bytes == 0 and s.kv_allocated_bytes == 0 for s in off)
    assert [s.context_tokens for s in off] == [3, 4, 5]  # the recompute that grows instead


def test_step_names_its_operations_and_the_measure_layer_books_them(checkpoint, device):
    from explorer.measure.traffic import step_traffic

    folder, _ = checkpoint
    model, _ = load_model(folder, device=device)
    steps = generate(model, [5] * 9, max_new_tokens=2, eos_token_id=-1, warmup=False, fusion="epilogue")
    prefill, decode = list(steps)
    layer = ["ln_1", "attn.c_attn", "kv write", "attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]
    names = ["wte/wpe", *layer * 2, "ln_f", "lm_head"]  # two layers
    assert [op.name for op in prefill.ops] == [op.name for op in decode.ops] == names
    assert {op.kernel for op in decode.ops if op.name == "attn"} == {"decode_attention"}
    traffic = step_traffic(prefill)
    assert {"layer_norm", "qkv/out proj", "attention", "ffn", "lm_head", "embedding", "kv write"} == set(traffic)
    assert "decode attention" in step_traffic(decode) and "attention" not in step_traffic(decode)
    assert step_traffic(decode)["ffn"].bytes_read < traffic["ffn"].bytes_read
    assert traffic["ffn"].flops == 2 * (2 * 9 * 64 * 256 * 2) + 9 * (256 * 11 + 64 * 2) * 2


CHART_CATEGORIES = {
    "layer_norm",
    "qkv/out proj",
    "decode attention",
    "decode layer",
    "decode step",
    "ffn",
    "lm_head",
    "embedding",
    "kv write",
    "counters",  # the megakernel rung's: what its tasks wait on
}


def test_each_rung_names_the_launches_its_decode_step_makes(checkpoint, device):
    from explorer.measure.traffic import op_traffic, step_traffic
    from kernels.ops.decode_linear import kernel as fused_linear

    folder, _ = checkpoint
    model, _ = load_model(folder, device=device)
    names, prefills, decodes = {}, {}, {}
    for fusion in ("none", "epilogue", "decode", "overlap", "persistent", "megakernel"):
        prefill, decode = list(generate(model, [5] * 9, max_new_tokens=2, eos_token_id=-1, warmup=False, fusion=fusion))
        names[fusion], prefills[fusion] = [op.name for op in decode.ops], [op.name for op in prefill.ops]
        decodes[fusion] = decode
        # Whatever the rung, every byte is booked under a chart category the charts know.
        assert set(step_traffic(decode)) <= CHART_CATEGORIES
    assert prefills["none"] == names["none"] and prefills["epilogue"] == names["epilogue"]
    assert prefills["decode"] == names["epilogue"]  # the decode rung fuses decode steps only
    layer = ["ln_1+attn.c_attn+kv write", "attn", "attn.c_proj", "ln_2+mlp.c_fc", "mlp.c_proj"]
    assert names["decode"] == ["wte/wpe", *layer * 2, "ln_f+lm_head"]
    assert names["overlap"] == names["decode"]  # the same kernels, launched to overlap
    assert names["persistent"] == ["wte/wpe", "block", "block", "ln_f+lm_head"]  # each block in one launch
    assert prefills["persistent"] == names["epilogue"]
    assert names["megakernel"] == ["step"] and prefills["megakernel"] == names["epilogue"]  # the step in one launch
    # The fused c_attn is booked with the cache rows its epilogue writes: one per head of K and of V.
    c_attn = next(op for op in decodes["decode"].ops if op.name == "ln_1+attn.c_attn+kv write")
    assert c_attn.sizes == (1, 192, 64, True, False, False, True, 4, 16, False, False, False)
    on = dict(config=c_attn.config, dtype=c_attn.dtype, device=c_attn.device)
    expected = fused_linear.traffic(1, 192, 64, 4, norm=True, kv=4, **on)
    assert op_traffic(c_attn) == expected
    attention = ["ln_1", "attn.c_attn", "attn.c_attn.bias", "kv write", "attn"]
    attention += ["attn.c_proj", "attn.c_proj.bias", "attn.c_proj.residual"]
    ffn = ["ln_2", "mlp.c_fc", "mlp.c_fc.bias", "mlp.c_fc.gelu", "mlp.c_proj", "mlp.c_proj.bias", "mlp.c_proj.residual"]
    unfused = attention + ffn
    assert names["none"] == ["wte/wpe", *unfused * 2, "ln_f", "lm_head"]
    assert len(names["none"]) > len(names["epilogue"]) > len(names["decode"])


def test_sampling_is_seeded_and_top_k_1_is_greedy(checkpoint):
    folder, _ = checkpoint
    model, _ = load_model(folder, backend="torch")
    run = lambda **kw: [s.token_id for s in generate(model, [1, 2, 3], max_new_tokens=10, eos_token_id=-1, **kw)]
    assert run(temperature=1.0, seed=3) == run(temperature=1.0, seed=3)
    assert run(temperature=5.0, top_k=1, seed=3) == run()
    assert len({tuple(run(temperature=5.0, seed=s)) for s in range(4)}) > 1


def test_stops_at_position_limit_and_end_of_text(checkpoint):
    folder, hf = checkpoint
    model, _ = load_model(folder, backend="torch")
    prompt = [7] * 90
    steps = list(generate(model, prompt, max_new_tokens=20, eos_token_id=-1))
    assert len(steps) == 96 - 90 + 1
    assert steps[-1].stop_reason == "reached the model's position limit (96 positions)"
    first = steps[0].token_id
    steps = list(generate(model, prompt, max_new_tokens=20, eos_token_id=first))
    assert len(steps) == 1 and steps[0].stop_reason == "end of text"


def test_bad_inputs_are_clear_errors(checkpoint, tmp_path):
    folder, _ = checkpoint
    model, _ = load_model(folder, backend="torch")
    with pytest.raises(ValueError, match="prompt is empty"):
        next(generate(model, [], max_new_tokens=3))
    with pytest.raises(ValueError, match="prompt of 97 tokens exceeds the model's 96 positions"):
        next(generate(model, [1] * 97, max_new_tokens=3))
    with pytest.raises(ValueError, match="backend='cuda' is not known"):
        load_model(folder, backend="cuda")
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="not GPT-2-family|could not load"):
        load_model(tmp_path)


def test_unreachable_hub_name_fails_fast(monkeypatch):
    import time

    # What is timed is the answer, not the first import of transformers, which alone can pass 10 s on
    # a machine busy with 16 test workers (seen on the GPU machine).
    from transformers import AutoConfig, AutoTokenizer, GPT2LMHeadModel  # noqa: F401

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ValueError, match="cannot be reached|could not load"):
        load_model("surely-not-a-cached-model/gpt2-xyz")
    assert time.perf_counter() - start < 10


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision_logits_match_transformers(checkpoint, device, dtype, backend):
    check_half_precision_logits(checkpoint, device, dtype, backend)


def check_half_precision_logits(checkpoint, device, dtype, backend):
    """Low-precision weights and activations: compared with transformers run in float32 on the same
    weights. The bound is relative to the largest logit; bf16 keeps 8 bits, so a few 2^-8 per layer."""
    folder, hf = checkpoint
    model, _ = load_model(folder, backend=backend, device=device, dtype=dtype)
    ids = torch.randint(0, hf.config.vocab_size, (3, 80))
    err = max_rel_err(model(ids.to(device)).float().cpu(), hf(ids).logits)
    assert err <= (3e-2 if dtype == torch.bfloat16 else 5e-3), err


@pytest.mark.gpu
def test_gpt2_shaped_model_generates_256_tokens_cache_on_and_off(device):
    """Random weights of GPT-2 small's shape in bf16, both backends and every rung, cache on and off. Greedy tokens of a
    random model are often near-ties that bf16 rounding may flip, so each run is checked against
    transformers in float32, teacher-forced on that run's own tokens: every chosen token must be the
    reference's argmax up to a bf16-sized margin."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from explorer.model.weights import config_from_hf, from_hf_state_dict

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024)).eval()
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device=device, dtype=torch.bfloat16)
    check_long_generations(model, hf.to(device), device)


def check_long_generations(model, hf, device, new_tokens=256):
    """Every backend and rung with the cache, two runs without, each of new_tokens greedy tokens checked against hf
    (float32) teacher-forced on that run's own tokens: every chosen token the reference's argmax up to a
    bf16-sized margin."""
    prompt = torch.randint(0, hf.config.vocab_size, (32,)).tolist()
    runs = [(backend, fusion, True) for backend, fusion in RUNS] + [
        ("torch", "epilogue", False),
        ("triton", "decode", False),
    ]
    for backend, fusion, cache in runs:
        steps = list(
            generate(
                model, prompt, max_new_tokens=new_tokens, cache=cache, backend=backend, fusion=fusion, eos_token_id=-1
            )
        )
        tokens = [s.token_id for s in steps]
        assert len(tokens) == new_tokens
        with torch.no_grad():
            ref = hf(torch.tensor([prompt + tokens[:-1]], device=device)).logits[0, len(prompt) - 1 :].float()
        chosen = ref.gather(1, torch.tensor(tokens, device=device)[:, None])[:, 0]
        margin = 0.02 * (ref.max(1).values - ref.min(1).values)
        assert bool((chosen >= ref.max(1).values - margin).all()), (backend, fusion, cache)
