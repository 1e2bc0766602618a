"""Rotary position embedding on a GPU next to PyTorch's (Llama's rotate_half form on a cos/sin table made for
the same positions), over SmolLM2's 9 query heads of 64 (GB/s of rows read and written). The harness and its
two timings are in kernels.bench.

    python -m benchmarks.rope [--dtype bfloat16] [--out rope.md]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import torch

from kernels import reference, rotary
from kernels.bench import main, time_pair

HEADS, HEAD_DIM, THETA = 9, 64, 100000.0  # SmolLM2-135M's


def cases(device, dtype):
    for batch, tokens in ((1, 1), (8, 1), (1, 1024), (4, 4096)):

        def make(b=batch, t=tokens):
            x = torch.randn(b, HEADS, t, HEAD_DIM, device=device, dtype=dtype)
            return x, torch.arange(t, device=device)[None, :].expand(b, t).contiguous()

        moved = 2 * batch * HEADS * tokens * HEAD_DIM * 2  # every row read and written once
        row = time_pair(
            lambda x, p: rotary(x, p, THETA),
            lambda x, p: reference.rotary(x, p, THETA),
            make,
            moved,
        )
        yield dict(kernel="rotary", shape=f"B={batch} T={tokens}", unit="GB/s", work=moved / 1e9, **row)


GROUPS = {"rotary": cases}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.rope", __doc__)
