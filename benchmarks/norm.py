"""The row normalisations on a GPU next to PyTorch's, alone and with the residual add fused (GB/s of rows
read and written): LayerNorm at GPT-2 small's width, RMSNorm at SmolLM2's (576). The harness and its two
timings are in kernels.bench.

    python -m benchmarks.norm [--only layer_norm rms_norm] [--dtype bfloat16] [--out norm.md]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import torch
import torch.nn.functional as F

from kernels import layer_norm, reference, rms_norm
from kernels.bench import main, time_pair

WIDTH = 768  # GPT-2 small's
RMS_WIDTH = 576  # SmolLM2-135M's


def layer_norm_cases(device, dtype):
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


def rms_norm_cases(device, dtype):
    for rows in (1, 4096, 8 * 1024):
        for residual in (False, True):

            def make(rows=rows):
                pair = [torch.randn(rows, RMS_WIDTH, device=device, dtype=dtype) for _ in range(2)]
                return [*pair, torch.randn(RMS_WIDTH, device=device, dtype=dtype)]

            moved = rows * RMS_WIDTH * 2 * (4 if residual else 2)
            if residual:
                ours = lambda x, r, w: rms_norm(x, w, residual=r)
                theirs = lambda x, r, w: reference.rms_norm(x, w, residual=r)
            else:
                ours = lambda x, r, w: rms_norm(x, w)
                theirs = lambda x, r, w: reference.rms_norm(x, w)
            name = "rmsnorm + residual add" if residual else "rmsnorm"
            row = time_pair(ours, theirs, make, moved)
            yield dict(kernel=name, shape=f"{rows}x{RMS_WIDTH}", unit="GB/s", work=moved / 1e9, **row)


GROUPS = {"layer_norm": layer_norm_cases, "rms_norm": rms_norm_cases}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.norm", __doc__)
