"""Grouped decode attention's loop at B=8 at other split counts, pipeline depths and tiles than the plan's, timed
in turns with SDPA.

    python -m experiments.grouped_depth [8x4096 ...] [--others]   (batch x keys)

Splits of 16 (the plan's), 22 and 32 at B=8 and 4096 keys give 384 to 768 programs of one warp (22: four an SM,
one for each of its schedulers), in 2 and 3 pipeline stages (one or two tiles in flight). --others: the plan's
default before and now at 1x4096, 8x1024 and 8x8192. "before" is kernels/attn/grouped_head.py, a copy of the
module as it was that a run may carry (skipped where absent). At 511a509 the kernel also had an L2 prefetch of the
loop's rows (PREFETCH), which this experiment timed then; it was slower in every form and was taken out (RESULTS,
twenty-sixth run). SmolLM2's 9 query heads over 3, bf16, cold L2, SDPA with enable_gqa; each form is checked
against SDPA first.
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
def tiles(mod, block_n=None, splits=None, warps=None, stages=None):
    """mod's launcher at these tiles (None: the plan's), whatever its plan says."""
    plan, depth = mod.plan, mod.pipeline_stages
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


def forms(batch, n, sweep):
    rows = [("before", module("grouped_head"), {}), ("the plan", grouped, {})]
    if sweep:
        rows += [(f"{s} splits, {d} stages", grouped, dict(splits=s, stages=d)) for s in (16, 22, 32) for d in (2, 3)]
        rows += [("64-key tiles", grouped, dict(block_n=64)), ("32-key tiles in 2 warps", grouped, dict(warps=2))]
    return [(label, mod, kw) for label, mod, kw in rows if mod is not None]


def run(batch, n, sweep):
    rows = [(label, mod, lambda mod=mod, kw=kw: tiles(mod, **kw)) for label, mod, kw in forms(batch, n, sweep)]
    compare(batch, n, rows)


def compare(batch, n, rows, width=34):
    """Each (label, mod, enter) of rows checked against SDPA, then timed in ROUNDS turns with it: mod's launcher
    under the context enter() returns. Prints the medians, fastest first, with each form's plan."""
    (q, k, v, lens), want, time, _ = baseline(batch, n)
    kept = []
    for label, mod, enter in rows:
        with enter():
            p = mod.plan(batch * KV_HEADS, n, q.device, group=3, head_dim=64)
            try:
                err = (mod.grouped_decode_attention(q, k, v, lens).float() - want).abs().max().item()
            except Exception as e:  # a tile the registers or shared memory cannot hold
                print(f"  {label}: {type(e).__name__}: {str(e)[:120]}")
                continue
        if err > 0.05:
            print(f"  WRONG {label}: max error {err:.3g}")
            continue
        kept.append((label, mod, enter, p))
    times = {label: [] for label, *_ in kept} | {"SDPA": []}
    for _ in range(ROUNDS):
        times["SDPA"].append(time(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
        for label, mod, enter, _ in kept:
            with enter():
                times[label].append(time(lambda q, k, v, m, mod=mod: mod.grouped_decode_attention(q, k, v, m)))
    sdpa = statistics.median(times["SDPA"])
    print(f"  SDPA {sdpa:.2f} us (rounds {' '.join(f'{t:.2f}' for t in times['SDPA'])})")
    for label, *_, p in sorted(kept, key=lambda r: statistics.median(times[r[0]])):
        t = statistics.median(times[label])
        spread = " ".join(f"{x:.2f}" for x in times[label])
        print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {label:{width}s} ({spread})  {tuple(p)}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_depth.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    args = sys.argv[1:]
    shapes = [a for a in args if "x" in a] or ["8x4096"]
    for shape in shapes:
        run(*map(int, shape.split("x")), sweep=True)
    if "--others" in args:
        for shape in ("1x4096", "8x1024", "8x8192"):
            if shape not in shapes:
                run(*map(int, shape.split("x")), sweep=False)
