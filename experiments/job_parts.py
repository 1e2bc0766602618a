"""Where a GPU Generate job's seconds go after its text, in the worker's own process: GPT-2 small's shape (random
weights, bf16, the page's default controls) at 256 tokens, run as the Generate job eight times in a row (each
after the first with the last run's lines overlaid, as the page draws them), each update stamped, and the parts
after the text timed: the launch count, the profiling pass, the charts, the last update's tables, and Python's
garbage collections. Before the last three runs a full collection is timed, then gc.freeze() and another.

    python -m experiments.job_parts
"""

import gc
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from kernels.timing import require_cuda


def main() -> None:
    require_cuda("experiments/job_parts.py")
    from benchmarks.page import gpt2_shaped
    from explorer.app import jobs, models, settings, views, worker
    from explorer.app.jobs import generate as job
    from explorer.measure import metrics

    spent = defaultdict(float)

    def timing(owner, name, label):
        fn = getattr(owner, name)

        def wrapped(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[label] += time.perf_counter() - t0

        setattr(owner, name, wrapped)

    timing(job.launches, "decode_step_launches", "launch count")
    timing(job, "profile_run", "profiling pass")
    timing(views, "generation_figures", "charts")
    timing(views, "hierarchy", "hierarchy table")
    timing(views, "roofline", "roofline")
    timing(views, "summary_markdown", "summary")
    timing(metrics, "fusion_lessons", "fusion lessons")
    timing(job.counterpart, "for_generate", "counterpart")

    started = {}

    def collections(phase, info):  # Python's garbage collector, timed by generation
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            spent[f"gc gen{info['generation']}"] += time.perf_counter() - started["t"]

    gc.callbacks.append(collections)
    d = settings.defaults("cuda", {"dtype": models.default_dtype()})
    with tempfile.TemporaryDirectory() as folder:
        model = gpt2_shaped(Path(folder))
        never = jobs.Control(lambda: False, float("inf"))
        previous = None
        for i in range(8):
            if i == 5:  # as the worker does after its warm-up: every object so far out of the collector's sight
                print(worker.settle())
            p = {"prompt": "def fibonacci(n):", "cache": True, "model": model, "new_tokens": 256}
            s = settings.RunSettings(**{k: p.get(k, d[k]) for k in settings.RUN if k != "tiles"})
            spent.clear()
            t0 = time.monotonic()
            marks, text_at, last = [], None, None
            for update in job.run({"settings": s, "previous": previous, "started": time.time()}, never):
                now = time.monotonic() - t0
                if "text" in update:
                    text_at = now
                marks.append(f"{now:.3f}:{'+'.join(sorted(update))[:40]}")
                last = update
            done = time.monotonic() - t0
            previous = last["state"]["steps"]
            parts = ", ".join(f"{k} {v:.3f}" for k, v in spent.items())
            print(
                f"run {i + 1}: done {done:.3f} s, text until {text_at:.3f} s, after it {done - text_at:.3f} s: {parts}"
            )
            print("   updates:", " ".join(marks[-6:]))


if __name__ == "__main__":
    main()
