"""Record every lesson's GPU-sized job, and the jobs a CPU visitor runs by default, for visitors without a GPU:

    python scripts/record_lessons.py [--out assets/recorded/lessons_h200.json] [--lessons kv-cache tiling]
    python scripts/record_lessons.py --lessons sms --into assets/recorded/lessons_h200.json

On a GPU each lesson runs three times after the app's own warm-up: the recording keeps the second run, the
first run's seconds, compilation included, and the third's, with its models (and their CUDA graphs) built anew
but every kernel compiled, for the app's estimate of a lesson's first run in a server, and how long each
kernel specialization took to compile. Each first run meets its kernels as a server fresh from its warm-up
would, whichever lessons ran before it: the models the lessons built (with their captured graphs) are
dropped, every kernel compiled since the warm-up is forgotten (kernels.compiled.forget) and Triton's cache
directory is a new one holding only what the warm-up wrote (the warm-up itself starts from an empty one). So
the kernels it names are all it compiles there, each timed with its launcher, which Triton builds only for a
signature the warm-up did not meet, and the app counts those not yet compiled in its own server, in any order.
It also writes assets/recorded/jobs_<gpu>.json: the CPU's default Generate, Compare and fusion
ladder run on this GPU with exactly the CPU's settings (the bundled model in float32, the same prompt,
tokens, lengths and context), which the app shows beside a CPU run of the same job (counterpart.py).

Writes assets/recorded/lessons_<gpu>.json (lessons_h200.json on an H200): the GPU's name, the date, the
torch, triton and transformers versions, and per lesson the job's settings, the facts its explanation
quotes and the tables its chart is drawn from. The app shows it beside each lesson's interpreter run,
labelled with the GPU and the date. It needs no download: the lessons run the bundled model and random
weights of GPT-2 small's shape built in place. Without a GPU, `--size cpu --out PATH` records the
CPU-sized jobs instead (the app shows GPU recordings only).
"""

import argparse
import datetime
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the JSON file to write (default: assets/recorded/lessons_<gpu>.json)")
    parser.add_argument("--lessons", nargs="*", help="lesson names (default: every lesson)")
    parser.add_argument("--size", choices=["gpu", "cpu"], help="job size (default: this device's)")
    parser.add_argument(
        "--into",
        help="an existing recording to write these lessons into, each labelled with this run's GPU, date and versions, "
        "the others kept as they were (with --lessons)",
    )
    args = parser.parse_args()
    if args.into and (args.out or not args.lessons or not Path(args.into).is_file()):
        raise SystemExit("--into takes an existing recording, with --lessons and without --out")

    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    from explorer.app import lessons, recordings
    from explorer.app.lessons import recorded
    from kernels.compiled import compile_times, compiled, forget

    size = args.size or lessons.size()
    if size == "gpu" and not cuda:
        raise SystemExit("GPU-sized jobs need a CUDA GPU; on CPU pass --size cpu --out PATH")
    gpu = torch.cuda.get_device_name() if cuda else "CPU"
    if args.out is None and args.into is None and not cuda:
        raise SystemExit("no GPU here: pass --out PATH (assets/recorded/ holds GPU recordings only)")
    out = Path(args.out) if args.out else recordings.FOLDER / f"lessons_{recorded.slug(gpu)}.json"
    names = args.lessons or lessons.names()
    unknown = [n for n in names if n not in lessons.LESSONS]
    if unknown:
        raise SystemExit(f"unknown lessons {', '.join(unknown)}; the lessons are {', '.join(lessons.names())}")

    t0 = time.perf_counter()
    if cuda:  # as the app's worker starts on a new machine: its warm-up compiles the default Generate and ladder
        from explorer.app.jobs.warm import warm_up
        from explorer.app.start import default_job

        warmed = os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="record-warm-up-")
        # without its compile ahead or helpers, which compile every lesson: each lesson's own compilation is what is
        # recorded (a server counts none of it for the lessons its warm-up compiled, jobs.warm)
        os.environ["EXPLORER_WARM_HELPERS"] = "0"
        os.environ["EXPLORER_COMPILE_AHEAD"] = "0"
        for line in warm_up(default_job("cuda")):
            print(f"warm-up: {line}", flush=True)
    warm = compiled()
    results = {}
    for name in names:
        print(f"{name}: {lessons.describe(lessons.LESSONS[name].settings(size))}", flush=True)
        if cuda:  # as a server fresh from its warm-up meets the lesson: no model, graph or kernel of a lesson before
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"record-{name}-")
            shutil.copytree(warmed, os.environ["TRITON_CACHE_DIR"], dirs_exist_ok=True)
            lessons.forget_models()
            forget(warm)
        before = compiled()
        with compile_times() as took:
            first = lessons.run(name, size).seconds if cuda else None  # compiles the lesson's own kernels
        new = sorted(compiled() - before)
        results[name] = lessons.run(name, size)
        results[name].first_s, results[name].kernels = first, tuple(new)
        results[name].compile_s = {k: took[k] for k in new if k in took}
        if cuda:  # its setup alone: the models built and the graphs captured again, every kernel compiled
            lessons.forget_models()
            results[name].rebuilt_s = lessons.run(name, size).seconds
        first_run = (
            f" (first run {first:.1f} s, {len(new)} kernel specializations compiled in "
            f"{sum(results[name].compile_s.values()):.1f} s; {results[name].rebuilt_s:.1f} s with models built anew)"
            if first
            else ""
        )
        print(f"  {results[name].seconds:.1f} s{first_run}", flush=True)
    meta = dict(
        gpu=gpu,
        device_type="cuda" if cuda else "cpu",
        size=size,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        torch=torch.__version__,
        triton=_version("triton"),
        transformers=_version("transformers"),
        python=platform.python_version(),
        command="python scripts/record_lessons.py" + (f" --out {args.out}" if args.out else ""),
        seconds=round(time.perf_counter() - t0, 1),
    )
    path = recorded.merge(args.into, meta, results) if args.into else recorded.save(out, meta, results)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB) in {meta['seconds']} s")
    if cuda and not args.lessons:
        path = record_jobs(meta, out.parent / f"jobs_{recorded.slug(gpu)}.json")
        print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")


