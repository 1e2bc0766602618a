"""Record Generate at a matrix of settings on this GPU, the measurements the GPU time model is fitted on and
held against (explorer/app/gpu_time.py):

    python scripts/record_matrix.py [--out assets/recorded/matrix_h200.json] [--limit-s 300] [--warmers 8]

The matrix crosses both bundled models, the KV cache on and off, float32/float16/bfloat16, every rung (the
torch backend and each fusion of the Triton one) and batch 1 and 4; each of those settings takes, drawn once
with a fixed seed, one of two tile choices (the kernels' defaults, or smaller tiles), one of two prompt lengths
(as written, or 400 tokens), greedy or sampled decoding and, with the cache on, the CUDA graph on or off.
Every other setting is the CPU page's default (10 new tokens, seed 0), so that a visitor's CPU run at any of
these settings is shown beside this recording of the same job. A third of the settings, drawn once with their
own seed, is held out: the model is never fitted on them, and the test suite holds the model against them.

Triton's compilation is spent first, by `--warmers` processes that run the settings between them; then one
process runs every setting twice more, alone on the GPU, and keeps the second run: its steps timed by CUDA
events around each (each decode step one graph replay where the graph is on) and its kernels' modeled bytes and
FLOPs. The first run pays what a process pays once per setting (PyTorch's choice of kernels for a shape it has
not seen, the allocator's first blocks); its median decode step is kept beside, as first_run_decode_ms. While
time is left, every setting is then timed up to AGAIN times more, and each phase kept from its fastest run: the
decode steps of the run with the fastest median, the prefill of the run with the fastest prefill
(other_run_decode_ms and other_run_prefill_ms the slowest of the others, runs how many were timed). An eager step
is the host's launches, and every prefill is eager: on the H200 the second of two consecutive runs of an eager
setting took 0.47-1.65x the first's time (the middle 80% of 76 settings 0.58-1.05x), of a replayed graph 0.70-1.03x
(24 settings), and four of the six steps furthest from the time model were prefills, each one step of one run. A
setting the app refuses (tiles that cannot fit, say) is kept with the reason.
"""

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

LONG_PROMPT = 400
AGAIN = 3  # the passes after the second that time every setting once more, while time is left
SEED, HOLD_OUT_SEED = 0, 1


def alternative_tiles():
    """Smaller tiles than the defaults on every kernel a Generate launches, valid for both bundled models in
    every dtype."""
    from explorer.model.ops import Tiles
    from kernels.config import TileConfig

    return Tiles(
        layer_norm=TileConfig(block_m=2, num_warps=2),
        linear=TileConfig(block_m=32, block_n=64, block_k=32, num_stages=2),
        linear_decode=TileConfig(block_n=32, block_k=64),  # split_k left to the launch: Llama's SwiGLU takes one
        attention=TileConfig(block_m=32, block_n=32, num_warps=4, num_stages=2),
        decode_attention=TileConfig(block_n=32, split_k=2, num_warps=4),
    )


def matrix() -> list:
    """Every setting of the matrix, in a fixed order."""
    from explorer.app.settings import RunSettings, defaults
    from explorer.model.ops import DEFAULT_FUSION, FUSIONS, Tiles
    from explorer.model.weights import BUNDLED_LLAMA, DEFAULT_MODEL

    cpu = defaults("cpu", {"dtype": "float32"})
    draw = random.Random(SEED)
    out = []
    for model in (DEFAULT_MODEL, BUNDLED_LLAMA):
        for cache in (True, False):
            for dtype in ("float32", "float16", "bfloat16"):
                for rung in ("torch", *FUSIONS):  # the torch backend, then each rung of the Triton one
                    for batch in (1, 4):
                        tiles = draw.choice([Tiles(), alternative_tiles()])
                        prompt_tokens = draw.choice([0, LONG_PROMPT])
                        graph = draw.choice([True, False])
                        temperature = draw.choice([0.0, cpu["temperature"]])  # greedy, or sampled as the page
                        out.append(
                            RunSettings(
                                model=model,
                                prompt=cpu["prompt"],
                                prompt_tokens=prompt_tokens,
                                new_tokens=cpu["new_tokens"],
                                batch=batch,
                                dtype=dtype,
                                backend="torch" if rung == "torch" else "triton",
                                fusion=DEFAULT_FUSION if rung == "torch" else rung,
                                cache=cache,
                                cuda_graph=graph if cache else True,
                                temperature=temperature,
                                tiles=tiles,
                            )
                        )
    return out


