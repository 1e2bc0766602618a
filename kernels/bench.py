"""The harness of the per-operation benchmarks (benchmarks/attention.py, norm.py, rope.py,
linear.py, kv_cache.py; benchmarks/operations.py runs them all): each times our kernel next to what a user would pick
instead, on a GPU.

Every case runs ours and the PyTorch baseline in the same process on the same random inputs. Two
timings per kernel:
- device: kernels.timing.device_time, the one method the autotuner and the tile sweeps use too: the
  median over replays of a CUDA graph that calls the kernel once per input set, over enough random
  sets that together they exceed L2 several times, per call. This is the kernel's own time from
  memory (cold L2), free of Python launch overhead; the L2 column says "warm" where even the largest
  rotation fits in L2 (the smallest cases), so that number is an L2-resident one.
- eager: triton.testing.do_bench's median of plain calls (L2 flushed before each), launch overhead
  included.
The ratio is baseline time / our time: above 1.0 means ours is faster.
"""

import argparse
import datetime
import itertools

import torch

from . import timing
from .config import device_limits

EAGER_REGIME = "eager: triton.testing.do_bench median of plain calls, L2 flushed before each, launch overhead included"


def copy_bandwidth(device) -> float:
    """Device-to-device copy of 1 GiB, bytes read plus written over its device time: GB/s."""
    n = 1 << 28  # 1 GiB of fp32, far past any L2: one set is its own rotation
    t = timing.device_time(
        lambda src, dst: dst.copy_(src),
        lambda: (torch.randn(n, device=device), torch.empty(n, device=device)),
        reps=5,
    )
    return 2 * n * 4 / t.ms / 1e6


def time_pair(ours, theirs, make_inputs, bytes_per_set):
    """Ours and the baseline over the same rotated sets: device time (the one method) and eager time."""
    from triton.testing import do_bench

    sets = timing.rotated_inputs(make_inputs, bytes_per_set=bytes_per_set)
    row = {}
    for name, fn in (("ours", ours), ("torch", theirs)):
        t = timing.device_time(fn, sets, bytes_per_set=bytes_per_set)
        row[f"{name}_ms"] = t.ms
        cycle = itertools.cycle(sets)  # eager calls rotate through the same sets
        call = lambda fn=fn, cycle=cycle: fn(*next(cycle))
        row[f"{name}_eager_ms"] = do_bench(call, warmup=25, rep=100, return_mode="median")
    row["sets"], row["l2"], row["regime"] = t.sets, "cold" if t.regime == timing.COLD_REGIME else "warm", t.regime
    return row


def _guarded(cases, name):
    """Run the cases of one group; a case that fails is reported and the rest go on."""
    while True:
        try:
            yield next(cases)
        except StopIteration:
            return
        except Exception as e:
            print(f"| {name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:150]} |", flush=True)
            return


def run(groups: dict, dtype=torch.bfloat16) -> list[dict]:
    """Every case of each group ({name: cases(device, dtype)}), printed as it is measured."""
    device = torch.device("cuda")
    rows = []
    for name, cases in groups.items():
        for row in _guarded(cases(device, dtype), name):
            row["ours_rate"] = row["work"] / row["ours_ms"] * 1e3
            row["torch_rate"] = row["work"] / row["torch_ms"] * 1e3
            row["ratio"] = row["torch_ms"] / row["ours_ms"]
            row["eager_ratio"] = row["torch_eager_ms"] / row["ours_eager_ms"]
            print(_format_row(row), flush=True)
            rows.append(row)
    return rows


HEADER = (
    "| kernel | shape | L2 | input sets | ours ms | torch ms | ours | torch | speed-up (device) | speed-up (eager) |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
)
REGIMES = f"- device: {timing.COLD_REGIME}; the L2 column says warm where the rotated sets fit in it\n- {EAGER_REGIME}"


def _format_row(r):
    return (
        f"| {r['kernel']} | {r['shape']} | {r['l2']} | {r['sets']} | {r['ours_ms']:.4f} | {r['torch_ms']:.4f} | "
        f"{r['ours_rate']:.1f} {r['unit']} | {r['torch_rate']:.1f} {r['unit']} | "
        f"{r['ratio']:.2f}x | {r['eager_ratio']:.2f}x |"
    )


def main(groups: dict, prog: str, doc: str | None = None, argv=None) -> None:
    """The command line of a benchmark script: `prog [--dtype bfloat16] [--only NAME ...] [--out FILE]`."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--only", nargs="*", choices=list(groups), help="these groups of cases alone")
    parser.add_argument("--out", help="write the markdown table here (and its rows as JSON beside it)")
    args = parser.parse_args(argv)
    timing.require_cuda(prog)
    import triton

    limits = device_limits("cuda")
    bandwidth = copy_bandwidth("cuda")
    title = (
        f"{datetime.date.today()} · {limits.name} · torch {torch.__version__} · triton {triton.__version__} · "
        f"{args.dtype} · measured copy bandwidth {bandwidth:.0f} GB/s"
    )
    print(title)
    print(REGIMES)
    print(HEADER)
    picked = {name: cases for name, cases in groups.items() if not args.only or name in args.only}
    rows = run(picked, getattr(torch, args.dtype))
    text = "\n".join([title, "", REGIMES, "", HEADER, *map(_format_row, rows)])
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
        import json

        with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
            json.dump(dict(title=title, regimes=REGIMES, copy_gbs=bandwidth, rows=rows), f, indent=1)
