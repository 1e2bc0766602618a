"""Grouped decode attention's tile plan against its neighbours, through the launcher, at the benchmark's shapes.

    python -m experiments.grouped_plan [1x1024 1x4096 1x8192 8x1024 8x4096 8x8192]   (batch x keys)

SmolLM2's 9 query heads over 3 key/value heads, bf16, cold L2. For each shape: SDPA with enable_gqa, the plan's
default (kernels.ops.grouped_decode_attention.plan) and a plain read of the same bytes (read_floor.read), then key tiles
of 32, 64 and 128 in 1, 2 and 4 warps at the default split count and twice it, each checked against SDPA first;
the fastest ten are printed. Whether the default is the fastest, or within the run's noise of it, is what keeps
or changes the plan's rule.
"""

import itertools
import sys

import torch
import torch.nn.functional as F
import triton

from experiments.read_floor import read
from kernels import grouped_decode_attention
from kernels.ops.grouped_decode_attention import kernel as grouped
from kernels.timing import device_time, rotated_inputs

HEADS, KV_HEADS, D = 9, 3, 64


def baseline(batch, n):
    """Random inputs rotated past L2, SDPA's answer, a timer in µs over those inputs, and SDPA's time; prints SDPA,
    the plan's default and the fastest pure read of the same bytes. Returns (inputs, want, time, sdpa)."""

    def make():
        q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, KV_HEADS, n, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        return q, k, v, torch.full((batch,), n, device="cuda", dtype=torch.int32)

    kv_bytes = 4 * batch * KV_HEADS * n * D
    sets = rotated_inputs(make, bytes_per_set=kv_bytes)
    q, k, v, _ = sets[0]
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    time = lambda fn: device_time(fn, sets, bytes_per_set=kv_bytes).ms * 1e3
    sdpa = time(lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    ours = time(lambda q, k, v, n: grouped_decode_attention(q, k, v, n))
    floor = min(time(lambda q, k, v, n, c=c: read(k, v, *c)) for c in ((2048, 2, 4), (4096, 2, 8), (8192, 1, 8)))
    print(f"\nB={batch} keys={n}: SDPA {sdpa:.2f} us, ours today {ours:.2f} us ({sdpa / ours:.2f}x)", end="")
    print(f", read only {floor:.2f}")
    return sets[0], want, time, sdpa


def run(batch, n):
    (q, k, v, lens), want, time, sdpa = baseline(batch, n)  # prints SDPA, the plan's default and a plain read
    print(f"  the plan: {tuple(grouped.plan(batch * KV_HEADS, n, q.device))}")
    rows = []
    for block_n, warps, more in itertools.product((32, 64, 128), (1, 2, 4), (1, 2)):
        splits = grouped.plan(batch * KV_HEADS, n, q.device, block_n=block_n).splits * more
        kw = dict(block_n=block_n, split_k=splits, num_warps=warps)
        try:
            err = (grouped_decode_attention(q, k, v, lens, **kw).float() - want).abs().max().item()
            assert err < 0.05, f"max error {err}"
            rows.append((time(lambda q, k, v, m, kw=kw: grouped_decode_attention(q, k, v, m, **kw)), kw))
        except Exception as e:  # registers or shared memory the tile cannot have
            print(f"  {kw}: {type(e).__name__}: {str(e)[:80]}")
    for t, kw in sorted(rows, key=lambda r: r[0])[:10]:
        print(f"  {t:6.2f} us  {sdpa / t:.2f}x  {kw}  -> {tuple(grouped.plan(batch * KV_HEADS, n, q.device, **kw))}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_plan.py")
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    for shape in sys.argv[1:] or ["1x1024", "1x4096", "1x8192", "8x1024", "8x4096", "8x8192"]:
        run(*map(int, shape.split("x")))
