"""Grouped decode attention's loop at B=8 with its tiles loaded into registers one tile ahead, by plain loads,
next to the plan's pipeline (copies into shared memory, two tiles ahead), timed in turns with SDPA.

    python -m experiments.grouped_registers [8x4096 ...]   (batch x keys)

experiments.grouped_clock found a plain read's bytes arriving well before the loop's, and a split of one tile
(plain loads, every byte requested at once) getting its keys as early as the read. Here the split's whole tiles
are walked unrolled (grouped.AHEAD = -1: tile i + 1 requested before tile i's maths, no loop-carried tile), or
in the loop with one or two tiles carried in registers (AHEAD = 1, 2), in one pipeline stage (no copies through
shared memory), at several split counts and tiles. SmolLM2's 9 query heads over 3, bf16, cold L2, SDPA with
enable_gqa; each form is checked against SDPA first.

AHEAD is in the kernel at 69dcdb7 only: every form was slower than the plan on the H200 (RESULTS, twenty-seventh
run), and the next commit took it out. Run this at that commit.
"""

import contextlib
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

from experiments.grouped_depth import ROUNDS, tiles
from experiments.grouped_variants import KV_HEADS, baseline
from kernels.attn import grouped


@contextlib.contextmanager
def form(ahead=0, **kw):
    """The library's launcher with AHEAD set and plan()'s tiles replaced by kw's."""
    before = grouped.AHEAD
    grouped.AHEAD = ahead
    try:
        with tiles(grouped, **kw):
            yield
    finally:
        grouped.AHEAD = before


FORMS = [
    ("the plan", 0, {}),
    ("unrolled, 16 splits", -1, dict(stages=1)),
    ("unrolled, 22 splits", -1, dict(splits=22, stages=1)),
    ("unrolled, 32 splits", -1, dict(splits=32, stages=1)),
    ("unrolled, 11 splits", -1, dict(splits=11, stages=1)),
    ("unrolled, 16 splits, 2 warps", -1, dict(warps=2, stages=1)),
    ("unrolled, 64-key tiles in 2 warps", -1, dict(block_n=64, warps=2, stages=1)),
    ("unrolled, 64-key tiles in 4 warps", -1, dict(block_n=64, warps=4, stages=1)),
    ("unrolled, 64-key tiles in 2 warps, 32 splits", -1, dict(block_n=64, splits=32, warps=2, stages=1)),
    ("a tile ahead in the loop", 1, dict(stages=1)),
    ("two tiles ahead in the loop", 2, dict(stages=1)),
]


def run(batch, n):
    (q, k, v, lens), want, time, _ = baseline(batch, n)
    rows = []
    for label, ahead, kw in FORMS:
        with form(ahead, **kw):
            p = grouped.plan(batch * KV_HEADS, n, q.device, group=3, head_dim=64)
            try:
                err = (grouped.grouped_decode_attention(q, k, v, lens).float() - want).abs().max().item()
            except Exception as e:  # a tile the registers or shared memory cannot hold
                print(f"  {label}: {type(e).__name__}: {str(e)[:120]}")
                continue
        if err > 0.05:
            print(f"  WRONG {label}: max error {err:.3g}")
            continue
        rows.append((label, ahead, kw, p))
    times = {label: [] for label, *_ in rows} | {"SDPA": []}
    for _ in range(ROUNDS):
        times["SDPA"].append(time(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
        for label, ahead, kw, _ in rows:
            with form(ahead, **kw):
                times[label].append(time(lambda q, k, v, m: grouped.grouped_decode_attention(q, k, v, m)))
    sdpa = statistics.median(times["SDPA"])
    print(f"  SDPA {sdpa:.2f} us (rounds {' '.join(f'{t:.2f}' for t in times['SDPA'])})")
    for label, _ahead, _kw, p in sorted(rows, key=lambda r: statistics.median(times[r[0]])):
        t = statistics.median(times[label])
        spread = " ".join(f"{x:.2f}" for x in times[label])
        print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {label:44s} ({spread})  {tuple(p)}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_registers.py")
    if not hasattr(grouped, "AHEAD"):
        sys.exit("experiments/grouped_registers.py: the kernel has no AHEAD here; run it at 69dcdb7")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for shape in [a for a in sys.argv[1:] if "x" in a] or ["8x4096"]:
        run(*map(int, shape.split("x")))
