"""Kernels compiled before their first launch, several at once.

A launcher called inside kernels.launch.recording() records its launches instead of running them. Each distinct
launch is then handed to its kernel's own JIT (JITFunction.warmup: the same specialisation, cache key and
in-memory cache as a real launch, nothing run), from a pool of threads: Triton's compiler spends much of a
compile outside Python (LLVM, ptxas in a process of its own), so several compile at once. A later real launch of
each finds its kernel compiled. Which calls are recorded is the caller's: a tile sweep's configs, say.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

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


def distinct(launches: list[tuple]) -> list[tuple]:
    """One launch of each kernel and specialisation: the rest would compile nothing new."""
    seen, out = set(), []
    for fn, args, kwargs, grid in launches:
        key = (id(fn), tuple(_kind(a) for a in args), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        if key not in seen:
            seen.add(key)
            out.append((fn, args, kwargs, grid))
    return out


@dataclass
class Compiled:
    launches: int  # distinct launches handed to the compiler
    seconds: float
    failed: list[str] = field(default_factory=list)  # "kernel: error", for launches the compiler refused


def workers() -> int:
    """Threads to compile with: the cores this process may use, less one for the server."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def compile_ahead(launches: list[tuple], threads: int | None = None, share: tuple[int, int] = (0, 1)) -> Compiled:
    """Compile every distinct launch through its kernel's JIT, `threads` at a time (workers() by default). A
    launch the compiler refuses is named in `failed`, not raised: its real launch raises it where it is run.
    share=(i, k): only the i-th of every k distinct launches, for one of k processes that recorded the same
    launches (threads gain about 4x at most: much of a compile holds Python's lock)."""
    todo = distinct(launches)[share[0] :: share[1]]
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
            failed.append(f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")

    if todo:
        with ThreadPoolExecutor(max(1, min(threads or workers(), len(todo)))) as pool:
            list(pool.map(one, todo))
    return Compiled(len(todo), time.perf_counter() - start, failed)
