"""Grouped decode attention's loop at B=8 with its rows asked of the L2 ahead (Hopper's bulk prefetch), and at
other split counts and pipeline depths, timed in turns.

    python -m experiments.grouped_early [8x4096 ...] [--stages] [--others] [--best FILE]   (batch x keys)

The loop keeps two tiles in flight (three pipeline stages), so at B=8 its programs hold far fewer bytes in flight
than a plain read's (experiments.grouped_warps). Prefetch -1: each split's rows past its first two tiles, asked
of the L2 at once when the length arrives; -2: the same before the length arrives, up to the cache's end; k > 0:
each iteration asks for the tile k ahead (grouped.PREFETCH, the kernel's PREFETCH). --stages: 16, 22 and 32
splits in 2 and 3 stages instead. --others: the plan's default before and now at 1x4096, 8x1024 and 8x8192;
--best: the fastest prefetch at the plan's tiles written to FILE. "before" is kernels/attn/grouped_head.py, a copy
of the module before the prefetch that a run may carry (skipped where absent). SmolLM2's 9 query heads over 3,
bf16, cold L2, SDPA with enable_gqa timed in the same rounds; each form is checked against SDPA first.
"""

import contextlib
import importlib
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

from experiments.grouped_variants import KV_HEADS, baseline
from kernels.attn import grouped

ROUNDS = 3


def module(name):
    try:
        return importlib.import_module(f"kernels.attn.{name}")
    except ImportError:
        return None


@contextlib.contextmanager
def tiles(mod, block_n=None, splits=None, warps=None, stages=None, prefetch=0):
    """mod's launcher at these tiles (None: the plan's), whatever its plan says, with this L2 prefetch."""
    plan, depth, ahead = mod.plan, mod.pipeline_stages, getattr(mod, "PREFETCH", 0)
    if prefetch:
        mod.PREFETCH = prefetch
    if block_n or splits or warps:

        def forced(groups, max_len, device, **kw):
            p = plan(groups, max_len, device, **kw)
            bn = block_n or p.block_n
            s = splits or p.splits
            chunk = triton.cdiv(triton.cdiv(max_len, s), bn) * bn
            count = triton.cdiv(max_len, chunk)
            return mod.Plan(bn, count, chunk, warps or p.num_warps, count * groups >= mod.MERGE_APART)

        mod.plan = forced
    if stages:
        mod.pipeline_stages = lambda device: stages
    try:
        yield
    finally:
        mod.plan, mod.pipeline_stages = plan, depth
        if prefetch:
            mod.PREFETCH = ahead


def forms(batch, n, sweep):
    old = module("grouped_head")
    rows = [("before, the plan", old, {}), ("now, the plan", grouped, {})]
    if "--stages" in sys.argv:
        return rows + [
            (f"now, {s} splits, {d} stages", grouped, dict(splits=s, stages=d)) for s in (16, 22, 32) for d in (2, 3)
        ]
    rows += [(f"now, prefetch {k}", grouped, dict(prefetch=k)) for k in (-1, 2, 4)]
    if sweep:
        rows += [(f"now, prefetch {k}", grouped, dict(prefetch=k)) for k in (-2, 1, 6)]
        rows += [(f"now, 22 splits, prefetch {k}", grouped, dict(splits=22, prefetch=k)) for k in (0, -1, 4)]
        rows += [(f"now, 64-key tiles, prefetch {k}", grouped, dict(block_n=64, prefetch=k)) for k in (-1, 2)]
    return [(label, mod, kw) for label, mod, kw in rows if mod is not None]


def run(batch, n, sweep):
    (q, k, v, lens), want, time, sdpa0 = baseline(batch, n)
    rows = []
    for label, mod, kw in forms(batch, n, sweep):
        with tiles(mod, **kw):
            p = mod.plan(batch * KV_HEADS, n, q.device, group=3, head_dim=64)
            err = (mod.grouped_decode_attention(q, k, v, lens).float() - want).abs().max().item()
        if err > 0.05:
            print(f"  WRONG {label}: max error {err:.3g}")
            continue
        rows.append((label, mod, kw, p))
    times = {label: [] for label, *_ in rows} | {"SDPA": []}
    for _ in range(ROUNDS):
        times["SDPA"].append(time(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
        for label, mod, kw, _ in rows:
            with tiles(mod, **kw):
                times[label].append(time(lambda q, k, v, m, mod=mod: mod.grouped_decode_attention(q, k, v, m)))
    sdpa = statistics.median(times["SDPA"])
    print(f"  SDPA {sdpa:.2f} us (rounds {' '.join(f'{t:.2f}' for t in times['SDPA'])})")
    for label, _mod, _kw, p in sorted(rows, key=lambda r: statistics.median(times[r[0]])):
        t = statistics.median(times[label])
        spread = " ".join(f"{x:.2f}" for x in times[label])
        print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {label:34s} ({spread})  {tuple(p)}")
    at_plan = [r for r in rows if r[1] is grouped and set(r[2]) <= {"prefetch"}]  # the library at the plan's tiles
    return min(at_plan, key=lambda r: statistics.median(times[r[0]]))[2].get("prefetch", 0)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_early.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    args = sys.argv[1:]
    best = args[args.index("--best") + 1] if "--best" in args else None  # where to write the fastest prefetch
    shapes = [a for a in args if "x" in a] or ["8x4096"]
    for shape in shapes:
        fastest = run(*map(int, shape.split("x")), sweep=True)
        if best:
            with open(best, "w") as f:
                f.write(str(fastest))
    if "--others" in args:
        for shape in ("1x4096", "8x1024", "8x8192"):
            if shape not in shapes:
                run(*map(int, shape.split("x")), sweep=False)
