"""A whole decode step's bytes, modeled and counted by Nsight Compute, for GPT-2 small's shape and SmolLM2-135M's.

    python -m benchmarks.step_bytes [--context 1000] [--rungs epilogue overlap]

The parent runs itself again under ncu with kernels.ncu_check's counters and L2 flush: the child builds both
models with random weights in bf16 (benchmarks.ladder.random_hf), fills each cache with random keys and values up
to `context`, warms each rung's step, then runs flush, step, flush, ... inside the profiled range. A step's
counted bytes are the sums over every kernel it launches (the cache's small bookkeeping kernels included); its
modeled bytes are the same step's operations through explorer.measure.traffic, at HBM and at the SMs' requests
(checked against the L1 counter, as ncu_check does). Needs a CUDA GPU and ncu.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

import argparse

import torch

from kernels import ncu_check

FAMILIES = ("gpt2", "llama")
MB = 1e6


def _steps(context: int, rungs):
    """[(family, rung, step function, model's traffic)] for every family and rung, on the GPU."""
    from benchmarks.ladder import random_hf
    from explorer.measure.ladder import reset, step_total, traced_step
    from explorer.model.weights import config_from_hf, from_hf_state_dict

    out = []
    for family in FAMILIES:
        torch.manual_seed(0)
        hf, _ = random_hf(family)
        base = from_hf_state_dict(config_from_hf(hf.config), hf.state_dict(), device="cuda", dtype=torch.bfloat16)
        del hf
        for rung in rungs:
            model = base.with_fusion(rung)
            cache, ids, ops, _ = traced_step(model, context)
            total = step_total(ops, context, 1)

            def step(model=model, cache=cache, ids=ids):
                reset(cache, context)
                model.decode(ids, cache)

            out.append((family, rung, step, total))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--rungs", nargs="+", default=["epilogue", "overlap"])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        ncu_check.profile_between_flushes([step for _, _, step, _ in _steps(args.context, args.rungs)])
        return 0
    missing = ncu_check.missing_tools()
    if missing:
        print("step_bytes: needs " + " and ".join(missing), file=sys.stderr)
        return 2
    child = ["-m", "benchmarks.step_bytes", "--child", "--context", str(args.context), "--rungs", *args.rungs]
    steps = _steps(args.context, args.rungs)  # the models' numbers, here (the child's are the same shapes)
    counted = ncu_check.attribute(ncu_check.parse_ncu_csv(ncu_check.run_ncu(child)), len(steps))
    print(f"\n{torch.cuda.get_device_name()} · bf16 · batch 1 · one decode step at context {args.context}")
    print(
        "\n| model, rung | kernels | HBM MB counted | HBM MB modeled | vs counter | SM requests MB counted (L1) "
        "| modeled | vs counter |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    for (family, rung, _, t), c in zip(steps, counted, strict=True):
        hbm = c["dram_read"] + c["dram_write"] + c["dram_write_back"]
        req = c["l1_read"] + c["l1_write"]
        name = {"gpt2": "GPT-2 small", "llama": "SmolLM2-135M"}[family]
        print(
            f"| {name}, {rung} | {len(c['kernels'])} | {hbm / MB:.1f} | {t.hbm_bytes / MB:.1f} | "
            f"{100 * (t.hbm_bytes - hbm) / hbm:+.1f}% | {req / MB:.1f} | {t.bytes / MB:.1f} | "
            f"{100 * (t.bytes - req) / req:+.1f}% |"
        )
    return 0


if __name__ == "__main__":
    from kernels.timing import require_cuda

    require_cuda("benchmarks/step_bytes.py")
    sys.exit(main())
