"""LayerNorm on a GPU next to PyTorch's, alone and with the residual add fused (GB/s of rows read and
written), the harness and its two timings in kernels.bench.

    python -m benchmarks.layer_norm [--dtype bfloat16] [--out layer_norm.md]
"""

import torch
import torch.nn.functional as F

from kernels import layer_norm, reference
from kernels.bench import main, time_pair

WIDTH = 768  # GPT-2 small's


def cases(device, dtype):
    for rows in (1, 4096, 8 * 1024):
        for residual in (False, True):

            def make(rows=rows):
                pair = [torch.randn(rows, WIDTH, device=device, dtype=dtype) for _ in range(2)]
                return pair + [torch.randn(WIDTH, device=device, dtype=dtype) for _ in range(2)]

            moved = rows * WIDTH * 2 * (4 if residual else 2)
            if residual:
                ours = lambda x, r, w, b: layer_norm(x, w, b, residual=r)
                theirs = lambda x, r, w, b: reference.layer_norm(x, w, b, residual=r)
            else:
                ours = lambda x, r, w, b: layer_norm(x, w, b)
                theirs = lambda x, r, w, b: F.layer_norm(x, (WIDTH,), w, b)
            name = "layernorm + residual add" if residual else "layernorm"
            row = time_pair(ours, theirs, make, moved)
            yield dict(kernel=name, shape=f"{rows}x{WIDTH}", unit="GB/s", work=moved / 1e9, **row)


GROUPS = {"layer_norm": cases}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.layer_norm", __doc__)
