"""The KV-cache write of a decode step on a GPU next to PyTorch's indexed store (GB/s of K and V rows
written), the harness and its two timings in kernels.bench.

    python -m benchmarks.kv_cache [--dtype bfloat16] [--out kv_cache.md]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import torch

from kernels import kv_write
from kernels.bench import main, time_pair

HEADS, HEAD_DIM, CACHE = 12, 64, 1024  # GPT-2 small's heads, a cache of 1024 positions


def cases(device, dtype):
    for batch in (1, 8, 128):

        def make(b=batch):
            k, v = (torch.randn(b, HEADS, 1, HEAD_DIM, device=device, dtype=dtype) for _ in range(2))
            kc, vc = (torch.randn(b, HEADS, CACHE, HEAD_DIM, device=device, dtype=dtype) for _ in range(2))
            return k, v, kc, vc, torch.randint(0, CACHE, (b,), device=device, dtype=torch.int32)

        def theirs(k, v, kc, vc, lengths):
            rows = torch.arange(k.shape[0], device=k.device)
            positions = lengths.long()
            kc[rows, :, positions] = k[:, :, 0]
            vc[rows, :, positions] = v[:, :, 0]

        moved = 2 * 2 * batch * HEADS * HEAD_DIM * 2  # K and V rows, read and written
        cache_bytes = 2 * batch * HEADS * CACHE * HEAD_DIM * 2  # what a rotated input set holds
        row = time_pair(kv_write, theirs, make, cache_bytes)
        yield dict(kernel="kv_write", shape=f"B={batch} cache={CACHE}", unit="GB/s", work=moved / 1e9, **row)


GROUPS = {"kv_write": cases}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.kv_cache", __doc__)
