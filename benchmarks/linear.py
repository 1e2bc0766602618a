"""The linear layer on a GPU next to cuBLAS (F.linear, then GELU or the residual add): prefill shapes in
TFLOP/s, decode shapes in GB/s of weights read; and the gated feed-forward's gate and up projections as one
matmul (SwiGLU) next to F.linear on the same fused weight, then silu(gate) * up; and a Llama decode step's two
fused projections (the decode rung's decode_linear) next to PyTorch's launches for the same work: RMSNorm, the
projection, SiLU(gate) * up, or rotary and the cache write. The harness and its two timings are in kernels.bench.

    python -m benchmarks.linear [--only prefill decode swiglu llama_decode] [--dtype bfloat16] [--out linear.md]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import torch

from kernels import decode_linear, linear, reference, swiglu
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


def llama_decode_cases(device, dtype):
    """SmolLM2-135M's decode projections at 1 and 8 sequences: ln_2 + c_fc (gate and up) + SwiGLU, and ln_1 + c_attn
    (9 query heads, 3 key/value heads of 64) + rotary + the write of K and V into a 1024-position cache."""
    k, f, heads, kv_heads, d, t_max, theta = 576, 1536, 9, 3, 64, 1024, 100000.0
    out = (heads + 2 * kv_heads) * d
    rand = lambda *shape: torch.randn(*shape, device=device, dtype=dtype)
    for rows in (1, 8):
        make = lambda rows=rows: (rand(rows, k), rand(2 * f, k) / k**0.5, rand(k) + 1)
        ours = lambda x, w, g: decode_linear(x, w, activation="swiglu", norm=(g, None, 1e-5))
        theirs = lambda x, w, g: reference.swiglu(reference.rms_norm(x, g), w)
        moved = 2 * (rows * k + 2 * f * k + k + rows * f)
        row = time_pair(ours, theirs, make, moved)
        yield dict(
            kernel="RMSNorm + gate/up + SwiGLU", shape=f"M={rows} {k}->2x{f}", unit="GB/s", work=moved / 1e9, **row
        )

        make = lambda rows=rows: (
            rand(rows, k),
            rand(out, k) / k**0.5,
            rand(k) + 1,
            rand(rows, kv_heads, t_max, d),
            rand(rows, kv_heads, t_max, d),
            torch.randint(0, t_max, (rows,), device=device),
        )
        ours = lambda x, w, g, kc, vc, n: decode_linear(x, w, norm=(g, None, 1e-5), kv=(kc, vc, n), rope=theta)

        def theirs(x, w, g, kc, vc, n, rows=rows):
            qkv = reference.linear(reference.rms_norm(x, g), w).view(rows, 1, -1, d).transpose(1, 2)
            q, k_new, v_new = qkv.split((heads, kv_heads, kv_heads), dim=1)
            q, k_new = (reference.rotary(t, n[:, None], theta) for t in (q, k_new))
            reference.kv_write(k_new, v_new, kc, vc, n)
            return q

        moved = 2 * (rows * k + out * k + k + rows * out + 2 * rows * kv_heads * d)
        row = time_pair(ours, theirs, make, moved)
        yield dict(
            kernel="RMSNorm + q/k/v + rotary + KV write",
            shape=f"M={rows} {k}->{out}",
            unit="GB/s",
            work=moved / 1e9,
            **row,
        )


GROUPS = {
    "prefill": lambda device, dtype: _cases(PREFILL, device, dtype),
    "decode": lambda device, dtype: _cases(DECODE, device, dtype),
    "swiglu": swiglu_cases,
    "llama_decode": llama_decode_cases,
}

if __name__ == "__main__":
    main(GROUPS, "python -m benchmarks.linear", __doc__)
