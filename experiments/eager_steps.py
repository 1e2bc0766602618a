"""Why does an eager step (the cache off, or the CUDA graph unticked) take tens of µs a launch on a GPU, and why do
two runs of one setting differ by up to 1.7x (scripts/record_matrix.py)? On a GPU each setting is run several
times, in turn with the others: per run, the median step's device time (CUDA events around it, as the app
times it), the host's time to issue it (perf_counter at the same two marks) and the launches it made; then one
step of each setting under cProfile, the host functions it spent most in.

    python -m experiments.eager_steps [--rounds 4] [--tokens 10]

Bundled models, 400-token prompts (the matrix's long prompt), 10 new tokens: the settings of the matrix whose
eager steps sat furthest from the time model.
"""

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from explorer.measure.clock import Clock
from explorer.model.generate import generate
from explorer.model.weights import BUNDLED_LLAMA, load_model

SAMPLED = dict(temperature=0.8, top_p=0.9, repetition_penalty=1.3)  # the page's sampling, as the matrix draws it
F32, F16, BF16, LLAMA = torch.float32, torch.float16, torch.bfloat16, BUNDLED_LLAMA
SETTINGS = {
    # name: (model, dtype, backend, fusion, cache, graph, batch, sampling)
    "GPT-2 fp32 overlap, cache on, graph off": (None, F32, "triton", "overlap", True, False, 1, {}),
    "GPT-2 fp32 overlap, cache off": (None, F32, "triton", "overlap", False, False, 1, {}),
    # its float16 twin: in the matrix the bundled GPT-2's half-precision eager steps took 1.4-1.7x their float32
    # twins' time at the same launches (the bundled Llama's did not), where the host's Python (launches recorded
    # on a CPU) is the same for both
    "GPT-2 fp16 overlap, cache off": (None, F16, "triton", "overlap", False, False, 1, {}),
    "GPT-2 fp32 torch backend, cache off": (None, F32, "torch", "epilogue", False, False, 1, {}),
    "Llama bf16 persistent, cache off, batch 4": (LLAMA, BF16, "triton", "persistent", False, False, 4, {}),
    "Llama bf16 overlap, cache on, graph off, batch 4": (LLAMA, BF16, "triton", "overlap", True, False, 4, {}),
    # the matrix's furthest decode step (2.03x) and prefill (2.12x, a graph's run), each sampled, and the first
    # greedy beside it
    "Llama fp16 decode rung, cache off, sampled": (LLAMA, F16, "triton", "decode", False, False, 1, SAMPLED),
    "Llama fp16 decode rung, cache off, greedy": (LLAMA, F16, "triton", "decode", False, False, 1, {}),
    "GPT-2 fp16 overlap, graph, batch 4, sampled": (None, F16, "triton", "overlap", True, True, 4, SAMPLED),
}


def one_run(models, name: str, tokens: int, profile: cProfile.Profile | None = None) -> dict:
    """One Generate of a setting: its decode steps' median device and host times and launches, and its prefill's."""
    path, dtype, backend, fusion, cache, graph, batch, sampling = SETTINGS[name]
    model = models[(path, dtype)]
    ids = [[(7 * i + b) % 4000 + 10 for i in range(400)] for b in range(batch)]
    clock = Clock(model.device, backend)
    steps = generate(
        model, ids, max_new_tokens=tokens, cache=cache, backend=backend, fusion=fusion, graph=graph, clock=clock,
        eos_token_id=-1, **sampling,
    )  # fmt: skip
    device, host, launches = [], [], []
    middle = tokens // 2
    for i, step in enumerate(steps):
        if profile is not None and i == middle + 1:
            profile.disable()  # the generator's work between the two: one step's launches and its tokens read
        if step.marks[0].event is not None:
            torch.cuda.synchronize()
        device.append(clock.step_ms(step.marks))
        host.append(clock.host_ms(step.marks))
        launches.append(len(step.ops))
        if profile is not None and i == middle:
            profile.enable()
    decode = slice(1, None)
    return dict(
        device_ms=statistics.median(device[decode]),
        host_ms=statistics.median(host[decode]),
        prefill_device_ms=device[0],
        prefill_host_ms=host[0],
        launches=statistics.median(launches[decode]),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=10)
    args = parser.parse_args()
    models = {}
    for path, dtype, *_ in SETTINGS.values():
        if (path, dtype) not in models:
            models[(path, dtype)] = load_model(path, device="cuda", dtype=dtype)[0]
    for name in SETTINGS:  # compile and warm everything first
        one_run(models, name, args.tokens)
    runs = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):  # in turn, so that a slow spell of the host falls on every setting
        for name in SETTINGS:
            runs[name].append(one_run(models, name, args.tokens))
    print(
        "| setting | launches | decode step: device ms per run | host ms to issue it | µs a launch (device) "
        "| prefill: device / host ms (median run) |"
    )
    print("|---|---:|---|---|---:|---|")
    for name, got in runs.items():
        dev = [r["device_ms"] for r in got]
        host = [r["host_ms"] for r in got]
        per = 1e3 * statistics.median(dev) / got[0]["launches"]
        prefill = [statistics.median(r[k] for r in got) for k in ("prefill_device_ms", "prefill_host_ms")]
        print(
            f"| {name} | {got[0]['launches']:.0f} | {' '.join(f'{d:.2f}' for d in dev)} | "
            f"{' '.join(f'{h:.2f}' for h in host)} | {per:.0f} | {prefill[0]:.2f} / {prefill[1]:.2f} |"
        )
    for name in SETTINGS:
        p = cProfile.Profile()
        t = time.perf_counter()
        one_run(models, name, args.tokens, profile=p)
        out = io.StringIO()
        pstats.Stats(p, stream=out).sort_stats("tottime").print_stats(12)
        print(f"\n### {name}: one decode step under cProfile ({time.perf_counter() - t:.2f} s the run)\n")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))
    print(f"\n{torch.cuda.get_device_name()} · torch {torch.__version__}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/eager_steps.py")
    main()
