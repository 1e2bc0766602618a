"""Where an eager decode step's host time goes, and each kernel's launch cost next to PyTorch's: among them a
prompt's linear (24 and 400 rows) in its two forms, the TMA form that 16-bit prefill takes on Hopper, launched
through Triton's own path with its descriptors built per call, and the tile form, bound once (kernels.launch).
Both pay the same few microseconds for the block that picks the form.

    python -m experiments.host_profile [--steps 30] [--calls]

GPU only. Host time per call: the mean of many back-to-back calls timed by the wall clock (the median of
seven rounds, alternating ours and PyTorch's), with the device kept ahead (the GPU finishes each small
kernel before the host issues the next, so the host is the bottleneck being measured); then cProfile over
eager decode steps of GPT-2 small's shape.
"""

import argparse
import cProfile
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

import kernels
from explorer.measure.ladder import random_cache, reset
from explorer.model.weights import config_from_hf, from_hf_state_dict
from kernels import launch
from kernels.ops.linear.kernel import forced_form


def host_us(fn, n=400, wait=True):
    """Host time per call of fn called n times back to back: until the GPU has finished them (wait), or until
    the last is issued (n stays below the launch queue, so the host never waits for the GPU)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if wait:
        torch.cuda.synchronize()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / n * 1e6


def paired_us(ours, theirs, rounds=7):
    """Medians over rounds that alternate ours and theirs: the host's own speed drifts within seconds."""
    times = [(host_us(ours), host_us(theirs)) for _ in range(rounds)]
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def _formed(persistent: bool, fn):
    with forced_form(persistent):
        return fn()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--calls", action="store_true", help="also cProfile each of our calls")
    args = parser.parse_args()
    dev, dt = "cuda", torch.bfloat16
    x = torch.randn(1, 768, device=dev, dtype=dt)
    w = torch.randn(3072, 768, device=dev, dtype=dt) / 28
    b = torch.randn(3072, device=dev, dtype=dt)
    ln = (torch.randn(768, device=dev, dtype=dt), torch.randn(768, device=dev, dtype=dt), 1e-5)
    big = torch.randn(4096, 768, device=dev, dtype=dt)
    q = torch.randn(1, 12, 1, 64, device=dev, dtype=dt)
    kc, vc = (torch.randn(1, 12, 1024, 64, device=dev, dtype=dt) for _ in range(2))
    lens = torch.tensor([1024], device=dev, dtype=torch.int32)
    gelu = lambda a: F.gelu(F.linear(a, w, b), approximate="tanh")
    rows = []
    for m in (24, 400):  # a prompt's rows: the 16-bit form on Hopper (TMA descriptors per call) and the tile form
        a = torch.randn(m, 768, device=dev, dtype=dt)
        for persistent, form in ((True, "TMA form"), (False, "tile form")):
            ours = lambda a=a, persistent=persistent: _formed(
                persistent, lambda: kernels.linear(a, w, b, activation="gelu")
            )
            rows.append((f"linear+GELU M={m}, {form}", ours, lambda a=a: gelu(a)))
    rows += [
        ("layer_norm 4096x768", lambda: kernels.layer_norm(big, *ln), lambda: F.layer_norm(big, (768,), *ln)),
        (
            "linear+GELU M=1 (kernels.linear)",
            lambda: kernels.linear(x, w, b, activation="gelu"),
            lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
        ),
        (
            "decode_linear LN+c_fc+GELU M=1",
            lambda: kernels.decode_linear(x, w, b, activation="gelu", norm=ln),
            lambda: F.gelu(F.linear(F.layer_norm(x, (768,), *ln), w, b), approximate="tanh"),
        ),
        (
            "decode attention B=1 N=1024",
            lambda: kernels.decode_attention(q, kc, vc, lens),
            lambda: F.scaled_dot_product_attention(q, kc, vc),
        ),
        (
            "decode attention one launch",
            lambda: kernels.decode_attention(q, kc, vc, lens, one_launch=True),
            lambda: F.scaled_dot_product_attention(q, kc, vc),
        ),
    ]
    if args.calls:  # where each of our calls spends its host time
        for name, ours, _ in rows:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                ours()
            prof.disable()
            torch.cuda.synchronize()
            print(f"\n### {name}: 2000 calls")
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    print(f"compiled kernels bound per signature (kernels.launch): {launch.ENABLED}")
    print("| call | ours µs | PyTorch µs | ours / PyTorch |\n|---|---:|---:|---:|")
    for name, ours, theirs in rows:
        o, t = paired_us(ours, theirs)
        print(f"| {name} | {o:.1f} | {t:.1f} | {o / t:.2f} |", flush=True)
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024)).eval()
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device=dev, dtype=dt)
    cache = random_cache(model, 1, 500, torch.Generator().manual_seed(0))
    ids = torch.tensor([7], device=dev)
    model.decode(ids, cache)
    reset(cache, 500)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        model.decode(ids, cache)
        reset(cache, 500)
    torch.cuda.synchronize()
    print(f"\neager decode step, overlap rung: {(time.perf_counter() - t0) / args.steps * 1e3:.2f} ms")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        model.decode(ids, cache)
        reset(cache, 500)
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/host_profile.py")
    main()
