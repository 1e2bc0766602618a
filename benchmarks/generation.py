"""Tokens/s of whole generations on a GPU: our decoder (Triton kernels, and the PyTorch backend) with
the KV cache on and off, next to transformers' own generate on the same weights and GPU.

    python benchmarks/generation.py [--new-tokens 256] [--prompt 32] [--dtype bfloat16]

Weights are random, of GPT-2 small's shape (12 layers, width 768); every run is greedy, forced to
the full length, warmed up once, then timed end to end (wall clock after a device synchronise).
With the cache on, our decoder runs both eager (every kernel launched from Python) and with each
decode step replayed from a CUDA graph (its capture counted in the time).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from explorer.generate import generate  # noqa: E402
from explorer.weights import config_from_hf, from_hf_state_dict  # noqa: E402


def _timed(fn, repeats):
    fn()  # warm-up: compilation, allocator
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024)).eval()
    ours = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=dtype)
    hf = hf.to("cuda", dtype)
    prompt = torch.randint(0, 50257, (args.prompt,)).tolist()
    n = args.new_tokens

    def run_ours(backend, cache, graph):
        steps = list(generate(ours, prompt, max_new_tokens=n, cache=cache, backend=backend, eos_token_id=-1,
                              warmup=False, graph=graph))  # fmt: skip
        assert len(steps) == n and steps[-1].graph == graph

    def run_hf(cache):
        ids = torch.tensor([prompt], device="cuda")
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                          do_sample=False, use_cache=cache, pad_token_id=0)  # fmt: skip
        assert out.shape[1] == args.prompt + n

    rows = []
    for cache in (True, False):
        base = _timed(lambda c=cache: run_hf(c), args.repeats)
        rows.append(("transformers generate", cache, base, base))
        for backend in ("triton", "torch"):
            for graph in (False, True) if cache else (False,):
                name = f"ours, {backend} backend, {'CUDA graph' if graph else 'eager'}"
                secs = _timed(lambda b=backend, c=cache, g=graph: run_ours(b, c, g), args.repeats)
                rows.append((name, cache, secs, base))
    print(f"{torch.cuda.get_device_name()} · {args.dtype} · prompt {args.prompt} · {n} new tokens · batch 1")
    print("| generator | KV cache | tokens/s | vs transformers |\n|---|---|---:|---:|")
    for name, cache, secs, base in rows:
        print(f"| {name} | {'on' if cache else 'off'} | {n / secs:.0f} | {base / secs:.2f}x |")


if __name__ == "__main__":
    main()
