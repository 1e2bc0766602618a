"""Record the tile sweep of every kernel at its default GPU shape on this GPU, for the sweep tab of a visitor
without one (the interpreter's heatmap beside this GPU's):

    python scripts/record_sweeps.py [--out assets/recorded/sweeps_h200.json] [--dtype bfloat16]

Each kernel's grid is the sweep tab's, at the shape the tab offers on a GPU (settings.SWEEP_SHAPES["cuda"]),
timed as the tab times it: CUDA-graph replays over inputs rotated past the L2 (kernels.timing), and each
config's first kernel placed on the GPU's SMs (registers, programs per SM and what limits them, waves:
kernels.occupancy). One process per kernel compiles its grid first, side by side; then one process times every
kernel's grid alone on the GPU, and that is what is kept.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere


def sweep(kernel: str, dtype: str):
    import torch

    from explorer.app.settings import SWEEP_SHAPES
    from explorer.measure import sweeps

    shape = SWEEP_SHAPES["cuda"][kernel]
    major, minor = torch.cuda.get_device_capability()
    arch = major * 10 + minor  # each config's first kernel placed on this GPU's SMs too (kernels.occupancy)
    rows = sweeps.tile_sweep_rows(kernel, shape, dtype=getattr(torch, dtype), device="cuda", arch=arch)
    rows = [row for _, _, row in rows]
    return sweeps.sweep_frame(kernel, shape, rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the JSON file (default: assets/recorded/sweeps_<gpu>.json)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--kernels", nargs="*", help="kernels to sweep (default: every kernel the tab offers)")
    parser.add_argument("--no-compile-first", action="store_true", help="time as each config compiles")
    parser.add_argument("--warm", help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        from kernels.timing import require_cuda

        require_cuda("record_sweeps")
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="sweeps-"))
    if args.warm:
        sweep(args.warm, args.dtype)
        return

    from explorer.app import gpu_sweeps, recordings
    from explorer.app.lessons import recorded
    from explorer.app.settings import SWEEP_SHAPES

    names = args.kernels or list(SWEEP_SHAPES["cuda"])
    t0 = time.perf_counter()
    if not args.no_compile_first:
        me = [sys.executable, str(Path(__file__).resolve()), "--dtype", args.dtype]
        procs = [subprocess.Popen([*me, "--warm", name]) for name in names]
        for p in procs:
            p.wait()
        print(f"compiled in {time.perf_counter() - t0:.0f} s, a process per kernel", flush=True)
    frames = {}
    for name in names:
        t = time.perf_counter()
        frames[name] = sweep(name, args.dtype)
        valid = frames[name][frames[name].valid]
        best = valid.loc[valid.ms.idxmin()] if len(valid) else None
        fastest = f"fastest {best.ms * 1e3:.1f} us" if best is not None else "no valid config"
        print(f"{name}: {len(valid)} of {len(frames[name])} configs ran, {fastest} ({time.perf_counter() - t:.0f} s)")
    meta = dict(
        **recordings.stamp("python scripts/record_sweeps.py"),
        dtype=args.dtype,
        seconds=round(time.perf_counter() - t0, 1),
    )
    out = Path(args.out) if args.out else recordings.FOLDER / f"sweeps_{recorded.slug(meta['gpu'])}.json"
    path = gpu_sweeps.save(out, meta, frames)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)", flush=True)


if __name__ == "__main__":
    main()
