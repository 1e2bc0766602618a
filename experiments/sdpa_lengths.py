"""What PyTorch's scaled_dot_product_attention costs at a sequence length it has not seen before.

    python -m experiments.sdpa_lengths

Causal bf16 attention, 12 heads of 64, one call at each of 40 new lengths, then 10 repeated ones;
by default, with cuDNN's backend alone, and with it excluded. A backend that plans per shape pays
the plan at every step of a decode without a KV cache, where every step has a new length.
"""

import contextlib
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed_call_ms(t: int, backends) -> float:
    q = torch.randn(1, 12, t, 64, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with sdpa_kernel(backends) if backends else contextlib.nullcontext():
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main():
    choices = {
        "default": None,
        "cuDNN only": [SDPBackend.CUDNN_ATTENTION],
        "cuDNN excluded": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    }
    print("| backends | first call at a new length, median ms | max ms | repeated length, median ms |")
    print("|---|---:|---:|---:|")
    for i, (name, backends) in enumerate(choices.items()):
        lengths = range(100 * (i + 1), 100 * (i + 1) + 40)  # lengths no earlier choice has seen
        first = [timed_call_ms(t, backends) for t in lengths]
        again = [timed_call_ms(t, backends) for t in list(lengths)[:10]]
        print(f"| {name} | {statistics.median(first):.2f} | {max(first):.1f} | {statistics.median(again):.3f} |")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/sdpa_lengths.py")
    main()