def record_jobs(meta: dict, out: Path) -> Path:
    """The CPU's default Generate, Compare and ladder, run here with the same settings (float32, the CPU's
    token counts, lengths and ladder context), each as its tables and summary, warm."""
    import torch

    from explorer.app import counterpart, jobs, settings
    from explorer.app.jobs.compare import LADDER_CONTEXT
    from explorer.measure import metrics

    cpu = settings.defaults("cpu", {"dtype": "float32"})
    s = settings.RunSettings(prompt=cpu["prompt"], new_tokens=cpu["new_tokens"], dtype="float32")
    lengths = [int(n) for n in cpu["lengths"].replace(",", " ").split()]
    never = jobs.Control(lambda: False, float("inf"))

    def last(kind, payload):
        """The job's final view from its second run: the first compiles this GPU's float32 kernels, and a
        visitor's CPU run is set beside a GPU's warm one (its time to first token is the click's, not Triton's)."""
        for _ in range(2):
            out = {}
            for update in jobs.JOBS[kind](payload, never):
                out |= update
        return out

    t0 = time.perf_counter()
    ran = {}
    state = last("generate", {"settings": s})["state"]
    summary = {k: v for k, v in state["summary"].items() if isinstance(v, int | float | str | type(None))}
    tables = {"steps": state["steps"], "kernels": state["kernels"]}
    ran["generate"] = ({"settings": counterpart.settings_key(s)}, tables, summary)
    frame = last("compare", {"settings": s, "lengths": lengths})["state"]["compare"]
    ran["compare"] = ({"settings": counterpart.settings_key(s), "lengths": lengths}, {"compare": frame}, {})
    context = LADDER_CONTEXT["cpu"]
    ladder = last("ladder", {"settings": s, "context": context})["state"]["ladder"]
    key = {"model": s.model, "dtype": s.dtype, "batch": s.batch, "context": context}
    ran["ladder"] = (key, {"ladder": ladder}, {})
    peaks = metrics.device_peaks(str(torch.device("cuda")), torch.float32)
    jobs_meta = dict(meta, bandwidth_gbs=peaks.bandwidth_gbs, tflops=peaks.tflops, seconds=time.perf_counter() - t0)
    jobs_meta["tflops_dtype"] = peaks.dtype
    jobs_meta["command"] = "python scripts/record_lessons.py"
    return counterpart.save(out, jobs_meta, ran)


if __name__ == "__main__":
    main()
