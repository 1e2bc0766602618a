"""The linear layer on a GPU next to cuBLAS (F.linear, then GELU or the residual add): prefill shapes in
TFLOP/s, decode shapes in GB/s of weights read; and the gated feed-forward's gate and up projections as one
matmul (SwiGLU) next to F.linear on the same fused weight, then silu(gate) * up. The harness and its two
timings are in kernels.bench.

    python -m benchmarks.linear [--only prefill decode swiglu] [--dtype bfloat16] [--out linear.md]
"""

import torch

from kernels import linear, reference, swiglu
from kernels.bench import main, time_pair

PREFILL = [  # (name, rows, in, out, activation, residual): GPT-2 small's c_fc and c_proj
    ("linear + GELU (c_fc)", 1024, 768, 3072, "gelu", False),
    ("linear + GELU (c_fc)", 4096, 768, 3072, "gelu", False),
    ("linear + GELU (c_fc)", 8192, 768, 3072, "gelu", False),
    ("linear + residual (c_proj)", 4096, 3072, 768, None, True),
]
DECODE = [
    ("linear decode (c_fc)", 1, 768, 3072, "gelu", False),
    ("linear decode (c_attn)", 1, 768, 2304, None, False),
    ("linear decode (c_fc)", 8, 768, 3072, "gelu", False),
    ("linear decode (lm_head)", 1, 768, 50257, None, False),
]


def linear_inputs(rows, k, n, device, dtype) -> tuple:
    """Random x (rows, k), weight (n, k) scaled as a layer's, bias (n,) and residual (rows, n)."""
    return (
        torch.randn(rows, k, device=device, dtype=dtype),
        torch.randn(n, k, device=device, dtype=dtype) / k**0.5,
        torch.randn(n, device=device, dtype=dtype),
        torch.randn(rows, n, device=device, dtype=dtype),
    )


def _cases(shapes, device, dtype):
    for name, rows, k, n, act, res in shapes:
        make = lambda rows=rows, k=k, n=n: linear_inputs(rows, k, n, device, dtype)
        ours = lambda x, w, b, r, act=act, res=res: linear(x, w, b, activation=act, residual=r if res else None)
        theirs = lambda x, w, b, r, act=act, res=res: reference.linear(
            x, w, b, activation=act, residual=r if res else None
        )
        moved = 2 * (rows * k + n * k + rows * n * (2 if res else 1))
        decode = rows <= 16
        work = moved / 1e9 if decode else 2 * rows * n * k / 1e12
        row = time_pair(ours, theirs, make, moved)
        yield dict(kernel=name, shape=f"M={rows} {k}->{n}", unit="GB/s" if decode else "TFLOP/s", work=work, **row)


def swiglu_cases(device, dtype):
    k, f = 576, 1536  # SmolLM2-135M's width and feed-forward
    for rows in (1, 8, 1024, 4096):
        make = lambda rows=rows: (
            torch.randn(rows, k, device=device, dtype=dtype),
            torch.randn(2 * f, k, device=device, dtype=dtype) / k**0.5,
        )
        moved = 2 * (rows * k + 2 * f * k + rows * f)
        decode = rows <= 16
        work = moved / 1e9 if decode else 4 * rows * f * k / 1e12
        row = time_pair(lambda x, w: swiglu(x, w), lambda x, w: reference.swiglu(x, w), make, moved)
        yield dict(
            kernel="swiglu gate+up",
            shape=f"M={rows} {k}->2x{f}",
            unit="GB/s" if decode else "TFLOP/s",
            work=work,
            **row,
        )


GROUPS = {
    "prefill": lambda device, dtype: _cases(PREFILL, device, dtype),
    "decode": lambda device, dtype: _cases(DECODE, device, dtype),
    "swiglu": swiglu_cases,
}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.linear", __doc__)
