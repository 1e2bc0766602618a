"""What each click compiles once the app says it is ready, and why: python -m experiments.compile_stalls [--only a,b]

Runs the job worker's own warm-up in this process, then each job a visitor may start (every lesson, Compare and
the ladder at their defaults, the default sweep, Generate on both bundled models and with the cache off at 256
tokens, on the bundled Llama and on SmolLM2-135M's shape), one after another as one worker would, and prints for
each its wall seconds, the kernel specializations it compiled and their seconds, and for every kernel compiled
more than once in it, what differs between its keys: an integer specialised on (a length that is 1, or a
multiple of 16) or a constexpr (a tile chosen by length). That names the cause of a stall, per kernel.
Needs a CUDA GPU; run with an empty TRITON_CACHE_DIR to see a fresh machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def jobs(smollm2: str) -> dict:
    """name -> (job kind, payload), each at the page's GPU defaults but for what the name says."""
    from explorer.app import estimate, lessons, models, settings
    from explorer.app.settings import RunSettings

    d = settings.defaults("cuda", {"dtype": models.default_dtype()})
    run = dict(prompt=d["prompt"], dtype=d["dtype"])
    out = {f"lesson {name}": ("lesson", dict(lesson=name)) for name in lessons.names()}
    out["compare"] = ("compare", dict(settings=RunSettings(**run), lengths=settings.check("lengths", d["lengths"])))
    out["ladder"] = ("ladder", dict(settings=RunSettings(**run)))
    kernel = d["kernel"]
    x, y = estimate.sweep_axes(kernel)[:2]
    sweep = dict(kernel=kernel, shape=settings.SWEEP_SHAPES["cuda"][kernel], dtype=d["dtype"], x=x, y=y, value="ms")
    out["sweep"] = ("sweep", sweep)
    for model in ("bundled", "bundled-llama", smollm2):
        label = "SmolLM2 shape" if model == smollm2 else model
        out[f"generate {label}"] = ("generate", dict(settings=RunSettings(model=model, **run)))
        s = RunSettings(model=model, cache=False, new_tokens=256, **run)
        out[f"generate {label} cache off 256"] = ("generate", dict(settings=s))
    return out


def specializations() -> dict[tuple[int, object], str]:
    """(the kernel cache's id, a key) -> the kernel's name, for every specialization compiled in this process."""
    out = {}
    for module in [m for name, m in list(sys.modules.items()) if name.startswith("kernels") and m is not None]:
        for obj in list(vars(module).values()):
            for entry in list((getattr(obj, "device_caches", None) or {}).values()):
                out |= {(id(entry[0]), key): obj.__name__ for key in list(entry[0])}
    return out


def differences(keys: list[str]) -> str:
    """What differs between a kernel's compiled keys, token by token (at most three places shown)."""
    split = [k.replace("(", " ").replace(")", " ").replace(",", " ").split() for k in keys]
    width = min(len(s) for s in split)
    places = [i for i in range(width) if len({s[i] for s in split}) > 1]
    shown = ["@" + str(i) + ":" + "/".join(sorted({s[i] for s in split})) for i in places[:3]]
    return " ".join(shown) + (" ..." if len(places) > 3 else "") + ("" if places else "(lengths of the keys differ)")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated words: only the jobs whose names hold one")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("compile_stalls needs a CUDA GPU: the interpreter compiles nothing.")
        raise SystemExit(2)
    from benchmarks import page
    from explorer.app import jobs as J
    from explorer.app.start import default_job
    from kernels import compiled as C

    folder = Path(tempfile.mkdtemp())
    smollm2 = page.smollm2_shaped(folder / "smollm2-shape")
    t0 = time.monotonic()
    for line in J.warm_up(default_job("cuda")):
        print(f"warm-up: {line}", flush=True)
    print(f"warm-up done in {time.monotonic() - t0:.1f} s; Triton's cache: {os.environ.get('TRITON_CACHE_DIR', '~')}")
    never = J.Control(lambda: False, float("inf"))
    wanted = [w for w in args.only.split(",") if w]
    rows = []
    for name, (kind, payload) in jobs(smollm2).items():
        if wanted and not any(w in name for w in wanted):
            continue
        before = specializations()
        start = time.monotonic()
        try:
            with C.compile_times() as times:
                for _ in J.JOBS[kind](payload, never):
                    pass
            torch.cuda.synchronize()
            error = ""
        except Exception as e:  # one job's failure is a row, not the end of the table
            error, times = f"{type(e).__name__}: {e}"[:100], {}
        took = time.monotonic() - start
        new: dict[str, list[str]] = {}
        for (cache, key), label in specializations().items():
            if (cache, key) not in before:
                new.setdefault(label, []).append(str(key))
        rows.append((name, took, len(times), sum(times.values()), error))
        print(f"\n{name}: {took:.1f} s, {len(times)} compiled ({sum(times.values()):.1f} s) {error}", flush=True)
        for label, keys in sorted(new.items(), key=lambda kv: -len(kv[1])):
            more = f": {differences(keys)}" if len(keys) > 1 else ""
            print(f"  {len(keys):3d} x {label}{more}", flush=True)
    print("\n| job | wall s | compiled | compile s |\n|---|---:|---:|---:|")
    for name, took, n, secs, error in rows:
        print(f"| {name}{' (' + error + ')' if error else ''} | {took:.1f} | {n} | {secs:.1f} |")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
