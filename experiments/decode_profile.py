"""Where the decode rung's step spends its time, on a GPU: python -m experiments.decode_profile

1. GPT-2-small-shaped random weights, bf16, context 1000, the decode rung's step replayed from a CUDA
   graph: torch.profiler's kernel durations per replay, by kernel name.
2. decode_linear's tiles on the step's five shapes, timed by kernels.timing (graph replays, inputs
   rotated past L2), next to F.linear (cuBLAS) on the same shape.
3. decode attention at context 1000 (12 heads, batch 1), one launch, over split counts.
"""

import itertools
from collections import defaultdict

import torch
import torch.nn.functional as F

from explorer.measure.ladder import random_cache
from explorer.model.graphs import DecodeGraph
from explorer.model.weights import config_from_hf, from_hf_state_dict
from kernels import TileConfig, decode_attention, decode_linear
from kernels.timing import device_time


def gpt2(layers=12, width=768, heads=12, vocab=50257):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=1024, vocab_size=vocab))
    return from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)


def kernel_times(model, context, replays=20):
    from torch.profiler import ProfilerActivity, profile

    cache = random_cache(model, 1, context, torch.Generator().manual_seed(0))
    graph = DecodeGraph(model, cache)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.graph.replay()
            cache.lengths.fill_(context)
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name[:60]] += e.device_time / replays
            count[e.name[:60]] += 1
    print(f"\n{sum(count.values()) / replays:.0f} kernels per replay, {sum(total.values()):.1f} µs of kernel time")
    for name in sorted(total, key=total.get, reverse=True)[:14]:
        print(f"  {total[name]:8.1f} µs  {count[name] / replays:5.1f}x  {name}")


def linear_sweep():
    shapes = {  # name: (out, in, flags)
        "ln_1+c_attn+kv": (2304, 768, "norm kv"),
        "attn.c_proj": (768, 768, "residual"),
        "ln_2+c_fc": (3072, 768, "norm gelu"),
        "mlp.c_proj": (768, 3072, "residual"),
        "ln_f+lm_head": (50257, 768, "norm nobias"),
    }
    configs = [
        TileConfig(block_m=16, block_n=n, block_k=k, split_k=s, num_warps=w, num_stages=st)
        for n, k, s, w, st in itertools.product((32, 64, 128), (64, 128, 256), (1, 2, 4, 8), (4,), (3,))
    ]
    dev, dt = "cuda", torch.bfloat16
    for name, (out_f, in_f, flags) in shapes.items():

        def make(out_f=out_f, in_f=in_f, flags=flags):
            x = torch.randn(1, 1, in_f, device=dev, dtype=dt)
            w = torch.randn(out_f, in_f, device=dev, dtype=dt) * 0.02
            b = None if "nobias" in flags else torch.randn(out_f, device=dev, dtype=dt)
            r = torch.randn(1, 1, out_f, device=dev, dtype=dt) if "residual" in flags else None
            g, beta = torch.randn(in_f, device=dev, dtype=dt), torch.randn(in_f, device=dev, dtype=dt)
            kc = torch.randn(1, 12, 1024, 64, device=dev, dtype=dt) if "kv" in flags else None
            vc = torch.randn_like(kc) if kc is not None else None
            n = torch.full((1,), 1000, device=dev, dtype=torch.int32)
            return x, w, b, r, g, beta, kc, vc, n

        def call(x, w, b, r, g, beta, kc, vc, n, cfg=None, flags=flags):
            norm = (g, beta, 1e-5) if "norm" in flags else None
            kv = (kc, vc, n) if "kv" in flags else None
            act = "gelu" if "gelu" in flags else None
            return decode_linear(x, w, b, activation=act, residual=r, norm=norm, kv=kv, config=cfg)

        base = device_time(lambda x, w, *_: F.linear(x, w), make).ms
        default = device_time(call, make).ms
        results = []
        for cfg in configs:
            try:
                results.append((device_time(lambda *a, cfg=cfg: call(*a, cfg=cfg), make).ms, cfg))
            except Exception as e:  # noqa: BLE001 (a config that cannot run is skipped, and said so)
                print(f"   {cfg}: {type(e).__name__}")
        results.sort(key=lambda r: r[0])
        mb = out_f * in_f * 2 / 1e6
        print(f"\n{name} ({out_f}x{in_f}, {mb:.1f} MB): F.linear {base * 1e3:.1f} µs, default {default * 1e3:.1f} µs")
        for ms, cfg in results[:4]:
            print(f"   {ms * 1e3:6.1f} µs  {mb / ms / 1e3:5.2f} TB/s  {cfg}")


def attention_sweep(context=1000):
    dev, dt = "cuda", torch.bfloat16

    def make():
        q = torch.randn(1, 12, 1, 64, device=dev, dtype=dt)
        k, v = (torch.randn(1, 12, 1024, 64, device=dev, dtype=dt) for _ in range(2))
        return q, k, v, torch.full((1,), context + 1, device=dev, dtype=torch.int32)

    sdpa = device_time(
        lambda q, k, v, n: F.scaled_dot_product_attention(q, k[:, :, : context + 1], v[:, :, : context + 1]), make
    ).ms
    print(f"\ndecode attention, 12 heads, {context + 1} keys: SDPA {sdpa * 1e3:.1f} µs")
    for bn, s, w in itertools.product((32, 64, 128), (4, 8, 16, 32), (2, 4)):
        cfg = TileConfig(block_n=bn, split_k=s, num_warps=w, num_stages=2)
        ms = device_time(lambda q, k, v, n, cfg=cfg: decode_attention(q, k, v, n, config=cfg, one_launch=True), make).ms
        print(f"   {ms * 1e3:6.1f} µs  {cfg}")


def profiled_ops():
    """The profiling pass's per-operation times for the decode rung (what the app's charts show)."""
    from explorer.measure.clock import timed
    from explorer.measure.profile import profile_run

    model = gpt2(6, 768, 12, 4096)
    prompt = list(range(1, 33))
    graphed = list(timed(model, prompt, max_new_tokens=24, eos_token_id=-1, graph=True))
    prof = profile_run(model, [prompt], graphed, cache=True, samples=3)
    decode = prof[prof.phase == "decode"]
    print("\nprofiled decode rung, 6 layers: graph step p50", sorted(s.latency_ms for s in graphed[4:])[10], "ms")
    print(decode.groupby(["step", "op"])[["kernel_ms", "launch_ms", "calls"]].sum().to_string())


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/decode_profile.py")
    profiled_ops()
    kernel_times(gpt2().with_fusion("decode"), 1000)
    kernel_times(gpt2(2, 64, 4, 97).with_fusion("decode"), 17)
    linear_sweep()
    attention_sweep()
