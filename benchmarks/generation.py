"""Tokens/s of whole generations on a GPU: our decoder (Triton kernels, and the PyTorch backend) with
the KV cache on and off, next to transformers' own generate and a minimal PyTorch CUDA-graph loop
(benchmarks/torch_loop.py) on the same weights and GPU.

    python -m benchmarks.generation [--family gpt2|llama] [--new-tokens 256] [--prompt 32] [--dtype bfloat16]
                                    [--cache on off] [--fusions overlap megakernel]

Weights are random, of GPT-2 small's shape (12 layers, width 768, vocabulary 50257) or with --family llama
SmolLM2-135M's (benchmarks.ladder.random_hf); every run is
greedy, forced to the full length, warmed up once, then timed end to end (wall clock after a device
synchronise). With the cache on, our decoder runs both eager (every kernel launched from Python) and
with each decode step replayed from a CUDA graph (its capture counted in the time); its Triton backend on each
rung `--fusions` names (the default rung alone unless asked).

A second table sets the two clocks of one graph run side by side: the rate at which generate()
delivered tokens to its caller by the wall clock (first token to last), and 1000 / the median decode
step on the device clock. Their ratio is the share of the device's pace that reaches the caller.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import argparse
import statistics
import time

import torch

from benchmarks.ladder import random_hf
from benchmarks.torch_loop import LlamaGraphLoop, TorchGraphLoop
from explorer.measure import metrics
from explorer.measure.clock import timed
from explorer.model.generate import generate
from explorer.model.ops import DEFAULT_FUSION, FUSIONS
from explorer.model.weights import config_from_hf, from_hf_state_dict


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
    parser.add_argument("--family", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--cache",
        nargs="+",
        choices=["on", "off"],
        default=["on", "off"],
        help="off: every token over the whole prefix",
    )
    parser.add_argument("--fusions", nargs="+", choices=FUSIONS, default=[DEFAULT_FUSION], help="the Triton rungs")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    hf, shape = random_hf(args.family)
    ours = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=dtype)
    hf = hf.to("cuda", dtype)
    prompt = torch.randint(0, hf.config.vocab_size, (args.prompt,)).tolist()
    n = args.new_tokens

    def run_ours(backend, cache, graph, fusion=None):
        kw = dict(max_new_tokens=n, cache=cache, backend=backend, fusion=fusion, eos_token_id=-1, warmup=False)
        steps = list(generate(ours, prompt, **kw, graph=graph))
        assert len(steps) == n and steps[-1].graph == graph

    def run_hf(cache):
        ids = torch.tensor([prompt], device="cuda")
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            use_cache=cache,
            pad_token_id=0,
        )
        assert out.shape[1] == args.prompt + n

    loop = (LlamaGraphLoop if args.family == "llama" else TorchGraphLoop)(hf, args.prompt + n, dtype)

    def run_loop():
        assert len(loop.generate(prompt, n)) == n

    rows = [("PyTorch loop: static cache, step in a CUDA graph, one sync", True, None, None)]
    loop_secs = _timed(run_loop, args.repeats)
    for cache in (c == "on" for c in args.cache):
        base = _timed(lambda c=cache: run_hf(c), args.repeats)
        rows.append(("transformers generate", cache, base, base))
        for backend, fusion in [*(("triton", f) for f in args.fusions), ("torch", None)]:
            for graph in (False, True) if cache else (False,):
                rung = f", fusion={fusion}" if len(args.fusions) > 1 and fusion else ""
                name = f"ours, {backend} backend{rung}, {'CUDA graph' if graph else 'eager'}"
                secs = _timed(lambda b=backend, c=cache, g=graph, f=fusion: run_ours(b, c, g, f), args.repeats)
                rows.append((name, cache, secs, base))
    print(f"{torch.cuda.get_device_name()} · {args.dtype} · {shape} · prompt {args.prompt} · {n} new tokens · batch 1")
    hf_cached = next((base for _, cache, base, _ in rows[1:] if cache), None)
    rows[0] = (rows[0][0], True, loop_secs, hf_cached)
    print("| generator | KV cache | tokens/s | vs transformers |\n|---|---|---:|---:|")
    for name, cache, secs, base in rows:
        versus = f"{base / secs:.2f}x" if base else "-"
        print(f"| {name} | {'on' if cache else 'off'} | {n / secs:.0f} | {versus} |")
    clocks(ours, prompt, n, args.repeats, n / loop_secs)


def clocks(model, prompt, n, repeats, loop_rate):
    """Wall-clock delivery against the device step, from the Steps of the same graph runs."""
    print(
        "\n| run | tokens/s delivered (wall) | decode step p50 (device) | 1000/p50 | wall / (1000/p50) | "
        "vs PyTorch loop |\n|---|---:|---:|---:|---:|---:|"
    )
    for r in range(repeats):
        steps = list(timed(model, prompt, max_new_tokens=n, eos_token_id=-1, warmup=r == 0, graph=True))
        s = metrics.summary(steps)
        pace = 1000 / s["step_ms_p50"]
        print(
            f"| {r + 1} | {s['wall_tokens_per_s']:.0f} | {s['step_ms_p50']:.3f} ms | {pace:.0f} | "
            f"{s['wall_tokens_per_s'] / pace:.2f} | {s['wall_tokens_per_s'] / loop_rate:.2f}x |"
        )


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("benchmarks/generation.py")
    main()
