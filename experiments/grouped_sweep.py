"""Which tiles suit grouped-query attention on this GPU: decode (splits of the keys, keys per tile) and prefill
(rows per query tile, keys per tile, warps), each next to SDPA with enable_gqa in the same run, at SmolLM2's
9 query heads over 3 key/value heads of 64.

    python -m experiments.grouped_sweep [decode] [prefill]
"""

import itertools
import sys

import torch
import torch.nn.functional as F

from kernels import grouped_attention, grouped_decode_attention
from kernels.timing import device_time, rotated_inputs

HEADS, KV_HEADS, D = 9, 3, 64


def decode(batch, n, dtype):
    def make():
        q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, KV_HEADS, n, D, device="cuda", dtype=dtype) for _ in range(2))
        return q, k, v, torch.full((batch,), n, device="cuda", dtype=torch.int32)

    inputs = rotated_inputs(make, bytes_per_set=4 * batch * KV_HEADS * n * D)
    sdpa = device_time(lambda q, k, v, n: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), inputs).ms
    rows = [("default", device_time(lambda q, k, v, n: grouped_decode_attention(q, k, v, n), inputs).ms)]
    for split, block_n in itertools.product((4, 8, 16, 32, 64), (32, 64, 128, 256)):
        if split * block_n > 4 * n:
            continue
        fn = lambda q, k, v, m, s=split, b=block_n: grouped_decode_attention(q, k, v, m, block_n=b, split_k=s)
        rows.append((f"split {split} block_n {block_n}", device_time(fn, inputs).ms))
    report(f"decode B={batch} keys={n}", sdpa, rows)


def prefill(batch, n, dtype):
    def make():
        return [torch.randn(batch, h, n, D, device="cuda", dtype=dtype) for h in (HEADS, KV_HEADS, KV_HEADS)]

    inputs = rotated_inputs(make, bytes_per_set=2 * batch * (HEADS + 2 * KV_HEADS) * n * D * 2)
    sdpa = device_time(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), inputs)
    rows = [("default", device_time(lambda q, k, v: grouped_attention(q, k, v), inputs).ms)]
    for block_m, block_n, warps in itertools.product((32, 64, 128), (32, 64, 128), (4, 8)):
        fn = lambda q, k, v, m=block_m, b=block_n, w=warps: grouped_attention(
            q, k, v, block_m=m, block_n=b, num_warps=w
        )
        try:
            rows.append((f"rows {block_m} block_n {block_n} warps {warps}", device_time(fn, inputs).ms))
        except Exception as e:  # a tile the shared memory cannot hold
            print(f"  rows {block_m} block_n {block_n} warps {warps}: {type(e).__name__}")
    report(f"prefill B={batch} N={n}", sdpa.ms, rows)


def report(title, sdpa, rows):
    print(f"\n{title}: SDPA (enable_gqa) {sdpa * 1e3:.2f} us")
    for name, ms in sorted(rows, key=lambda r: r[1])[:8]:
        print(f"  {name:32s} {ms * 1e3:8.2f} us  {sdpa / ms:5.2f}x SDPA")
    default = dict(rows)["default"]
    print(f"  {'default':32s} {default * 1e3:8.2f} us  {sdpa / default:5.2f}x SDPA")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/grouped_sweep.py")
    print(torch.cuda.get_device_name(), torch.__version__)
    parts = sys.argv[1:] or ["decode", "prefill"]
    if "decode" in parts:
        for batch, n in ((1, 4096), (8, 4096), (1, 1024), (1, 8192), (8, 1024)):
            decode(batch, n, torch.bfloat16)
    if "prefill" in parts:
        for batch, n in ((1, 1024), (4, 4096)):
            prefill(batch, n, torch.bfloat16)
