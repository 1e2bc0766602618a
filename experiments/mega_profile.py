"""Where does the megakernel rung's step spend its time, operation by operation? Every task stamps the global
timer as it starts, as its inputs are ready (its wait met) and as it has arrived (kernels.ops.decode_step's
trace); per operation this prints how long after the last task of the operation before it arrived its tasks
found their inputs (the hop), how long a task then took to compute and arrive, and the operation's whole span.

    python -m experiments.mega_profile [--family gpt2|llama] [--context 1000] [--batch 1] [--steps 30]

GPT-2 small's shape or SmolLM2-135M's with random weights (benchmarks.ladder.random_hf), bf16, eager launches
timed by CUDA events, the traced kernel beside the plain one (stamping adds stores and a few registers). The
stamps of the step with the median traced time are the ones shown.
"""

import argparse
import statistics

import torch

import kernels
import kernels.ops.decode_step as DS
from explorer.measure.ladder import random_cache, reset
from explorer.model.weights import config_from_hf, from_hf_state_dict


def timed_steps(model, cache, ids, context: int, steps: int, trace=None) -> tuple[list[float], list]:
    """`steps` eager decode steps from `context`, each timed by CUDA events: (ms each, each step's stamps)."""
    plain = kernels.decode_step
    if trace is not None:
        kernels.decode_step = lambda *a, **k: plain(*a, **k, trace=trace)
    try:
        times, stamps = [], []
        for _ in range(steps):
            reset(cache, context)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model.decode(ids, cache)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            if trace is not None:
                stamps.append(trace.view(-1, 3).cpu())
        DS.check("cuda")
        return times, stamps
    finally:
        kernels.decode_step = plain


def operations(stamps: torch.Tensor, runs: list) -> list[dict]:
    """Per run of one operation's tasks: its hop, its tasks' compute and its span, in µs from the stamps (ns)."""
    at = (stamps - stamps[:, 0].min()).double() / 1e3
    out, g, before = [], 0, None
    for name, layer, n in runs:
        tasks = at[g : g + n]
        g += n
        done = tasks[:, 2].max().item()
        row = dict(name=name, layer=layer, tasks=n, end=done, compute=tasks[:, 2].sub(tasks[:, 1]).median().item())
        if before is not None:
            row |= dict(hop=tasks[:, 1].min().item() - before, last_ready=tasks[:, 1].max().item() - before)
            row["span"] = done - before
        out.append(row)
        before = done
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    from benchmarks.ladder import random_hf

    torch.manual_seed(0)
    hf, shape_name = random_hf(args.family)
    model = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)
    model = model.with_fusion("megakernel")
    cache = random_cache(model, args.batch, args.context, torch.Generator().manual_seed(1))
    ids = torch.arange(123, 123 + args.batch, device="cuda")
    kv = (cache.k, cache.v, cache.lengths, cache.next_lengths)
    shape = DS.shape_of(model.step_parts(), kv)
    runs = DS.tasks(args.batch, shape, cache.k.shape[3], torch.bfloat16, torch.device("cuda"))
    trace = torch.zeros(3 * sum(n for _, _, n in runs), dtype=torch.int64, device="cuda")
    timed_steps(model, cache, ids, args.context, 3)  # compile both
    timed_steps(model, cache, ids, args.context, 3, trace)
    plain, _ = timed_steps(model, cache, ids, args.context, args.steps)
    traced, stamps = timed_steps(model, cache, ids, args.context, args.steps, trace)
    middle = sorted(range(len(traced)), key=traced.__getitem__)[len(traced) // 2]
    step = stamps[middle]
    assert (step > 0).all(), "a task left a stamp unwritten"
    rows = operations(step, runs)
    programs = DS.plan(args.batch, shape, cache.k.shape[3], torch.bfloat16, torch.device("cuda")).programs
    print(
        f"{shape_name}, bf16, batch {args.batch}, context {args.context}: {programs} programs, {len(step)} tasks; "
        f"eager step {statistics.median(plain):.3f} ms plain, {statistics.median(traced):.3f} traced (median of "
        f"{args.steps}); the traced step's stamps span {rows[-1]['end']:.1f} µs from its first task's start"
    )
    print("\nPer operation, median over the layers (µs): hop = first task's inputs ready after the last arrival")
    print("before it; ready = the last task's; compute = a task's own, median; span = the operation's last arrival")
    print("after the one before's.\n")
    print("| operation | tasks | hop | last ready | compute | span | share of the step |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    total = sum(r.get("span", 0.0) for r in rows)
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name and "span" in r]
        if not mine:
            continue
        med = {k: statistics.median(r[k] for r in mine) for k in ("hop", "last_ready", "compute", "span")}
        share = sum(r["span"] for r in mine) / total
        print(
            f"| {name} (x{len(mine)}) | {mine[0]['tasks']} | {med['hop']:.2f} | {med['last_ready']:.2f} | "
            f"{med['compute']:.2f} | {med['span']:.2f} | {share:.0%} |"
        )
    print(f"\n{torch.cuda.get_device_name()} · torch {torch.__version__}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/mega_profile.py")
    main()
