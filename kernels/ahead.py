"""Kernels compiled before their first launch, several at once: on threads of this process (compile_ahead), or in
processes of their own (in_processes).

A launcher called inside kernels.launch.recording() records its launches instead of running them. Each distinct
launch is then handed to its kernel's own JIT (JITFunction.warmup: the same specialisation, cache key and
in-memory cache as a real launch, nothing run), from a pool of threads: Triton's compiler spends much of a
compile outside Python (LLVM, ptxas in a process of its own), so several compile at once. A later real launch of
each finds its kernel compiled. Which calls are recorded is the caller's: a tile sweep's configs, say.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import launch


def recorded(calls) -> list[tuple]:
    """The launches each call makes, recorded, not run: (kernel, args, kwargs, grid). A call its launcher refuses
    (a ValueError: tiles that cannot fit, say) adds nothing; the real launch will say why."""
    out = []
    for call in calls:
        with launch.recording() as got:
            try:
                call()
            except ValueError:
                continue
        out += got
    return out


def _kind(value):
    """What the JIT specialises a launch on for one argument (its type, not its value, but for what it keys
    on: a tensor's dtype and 16-byte alignment, an integer's being 1 or a multiple of 16)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if type(value) is int:
        return ("int", value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    if isinstance(value, tuple):
        return tuple(_kind(v) for v in value)
    if hasattr(value, "block_shape") and hasattr(value, "base"):  # a tensor descriptor: its base and its block
        return ("descriptor", _kind(value.base), tuple(value.block_shape))
    return (type(value).__name__, repr(value) if value is None or isinstance(value, (bool, str)) else "")


def key(item: tuple) -> tuple:
    """What a recorded launch compiles: its kernel and specialisation (equal keys, one compile)."""
    fn, args, kwargs, _ = item
    return (id(fn), tuple(_kind(a) for a in args), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


def distinct(launches: list[tuple]) -> list[tuple]:
    """One launch of each kernel and specialisation: the rest would compile nothing new."""
    seen, out = set(), []
    for item in launches:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return out


@dataclass
class Compiled:
    launches: int  # distinct launches handed to the compiler
    seconds: float
    failed: list[str] = field(default_factory=list)  # "kernel: error", for launches the compiler refused


def _failure(kernel, e: Exception) -> str:
    """A line for a launch that was not compiled: "kernel: error", the error's first line."""
    return f"{kernel}: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


def workers() -> int:
    """Threads to compile with: the cores this process may use, less one for the server."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def compile_ahead(launches: list[tuple], threads: int | None = None, stop=None) -> Compiled:
    """Compile every distinct launch through its kernel's JIT, `threads` at a time (workers() by default). A
    launch the compiler refuses is named in `failed`, not raised: its real launch raises it where it is run.
    Threads gain about 4x at most (much of a compile holds Python's lock); in_processes gains more. `stop()`, asked
    a few times a second, ends it early: the compiles under way finish (a second or two each), the rest are not
    begun, and `launches` counts those done."""
    todo = distinct(launches)
    start = time.perf_counter()
    failed = []

    def one(item):
        fn, args, kwargs, grid = item
        try:
            kernel = fn.warmup(*args, grid=grid, **kwargs)
            # its module loaded and its launcher built (Triton compiles one per signature, in C, into the same
            # cache), which the JIT otherwise leaves to the first launch
            getattr(kernel, "_init_handles", lambda: None)()
        except Exception as e:  # noqa: BLE001 - reported, and raised again by the real launch
            failed.append(_failure(getattr(fn, "__name__", fn), e))

    futures = []
    if todo:
        pool = ThreadPoolExecutor(max(1, min(threads or workers(), len(todo))))
        futures = [pool.submit(one, item) for item in todo]
        try:
            pending = set(futures)
            while pending and not (stop is not None and stop()):
                _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    done = sum(1 for f in futures if not f.cancelled())
    return Compiled(done, time.perf_counter() - start, failed)


# --- In processes of their own ---------------------------------------------------------------------------------


def specializations(launches: list[tuple]) -> tuple[list[dict], list[str]]:
    """Each distinct launch as Triton's own specialization data (what JITFunction.preload takes: its signature,
    constants, attributes, options and target, as the JIT specialises the launch), with the kernel's module and
    name; nothing compiled. (specs, a line for each launch that could not be read)."""
    from triton import knobs

    found, failed = [], []

    def hook(**kw):
        found.append(kw["compile"]["specialization_data"])
        return True  # compile nothing

    before = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = hook
    try:
        out = []
        for fn, args, kwargs, grid in distinct(launches):
            found.clear()
            try:
                fn.warmup(*args, grid=grid, **kwargs)
            except Exception as e:  # noqa: BLE001 - the real launch raises it where it is run
                failed.append(_failure(getattr(fn, "__name__", fn), e))
                continue
            if found:  # none where this process has compiled it already
                out.append({"module": fn.fn.__module__, "name": fn.fn.__name__, "data": found[0]})
    finally:
        knobs.runtime.jit_cache_hook = before
    return out, failed


def preload(specs: list[dict], load: bool = True) -> Compiled:
    """Compile each spec (specializations) through its kernel's JIT.preload, one after another, and with `load` its
    launcher: into Triton's cache directory, where any process launching it finds it."""
    import importlib

    start, failed = time.perf_counter(), []
    for spec in specs:
        try:
            fn = getattr(importlib.import_module(spec["module"]), spec["name"])
            kernel = fn.preload(spec["data"])
            if load:
                getattr(kernel, "_init_handles", lambda: None)()
        except Exception as e:  # noqa: BLE001 - counted; the real launch compiles it
            failed.append(_failure(spec["name"], e))
    return Compiled(len(specs), time.perf_counter() - start, failed)


def in_processes(launches: list[tuple], processes: int | None = None) -> Compiled:
    """Compile every distinct launch in `processes` processes of their own (workers() by default), each its share
    (`python -m kernels.ahead SPECS I K`): unlike threads, they do not wait on one another's Python. Each needs the
    GPU's driver (JIT.preload asks it for the device) but no model."""
    start = time.perf_counter()
    specs, failed = specializations(launches)
    done = preload_in_processes(specs, processes)
    return Compiled(done.launches, time.perf_counter() - start, failed + done.failed)


def preload_in_processes(specs: list[dict], processes: int | None = None) -> Compiled:
    """preload each of `specs` (specializations) in one of `processes` processes of their own, each its share."""
    import json
    import subprocess
    import sys
    import tempfile

    start, failed = time.perf_counter(), []
    specs = [dict(t) for t in {tuple(sorted((k, v) for k, v in spec.items())) for spec in specs}]  # once each
    k = max(1, min(processes or workers(), len(specs)))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(specs, f)
    try:
        running = [
            subprocess.Popen(
                [sys.executable, "-m", "kernels.ahead", f.name, str(i), str(k)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=Path(__file__).resolve().parent.parent,  # where `kernels` imports from, wherever this runs
            )
            for i in range(k if specs else 0)
        ]
        for process in running:
            out, _ = process.communicate()
            lines = [line for line in out.splitlines() if line.startswith("{")]
            done = json.loads(lines[-1]) if lines else {"failed": [f"a compile process ended {process.returncode}"]}
            failed += done["failed"]
    finally:
        os.unlink(f.name)
    return Compiled(len(specs), time.perf_counter() - start, failed)


def main(argv: list[str]) -> None:
    """python -m kernels.ahead SPECS I K: preload the I-th of every K specs in the JSON file SPECS; print a JSON
    line of what was compiled and what failed."""
    import json

    path, i, k = argv[0], int(argv[1]), int(argv[2])
    with open(path) as f:
        done = preload(json.load(f)[i::k])
    print(json.dumps({"compiled": done.launches, "seconds": done.seconds, "failed": done.failed}), flush=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
