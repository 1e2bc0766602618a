"""Attention on a GPU next to PyTorch's scaled_dot_product_attention: causal prefill (TFLOP/s), decode over a
cache (GB/s of K and V read), and both with grouped-query heads (SmolLM2's 9 over 3, PyTorch's enable_gqa).
The harness and its two timings are in kernels.bench.

    python -m benchmarks.attention [--only prefill decode grouped grouped_prefill] [--out attention.md]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import torch
import torch.nn.functional as F

from kernels import attention, decode_attention, grouped_attention, grouped_decode_attention
from kernels.bench import main, time_pair

HEADS, HEAD_DIM = 12, 64  # GPT-2 small's


def prefill_cases(device, dtype):
    for batch in (1, 8):
        for n in (128, 512, 1024, 4096):
            make = lambda b=batch, n=n: [
                torch.randn(b, HEADS, n, HEAD_DIM, device=device, dtype=dtype) for _ in range(3)
            ]
            flops = 4 * batch * HEADS * HEAD_DIM * n * (n + 1) // 2
            row = time_pair(
                lambda q, k, v: attention(q, k, v),
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                make,
                4 * batch * HEADS * n * HEAD_DIM * 2,
            )
            yield dict(
                kernel="attention (prefill, causal)", shape=f"B={batch} N={n}", unit="TFLOP/s", work=flops / 1e12, **row
            )


def _decode_cases(device, dtype, shapes, heads, kv_heads, ours, theirs, name):
    """One query per sequence and head over a full cache of kv_heads heads: ours next to theirs."""
    for batch, n in shapes:

        def make(b=batch, n=n):
            q = torch.randn(b, heads, 1, HEAD_DIM, device=device, dtype=dtype)
            k, v = (torch.randn(b, kv_heads, n, HEAD_DIM, device=device, dtype=dtype) for _ in range(2))
            return q, k, v, torch.full((b,), n, device=device, dtype=torch.int32)

        kv_bytes = 2 * batch * kv_heads * n * HEAD_DIM * 2
        row = time_pair(ours, theirs, make, kv_bytes)
        yield dict(kernel=name, shape=f"B={batch} cache={n}", unit="GB/s", work=kv_bytes / 1e9, **row)


def decode_cases(device, dtype):
    # Splits of one key tile (B=1 up to 8192 keys), and of several that loop (longer caches, larger batches).
    shapes = ((1, 1024), (1, 8192), (1, 32768), (8, 1024), (8, 8192), (32, 2048))
    ours = lambda q, k, v, lens: decode_attention(q, k, v, lens)
    theirs = lambda q, k, v, lens: F.scaled_dot_product_attention(q, k, v)
    return _decode_cases(device, dtype, shapes, HEADS, HEADS, ours, theirs, "decode attention")


def grouped_cases(device, dtype):
    shapes = ((1, 1024), (1, 4096), (1, 8192), (8, 1024), (8, 4096), (8, 8192))
    ours = lambda q, k, v, lens: grouped_decode_attention(q, k, v, lens)
    theirs = lambda q, k, v, lens: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return _decode_cases(device, dtype, shapes, 9, 3, ours, theirs, "decode attention, 9 heads over 3")  # SmolLM2's


def grouped_prefill_cases(device, dtype):
    heads, kv_heads = 9, 3  # SmolLM2-135M's
    for batch, n in ((1, 1024), (4, 4096)):
        make = lambda b=batch, n=n: [
            torch.randn(b, h, n, HEAD_DIM, device=device, dtype=dtype) for h in (heads, kv_heads, kv_heads)
        ]
        flops = 4 * batch * heads * HEAD_DIM * n * (n + 1) // 2
        row = time_pair(
            lambda q, k, v: grouped_attention(q, k, v),
            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
            make,
            2 * batch * (heads + 2 * kv_heads) * n * HEAD_DIM * 2,
        )
        yield dict(
            kernel="attention (prefill, causal), 9 heads over 3",
            shape=f"B={batch} N={n}",
            unit="TFLOP/s",
            work=flops / 1e12,
            **row,
        )


GROUPS = {
    "prefill": prefill_cases,
    "decode": decode_cases,
    "grouped": grouped_cases,
    "grouped_prefill": grouped_prefill_cases,
}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.attention", __doc__)