def held_out(n: int) -> list[int]:
    """The indices kept out of the fit: a third, drawn once."""
    return sorted(random.Random(HOLD_OUT_SEED).sample(range(n), n // 3))


def run_one(s) -> dict:
    """One setting's Generate, as the app runs it on this GPU: its steps, kernels and summary, or why it was
    refused."""
    from explorer.app import jobs
    from explorer.app.errors import UserError

    never = jobs.Control(lambda: False, float("inf"))
    out = {}
    try:
        for update in jobs.JOBS["generate"]({"settings": s}, never):
            out |= update
    except (UserError, ValueError) as e:
        return {"refused": str(e)}
    state = out.get("state") or {}
    if "steps" not in state:
        return {"refused": str(out.get("status", "no steps"))}
    summary = {k: v for k, v in state["summary"].items() if isinstance(v, int | float | str | type(None))}
    return {"steps": state["steps"], "kernels": state["kernels"], "summary": summary}


def decode_ms(run: dict) -> float:
    """A run's median decode step, ms."""
    return float(run["steps"].query("phase == 'decode'").latency_ms.median())


def prefill_ms(run: dict) -> float:
    """A run's prefill, ms."""
    return float(run["steps"].query("phase == 'prefill'").latency_ms.sum())


def faster(row: dict, again: dict) -> dict:
    """`row` (a recorded setting) with the steps, kernels and summary of whichever of its run and `again` has the
    faster median decode step, and the prefill of whichever has the faster prefill (a prefill is one step, as
    easily caught by a slow spell of the host as a run's median is not); beside them the slowest median decode
    step and the slowest prefill of the runs not kept (other_run_decode_ms, other_run_prefill_ms) and how many runs
    were timed (runs)."""
    if "steps" not in again:
        return row
    kept, other = (again, row) if decode_ms(again) < decode_ms(row) else (row, again)
    slowest = max(decode_ms(other), row["summary"].get("other_run_decode_ms", 0.0))
    fast, slow = (again, row) if prefill_ms(again) < prefill_ms(row) else (row, again)
    slowest_prefill = max(prefill_ms(slow), row["summary"].get("other_run_prefill_ms", 0.0))
    steps = kept["steps"]
    if fast is not kept:  # the decode steps of one run, the prefill of the other (the same setting's kernels)
        steps = pd.concat([fast["steps"].query("phase == 'prefill'"), steps.query("phase != 'prefill'")])
        steps = steps.sort_values("step", kind="stable").reset_index(drop=True)
    summary = dict(
        kept["summary"],
        other_run_decode_ms=slowest,
        other_run_prefill_ms=slowest_prefill,
        runs=row["summary"].get("runs", 1) + 1,
    )
    if "first_run_decode_ms" in row["summary"]:
        summary["first_run_decode_ms"] = row["summary"]["first_run_decode_ms"]
    return {**row, "steps": steps, "kernels": kept["kernels"], "summary": summary}


def order(n: int) -> list[int]:
    """The order the settings are timed in: shuffled once, so that a run cut short by its time limit still
    covers every factor."""
    indices = list(range(n))
    random.Random(SEED).shuffle(indices)
    return indices


def warm(shard: int, shards: int) -> None:
    settings = matrix()
    for k, i in enumerate(order(len(settings))):
        if k % shards == shard:
            run_one(settings[i])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the JSON file (default: assets/recorded/matrix_<gpu>.json)")
    parser.add_argument("--limit-s", type=float, default=300, help="start no setting after this many seconds")
    parser.add_argument("--warmers", type=int, default=8, help="processes that compile first (0: none)")
    parser.add_argument("--warm-shard", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("the matrix is recorded on a CUDA GPU")
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="matrix-"))
    if args.warm_shard is not None:
        return warm(args.warm_shard, args.warmers)

    from explorer.app import counterpart, gpu_time, recordings
    from explorer.app.lessons import recorded
    from explorer.measure import metrics

    t0 = time.perf_counter()
    settings = matrix()
    if args.warmers:
        me = [sys.executable, str(Path(__file__).resolve()), "--warmers", str(args.warmers)]
        procs = [subprocess.Popen([*me, "--warm-shard", str(k)]) for k in range(args.warmers)]
        deadline = t0 + args.limit_s / 2  # what is left uncompiled then compiles in the timed pass, apart
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                p.kill()
        print(f"compiled in {time.perf_counter() - t0:.0f} s by {args.warmers} processes", flush=True)
    rows, left = {}, []
    for i in order(len(settings)):
        s = settings[i]
        if time.perf_counter() - t0 > args.limit_s:
            left.append(i)
            continue
        first = run_one(s)  # what this process pays once per setting (a shape's first kernels, first blocks)
        got = run_one(s) if "steps" in first else first
        if "steps" in first and "steps" in got:
            got["summary"]["first_run_decode_ms"] = decode_ms(first)
        key = {"settings": counterpart.settings_key(s)}
        rows[i] = {"index": i, "key": key, "cuda_graph": s.cuda_graph, **got}
        what = got.get("refused") or f"{got['steps'].latency_ms.median():.3f} ms median step"
        print(f"{i:3d} {s.model} {s.dtype} {s.backend}/{s.fusion} cache={s.cache} batch={s.batch}: {what}", flush=True)
    # More timed runs, in the same order, while time is left. A run the host interrupted (an eager step is the
    # host's launches, and every prefill is eager) comes out slower, never faster, so the fastest is kept.
    again = [0] * AGAIN
    for n in range(AGAIN):
        for i in order(len(settings)):
            if time.perf_counter() - t0 > args.limit_s:
                break
            if "steps" in rows.get(i, {}):
                rows[i] = faster(rows[i], run_one(settings[i]))
                again[n] += 1
    print(f"settings timed again, pass by pass: {again}", flush=True)
    rows = [rows[i] for i in sorted(rows)]
    peaks = {d: metrics.device_peaks("cuda", getattr(torch, d)) for d in ("float32", "float16", "bfloat16")}
    meta = dict(
        **recordings.stamp("python scripts/record_matrix.py"),
        seconds=round(time.perf_counter() - t0, 1),
        bandwidth_gbs=peaks["float32"].bandwidth_gbs,
        tflops={d: p.tflops for d, p in peaks.items()},
        settings=len(settings),
        held_out=held_out(len(settings)),
        not_run=left,
    )
    out = Path(args.out) if args.out else recordings.FOLDER / f"matrix_{recorded.slug(meta['gpu'])}.json"
    path = gpu_time.save(out, meta, rows)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB): {len(rows)} settings, {len(left)} not run", flush=True)


if __name__ == "__main__":
    main()
