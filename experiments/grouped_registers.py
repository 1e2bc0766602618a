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
import sys

import torch
import triton

from experiments.grouped_depth import compare, tiles
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
    compare(batch, n, [(label, grouped, lambda a=ahead, kw=kw: form(a, **kw)) for label, ahead, kw in FORMS], 44)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_registers.py")
    if not hasattr(grouped, "AHEAD"):
        sys.exit("experiments/grouped_registers.py: the kernel has no AHEAD here; run it at 69dcdb7")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for shape in [a for a in sys.argv[1:] if "x" in a] or ["8x4096"]:
        run(*map(int, shape.split("x")))
