"""Prefill linear on a GPU: the tile kernel and the persistent form's tile rules next to cuBLAS.

    python -m experiments.linear_sweep [--rows 1024 4096 8192]

bf16, GPT-2 small's c_fc (768 -> 3072, bias and GELU) and c_proj (3072 -> 768, bias and residual).
Every row is kernels.timing.device_time (CUDA-graph replays, inputs rotated past L2) on the same
random inputs as the cuBLAS baseline (F.linear, then GELU or the residual add), measured in this run.
Each config is checked against the baseline before it is timed.
"""

import argparse

import torch

import kernels.matmul.kernel as L
from benchmarks.linear import linear_inputs
from kernels import TileConfig, reference, timing

RULES = [  # (block_m, block_n, block_k, stages, warps) for the persistent form
    (128, 256, 64, 3, 8),
    (128, 256, 64, 2, 8),
    (128, 256, 128, 2, 8),
    (128, 128, 64, 4, 8),
    (128, 128, 64, 4, 4),
    (128, 128, 128, 3, 8),
    (64, 256, 64, 4, 4),
    (64, 128, 64, 5, 4),
    (256, 128, 64, 3, 8),
]


def cases(rows_list):
    for rows in rows_list:
        yield "c_fc + GELU", rows, 768, 3072, "gelu", False
    yield "c_proj + residual", 4096, 3072, 768, None, True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="*", default=[1024, 4096, 8192])
    args = parser.parse_args()
    dev, dt = "cuda", torch.bfloat16
    print("| case | M | form and tiles (m, n, k, stages, warps) | ms | cuBLAS ms | vs cuBLAS |")
    print("|---|---:|---|---:|---:|---:|")
    for name, rows, k, n, act, res in cases(args.rows):
        make = lambda rows=rows, k=k, n=n: linear_inputs(rows, k, n, dev, dt)
        moved = 2 * (rows * k + n * k + rows * n * (2 if res else 1))
        sets = timing.rotated_inputs(make, bytes_per_set=moved)
        theirs = lambda x, w, b, r, act=act, res=res: reference.linear(
            x, w, b, activation=act, residual=r if res else None
        )
        base = timing.device_time(theirs, sets, bytes_per_set=moved).ms
        x, w, b, r = sets[0]
        want = theirs(x, w, b, r).float()
        forms = [("tile kernel, its defaults", False, None)]
        forms += [(f"persistent {rule}", True, rule) for rule in RULES]
        for label, persistent, rule in forms:
            cfg = None
            if rule:
                bm, bn, bk, stages, warps = rule
                cfg = TileConfig(
                    block_m=bm, block_n=bn, block_k=bk, group_m=8, split_k=1, num_warps=warps, num_stages=stages
                )
            ours = lambda x, w, b, r, act=act, res=res, cfg=cfg: L.linear(
                x, w, b, activation=act, residual=r if res else None, config=cfg
            )
            try:
                with L.forced_form(persistent):
                    err = (ours(x, w, b, r).float() - want).abs().max().item()
                    if err > 0.1:
                        raise AssertionError(f"max error {err:.3g} against cuBLAS")
                    ms = timing.device_time(ours, sets, bytes_per_set=moved).ms
            except Exception as e:  # a rule that does not fit this GPU is reported, the rest go on
                print(f"| {name} | {rows} | {label} | {type(e).__name__}: {str(e).splitlines()[0][:120]} | | |")
                continue
            print(f"| {name} | {rows} | {label} | {ms:.4f} | {base:.4f} | {base / ms:.2f}x |", flush=True)


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("experiments/linear_sweep.py")
    main()
