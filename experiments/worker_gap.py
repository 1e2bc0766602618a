"""Where a warm Generate's seconds go: the same job (GPT-2 small's shape, 256 tokens, default controls) run
in this process and in the job worker, update by update, with and without a previous run to overlay, before
and after the worker's warm-up (the default Generate and ladder), and once under cProfile.

    python -m experiments.worker_gap [--tokens 256]
"""

import argparse
import asyncio
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def phases(updates) -> tuple[dict, object]:
    """Seconds from the start to the last text, to the profiling pass, to the end, and the updates seen, as
    they arrive from `updates` (the job itself, or the runner's stream drained at its own pace); and the
    run's steps, for the next run to overlay."""
    t0, out, n, last = time.monotonic(), {}, 0, {}
    for u in updates:
        n += 1
        now = time.monotonic() - t0
        if "text" in u:
            out["text_s"] = now
        if u.get("status") == "Profiling…":
            out["profiling_from_s"] = now
        if "state" in u:
            last = u["state"]
    out |= {"done_s": time.monotonic() - t0, "updates": n}
    return out, last.get("steps")


def through_runner(runner, payload):
    """The same job through the job worker: its updates drained from the runner's stream as they come."""
    from explorer.app.runner import Job

    loop = asyncio.new_event_loop()
    stream = runner.run(Job("generate", payload, 600.0))

    def updates():
        while True:
            try:
                yield loop.run_until_complete(anext(stream))
            except StopAsyncIteration:
                return

    try:
        return phases(updates())
    finally:
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    from kernels.timing import require_cuda

    require_cuda("experiments/worker_gap.py")
    from benchmarks.page import gpt2_shaped

    folder = Path(tempfile.mkdtemp())
    gpt2 = gpt2_shaped(folder)
    os.environ["EXPLORER_MODELS"] = f"distilgpt2,gpt2,{gpt2}"
    from explorer.app import jobs, models, serve, settings
    from explorer.app.runner import ProcessRunner

    d = settings.defaults("cuda", {"dtype": models.default_dtype()})
    base = dict(prompt="def fibonacci(n):", cache=True, model=gpt2, new_tokens=args.tokens)
    s = settings.RunSettings(**{k: base.get(k, d[k]) for k in settings.RUN if k != "tiles"})
    never = jobs.Control(lambda: False, float("inf"))

    def here(previous):
        return phases(jobs.JOBS["generate"]({"settings": s, "previous": previous}, never))

    print("in this process, no warm-up of the worker's kind yet")
    for _ in range(2):  # compile, capture
        _, prev = here(None)
    for label, p in (("no previous", None), ("previous", prev)):
        for _ in range(3):
            row, prev2 = here(p)
            print(f"  {label:12s} {row}", flush=True)
    print("in this process, after the worker's warm-up (default Generate and ladder)")
    for line in jobs.warm_up(serve.default_job("cuda")):
        print("  warm-up:", line)
    for _ in range(3):
        row, _ = here(prev)
        print(f"  previous     {row}", flush=True)
    print("in this process, the profiling pass's parts")
    from explorer.app.jobs.generate import prepare
    from explorer.measure import launches
    from explorer.measure.clock import timed
    from explorer.measure.profile import profile_run

    model, _, ids = prepare(s)
    steps = list(timed(model, [ids], max_new_tokens=args.tokens, cache=True, tiles=s.tiles))
    for _ in range(3):
        t0 = time.monotonic()
        launches.decode_step_launches(model, [ids], cache=True, graph=None, tiles=s.tiles, backend=s.backend)
        t1 = time.monotonic()
        profile_run(model, [ids], steps, cache=True, tiles=s.tiles, backend=s.backend, samples=5)
        t2 = time.monotonic()
        print(f"  launches counted in {t1 - t0:.3f} s, kernels profiled at 6 steps in {t2 - t1:.3f} s", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    here(prev)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)

    for warm in (None, serve.default_job("cuda")):
        lines = []
        runner = ProcessRunner(warm=warm, log=lines.append)
        runner.start()
        try:
            print(f"in the worker, warm-up {'none' if warm is None else 'default'}")
            _, wprev = through_runner(runner, {"settings": s})
            _, wprev = through_runner(runner, {"settings": s})
            for _ in range(3):
                row, _ = through_runner(runner, {"settings": s, "previous": wprev})
                print(f"  previous     {row}", flush=True)
            for line in lines[-3:]:
                print("   ", line)
        finally:
            runner.close()


if __name__ == "__main__":
    main()
