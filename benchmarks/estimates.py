"""Each Generate's estimate against the time it took, for random settings on CPU (Triton's interpreter); with
--sweeps, each kernel's default tile sweep's instead.

    TRITON_INTERPRET=1 python -m benchmarks.estimates [--runs 20] [--seed 0] [--most-s 45]
    TRITON_INTERPRET=1 python -m benchmarks.estimates --sweeps

Draws settings from the settings table (explorer.app.settings: the model, dtype, rung, batch, cache and every
tile control), small enough for the interpreter: a short prompt and a few new tokens. A draw the run would refuse
(tiles this device cannot run) is drawn again, and so is one whose estimate is above --most-s: the app refuses
what is over its budget, and this keeps the whole benchmark within minutes on a 2-core machine (how many were
redrawn is printed). Each runs in this process as the server's worker runs it (explorer.app.jobs.generate), numpy's
BLAS on one thread (below), and its time is recorded for the next estimate as the server records it
(estimate.record, by its settings). Prints estimate, measured and their ratio per run, and exits non-zero if any
is off by more than --within (2x).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file from any directory too

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
# One BLAS thread, before numpy is first imported: the interpreter's tl.dot is a numpy matmul, and on a 2-core machine
# another process keeps busy OpenBLAS's threads spin waiting for each other: a float16 Generate then took 2.5-7x its
# float32 twin (10.7-27 s against 4.1 s; 4.9-6.5 s against 4.6-6.1 s with one thread, 2026-12-04), which no estimate
# of the run's own work can foresee. The server's worker runs with one too (supervisor.py).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def draw(rng: random.Random, models: list[str]):
    """One random setting of the table's fields, sized for the interpreter."""
    from explorer.app import settings
    from explorer.model.ops import FUSIONS

    tiles = {}
    for kernel, fields in settings.TILE_CHOICES.items():
        for name, values in fields.items():
            if rng.random() < 0.25:
                tiles[f"{kernel}_{name}"] = str(rng.choice(values))
    return settings.RunSettings(
        model=rng.choice(models),
        prompt_tokens=rng.randint(4, 24),
        new_tokens=rng.randint(2, 6),
        batch=rng.choice([1, 1, 2, 3]),
        dtype=rng.choice(["float32", "float16"]),
        fusion=rng.choice(FUSIONS),
        cache=rng.random() < 0.75,
        temperature=0.0,
        tiles=settings.tiles_from(tiles),
    )


def runs_here(s) -> bool:
    """Whether the run would start: its tiles fit this device at its shapes (the job's own checks)."""
    from explorer.app.errors import UserError
    from explorer.app.jobs import generate

    try:
        generate.prepare(s)
    except (ValueError, UserError):
        return False
    return True


def measure(s) -> float:
    """The run's seconds as the server records them: the job's own, its model's first load left out."""
    from explorer.app.jobs import generate
    from explorer.app.jobs.base import Control

    control = Control(lambda: False, time.monotonic() + 3600)
    ran = None
    for update in generate.run(dict(settings=s, started=time.time()), control):
        ran = update.get("ran_s", ran)
    return ran


def describe(s) -> str:
    tiles = {k: v for k, v in vars(s.tiles).items() if v is not None}
    shown = " ".join(
        f"{k}={'x'.join(f'{f}{getattr(c, f)}' for f in FIELDS if getattr(c, f))}" for k, c in tiles.items()
    )
    cache = "" if s.cache else " cache-off"
    return f"{s.model} {s.dtype} {s.fusion} b{s.batch} p{s.prompt_tokens}+{s.new_tokens}{cache} {shown}".strip()


FIELDS = ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages")


def sweeps(within: float) -> int:
    """Every kernel's sweep at the sweep tab's CPU shape, timed in this process (as the worker runs it), beside
    its estimate."""
    import torch

    from explorer.app import estimate
    from explorer.app.settings import SWEEP_SHAPES
    from explorer.measure import sweeps as tile_sweeps

    rows = []
    print(f"{'estimate s':>10} {'measured s':>10} {'ratio':>6}  kernel at shape", flush=True)
    for kernel, shape in SWEEP_SHAPES["cpu"].items():
        guess = estimate.sweep_s(kernel, shape, "cpu")
        t = time.perf_counter()
        for _ in tile_sweeps.tile_sweep_rows(kernel, shape, dtype=torch.float32, device="cpu"):
            pass
        took = time.perf_counter() - t
        rows.append(guess / took)
        print(f"{guess:>10.1f} {took:>10.1f} {guess / took:>6.2f}  {kernel} {shape}", flush=True)
    off = [r for r in rows if not 1 / within <= r <= within]
    print(f"{len(rows) - len(off)} of {len(rows)} within {within}x")
    return 1 if off else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--most-s", type=float, default=45.0, help="redraw settings estimated above this")
    p.add_argument("--within", type=float, default=2.0)
    p.add_argument("--sweeps", action="store_true", help="each kernel's default sweep instead of Generates")
    args = p.parse_args()
    if args.sweeps:
        return sweeps(args.within)
    from explorer.app import estimate

    rng = random.Random(args.seed)
    models = ["bundled", "bundled-llama"]
    redrawn = {"refused": 0, "too long": 0}
    rows = []
    print(f"{'#':>2} {'estimate s':>10} {'measured s':>10} {'ratio':>6}  settings", flush=True)
    while len(rows) < args.runs:
        s = draw(rng, models)
        if not runs_here(s):
            redrawn["refused"] += 1
            continue
        guess = estimate.generation_seconds(s, "cpu")
        if guess > args.most_s:
            redrawn["too long"] += 1
            continue
        took = measure(s)
        estimate.record("cpu", s.backend, estimate.generation_units(s, "cpu"), took, key=estimate.rate_key(s))
        ratio = guess / took
        rows.append(ratio)
        print(f"{len(rows):>2} {guess:>10.1f} {took:>10.1f} {ratio:>6.2f}  {describe(s)}", flush=True)
    off = [r for r in rows if not 1 / args.within <= r <= args.within]
    print(f"redrawn: {redrawn['refused']} the run would refuse, {redrawn['too long']} estimated over {args.most_s} s")
    worst = max(rows, key=lambda r: max(r, 1 / r))
    print(f"{len(rows) - len(off)} of {len(rows)} within {args.within}x; worst ratio {worst:.2f}")
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
