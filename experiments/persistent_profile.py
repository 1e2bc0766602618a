"""Where a persistent decode layer's time goes: each program's global-timer stamps at its stage boundaries.

    python -m experiments.persistent_profile [--context 1000] [--layers 12]

GPU only. GPT-2 small's block shape, random bf16 weights for `layers` blocks (together past the L2, as in a
step), batch 1, caches holding `context` random rows. Each block's launch stamps, per program, the global timer
at: its start, the end of its stage-0 items, before its arrival at each stage counter, and before the last
arrival. Printed per point, in µs from the earliest start in that launch: the first and the last program to
get there (medians over the blocks). A stage's time on the critical path is the gap between the last arrivals.
"""

import argparse
import statistics

import torch

import kernels.ops.decode_layer.kernel as DL

POINTS = [
    "start",
    "stage 0 items done (ln_1 + c_attn + KV write)",
    "arrival 0 (after the PDL wait)",
    "arrival 1 (attention done)",
    "arrival 2 (c_proj + residual done)",
    "arrival 3 (ln_2 + c_fc + GELU done)",
    "last arrival (mlp.c_proj + residual done)",
]


def block(width, heads, max_len, context, dtype):
    def w(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype) * 0.02

    params = [
        (1 + w(width), w(width)),
        (w(3 * width, width), w(3 * width)),
        (w(width, width), w(width)),
        (1 + w(width), w(width)),
        (w(4 * width, width), w(4 * width)),
        (w(width, 4 * width), w(width)),
    ]
    k, v = (torch.randn(1, heads, max_len, width // heads, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.tensor([context], device="cuda", dtype=torch.int32)
    return params, (k, v, lengths, lengths + 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--attention-tile", type=int, default=DL.ATTENTION_TILE)
    args = parser.parse_args()
    with DL.varied(DL.Variant(attention_tile=args.attention_tile)):
        profile(args)


def profile(args):
    """The stamps of `layers` blocks, each one decode_layer launch, after two rounds that compile."""
    width, heads, max_len, dtype = 768, 12, 1024, torch.bfloat16
    blocks = [block(width, heads, max_len, args.context, dtype) for _ in range(args.layers)]
    x = torch.randn(1, 1, width, device="cuda", dtype=dtype)
    p = DL.plan(1, width, heads, max_len, dtype, x.device)
    print(f"{p['programs']} programs; tiles {p['tiles']}; attention {p['splits']} splits of {p['chunk']} keys")
    stamps = [torch.zeros(p["programs"], 8, device="cuda", dtype=torch.int64) for _ in blocks]
    for _ in range(3):  # the first round compiles
        h = x
        for i, (params, kv) in enumerate(blocks):
            h = DL.decode_layer(h, *params, kv, stamps=stamps[i])
        torch.cuda.synchronize()
    print("| point | first program (µs) | last program (µs) |\n|---|---:|---:|")
    firsts, lasts = [[] for _ in POINTS], [[] for _ in POINTS]
    for s in stamps:
        t = (s[:, : len(POINTS)] - s[:, 0].min()).double() / 1e3
        for k in range(len(POINTS)):
            firsts[k].append(t[:, k].min().item())
            lasts[k].append(t[:, k].max().item())
    for k, name in enumerate(POINTS):
        print(f"| {name} | {statistics.median(firsts[k]):.2f} | {statistics.median(lasts[k]):.2f} |")
    print(f"\n{torch.cuda.get_device_name()} · torch {torch.__version__} · context {args.context}")


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/persistent_profile.py")
    main()
