"""What compiling a tile sweep's kernels ahead, several at once, saves on a GPU (kernels.ahead):

    python -m experiments.compile_ahead [--kernel attention] [--threads 0 1 8 15] [--processes 4 8 15]

Each thread or process count runs in a fresh process with an empty Triton cache: the sweep's configs recorded,
compiled with that many threads in the process (0: not ahead; kernels.ahead.compile_ahead) or in that many
processes of their own (kernels.ahead.in_processes), then the whole sweep timed as the app runs it. The entries
the sweep itself added to Triton's cache say whether the compile ahead hit the same cache keys (0: every one).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _entries(folder: str) -> int:
    return sum(1 for p in Path(folder).iterdir() if p.is_dir())


def one(kernel: str, threads: int, processes: int = 0) -> dict:
    import torch

    from explorer.app.settings import SWEEP_SHAPES
    from explorer.measure import sweeps
    from kernels import ahead

    shape, dtype, device = SWEEP_SHAPES["cuda"][kernel], torch.float16, torch.device("cuda")
    cache = os.environ["TRITON_CACHE_DIR"]
    out = {"kernel": kernel, "threads": threads, "processes": processes}
    if threads or processes:
        sw = sweeps.sweep(kernel)
        inputs = sw.inputs(shape, dtype, device)
        configs = sweeps.grid_configs(kernel, None)
        start = time.perf_counter()
        launches = ahead.recorded([lambda c=c: sw.run(c, *inputs) for c in configs])
        out["record_s"] = time.perf_counter() - start
        done = ahead.in_processes(launches, processes) if processes else ahead.compile_ahead(launches, threads)
        out |= {"launches": done.launches, "ahead_s": done.seconds, "failed": len(done.failed)}
        torch.cuda.synchronize()
    before = _entries(cache)
    start = time.perf_counter()
    rows = list(sweeps.tile_sweep_rows(kernel, shape, dtype=dtype, device=device))
    out["sweep_s"] = time.perf_counter() - start
    out["configs"] = len(rows)
    out["valid"] = sum(r["valid"] for _, _, r in rows)
    out["compiled_in_sweep"] = _entries(cache) - before
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", default="attention")
    parser.add_argument("--threads", type=int, nargs="*", default=[0, 1, 8, 15])
    parser.add_argument("--processes", type=int, nargs="*", default=[])
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--in-processes", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from kernels.timing import require_cuda

    require_cuda("experiments.compile_ahead")
    if args.one is not None:
        print(json.dumps(one(args.kernel, args.one, args.in_processes)))
        return
    head = "| kernel | compiled ahead on | launches | record s | ahead s | sweep s | total s | compiled in sweep"
    print(head + " | valid |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    runs = [(n, 0, f"{n} threads" if n else "nothing (each where first launched)") for n in args.threads]
    runs += [(0, n, f"{n} processes") for n in args.processes]
    for threads, processes, said in runs:
        env = os.environ | {"TRITON_CACHE_DIR": tempfile.mkdtemp()}
        cmd = [sys.executable, "-m", "experiments.compile_ahead", "--kernel", args.kernel, "--one", str(threads)]
        done = subprocess.run(cmd + ["--in-processes", str(processes)], env=env, capture_output=True, text=True)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if not lines:
            print(f"| {args.kernel} | {said} | failed: {done.stderr.strip().splitlines()[-1:]} |")
            continue
        r = json.loads(lines[-1])
        total = r.get("record_s", 0) + r.get("ahead_s", 0) + r["sweep_s"]
        print(
            f"| {r['kernel']} | {said} | {r.get('launches', '')} | {r.get('record_s', 0):.2f} "
            f"| {r.get('ahead_s', 0):.1f} | {r['sweep_s']:.1f} | {total:.1f} | {r['compiled_in_sweep']} "
            f"| {r['valid']}/{r['configs']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
