"""How much compiling stands between a fresh GPU server and each first click, counted without a GPU:

    python -m experiments.compile_volume [--arch 90] [--dtype bfloat16] [--compile]

Each job a GPU's warm-up runs and each first click the page benchmark makes (the default Generate and ladder, the
bundled Llama, the shapes, the default tile sweep, the lessons that compile kernels of their own) is run on CPU
tensors with its launches recorded instead of run (kernels.ahead), in a process where the CPU stands for the GPU
`--arch` (its tile rules). For each: its distinct launches, and those no job before it needed. With --compile,
each new launch is compiled for that GPU here (Triton compiles without one), one after another: the seconds of
compiling each job adds, on this CPU. Run without TRITON_INTERPRET.
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def calls(dtype: str) -> dict:
    """The jobs, by name, in the order a fresh server meets them: its warm-up's, then the helpers' tasks."""
    import torch

    from explorer.app import lessons, models, settings
    from explorer.app.jobs import precompile, warm
    from explorer.measure import sweeps

    s = settings.default_run("cuda", dtype)
    out = precompile.own_calls(s, warm.llama_runs(s))
    out["shapes"] = lambda: warm.warm_shapes(models.dtype_of(dtype))
    kernel, shape = settings.default_sweep("cuda")
    out[f"sweep ({kernel})"] = lambda: sweeps.sweep_launches(
        kernel, shape, dtype=models.dtype_of(dtype), device=torch.device("cpu")
    )
    for name in warm.COMPILING_LESSONS:
        lesson = lessons.LESSONS[name]
        out[f"lesson {name}"] = lambda lesson=lesson: lesson.measure(lesson.settings("gpu"))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    from kernels.config import STANDS_FOR

    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this records launches for a real GPU")
    if os.environ.get(STANDS_FOR) != str(args.arch):  # the tile rules read the device once: a process of its own
        env = os.environ | {STANDS_FOR: str(args.arch)}
        sys.exit(
            subprocess.run([sys.executable, "-m", "experiments.compile_volume", *sys.argv[1:]], env=env).returncode
        )

    from explorer.app.jobs import precompile
    from kernels import ahead, compile_check

    seen = set()
    print(f"| job | launches | distinct | new | {'compile s (this CPU) |' if args.compile else ''}")
    print(f"|---|---:|---:|---:|{'---:|' if args.compile else ''}")
    totals = [0, 0, 0.0]
    for name, call in calls(args.dtype).items():
        launches, whole, stopped = precompile.record({name: call})
        distinct = ahead.distinct(launches)
        new = [item for item in distinct if ahead.key(item) not in seen]
        seen |= {ahead.key(item) for item in new}
        seconds = 0.0
        if args.compile:
            t0 = time.perf_counter()
            for fn, a, kw, _ in new:
                compile_check.build(fn, a, kw, args.arch)
            seconds = time.perf_counter() - t0
        note = f" (stopped: {stopped[0]})" if stopped else ""
        tail = f" {seconds:.1f} |" if args.compile else ""
        print(f"| {name}{note} | {len(launches)} | {len(distinct)} | {len(new)} |{tail}", flush=True)
        totals = [totals[0] + len(distinct), totals[1] + len(new), totals[2] + seconds]
    tail = f" {totals[2]:.1f} |" if args.compile else ""
    print(f"| all | | {totals[0]} | {totals[1]} |{tail}")


if __name__ == "__main__":
    main()
