"""Kernels compiled ahead of their first launch (kernels.ahead): what is recorded is what a real launch would run,
nothing runs while recording, and on a GPU a launch after the compile ahead compiles nothing more."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from explorer.measure import sweeps
from kernels import ahead
from kernels.config import TileConfig


def _sweep(kernel: str, shape: dict, device: str):
    sw = sweeps.sweep(kernel)
    inputs = sw.inputs(shape, torch.float16 if device == "cuda" else torch.float32, torch.device(device))
    return sw, inputs, sweeps.grid_configs(kernel, None)


def test_recording_a_sweeps_configs_runs_none_of_them(monkeypatch):
    """Each config's launch recorded with the tiles it was given, the kernel never called; a config refused
    before launch (a row block that is not a power of two) adds none."""
    from kernels.ops.layer_norm import kernel as LN

    def run(*args, **kwargs):
        raise AssertionError("a kernel ran while its launches were being recorded")

    monkeypatch.setattr(type(LN._layer_norm_kernel), "__getitem__", run)
    x, w, b = torch.randn(17, 200), torch.randn(200), torch.randn(200)
    got = ahead.recorded([lambda m=m: LN.layer_norm(x, w, b, config=TileConfig(block_m=m)) for m in (1, 2, 4)])
    assert [g[0] for g in got] == [LN._layer_norm_kernel] * 3
    assert [g[2]["BLOCK_M"] for g in got] == [1, 2, 4]
    assert ahead.recorded([lambda: LN.layer_norm(x, w, b, config=TileConfig(block_m=3))]) == []


def test_the_same_launch_twice_is_compiled_once():
    """A sweep's launches (sweeps.sweep_launches): one per config the launcher accepts, each config's tiles in its
    launch; recorded twice over, the distinct ones are the first recording's."""
    shape = {"M": 33, "C": 96}
    once = sweeps.sweep_launches("layer_norm", shape, dtype=torch.float32)
    configs = sweeps.grid_configs("layer_norm")
    assert [(g[2]["BLOCK_M"], g[2]["num_warps"]) for g in once] == [(c.block_m, c.num_warps) for c in configs]
    assert len(ahead.distinct(once + once)) == len(ahead.distinct(once)) == len(once)


@pytest.mark.gpu
def test_after_the_compile_ahead_the_sweep_compiles_nothing(tmp_path, monkeypatch):
    """Triton's cache empty, a sweep's configs compiled ahead: timing the sweep adds no entry to the cache (every
    real launch found its kernel compiled under the same key), and each config times as it does without."""
    from kernels import compiled

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    compiled.forget()  # as in a fresh process: nothing compiled in memory either
    shape = {"M": 257, "C": 768}
    sw, inputs, configs = _sweep("layer_norm", shape, "cuda")
    done = ahead.compile_ahead(ahead.recorded([lambda c=c: sw.run(c, *inputs) for c in configs]), threads=4)
    assert done.launches > 0 and not done.failed
    before = {p.name for p in Path(tmp_path).iterdir()}
    assert len(before) >= done.launches  # each compiled into the empty cache
    rows = [r for _, _, r in sweeps.tile_sweep_rows("layer_norm", shape, dtype=torch.float16, device="cuda")]
    assert all(r["valid"] for r in rows)
    assert {p.name for p in Path(os.environ["TRITON_CACHE_DIR"]).iterdir()} == before


@pytest.mark.gpu
def test_a_gpu_sweep_says_it_compiles_its_kernels_ahead_then_times_every_config():
    from explorer.app import jobs

    payload = dict(kernel="layer_norm", shape={"M": 129, "C": 200}, dtype="float16", x="block_m", y="num_warps")
    updates = list(jobs.JOBS["sweep"](payload | {"value": "ms"}, jobs.Control(lambda: False, float("inf"))))
    configs = len(sweeps.grid_configs("layer_norm"))
    assert updates[0]["best"].startswith(f"Compiling the sweep's {configs} kernels for this GPU")
    assert updates[1]["best"].startswith(f"Compiled {configs} kernels in")
    assert len(updates) == 2 + configs and f"all {configs} configs" in updates[-1]["best"]
    again = list(jobs.JOBS["sweep"](payload | {"value": "ms"}, jobs.Control(lambda: False, float("inf"))))
    assert len(again) == configs  # compiled once a process: nothing said the second time


def test_launches_that_differ_only_in_a_descriptors_block_are_both_compiled():
    """A tensor descriptor's block shape is part of its kernel's signature: two launches that differ only there
    are distinct; the same one twice is not."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from kernels.ops.layer_norm import kernel as LN

    x = torch.randn(64, 64)
    a = TensorDescriptor.from_tensor(x, [16, 64])
    b = TensorDescriptor.from_tensor(x, [32, 64])
    again = TensorDescriptor.from_tensor(x, [16, 64])
    launches = [(LN._layer_norm_kernel, (d, 64), {"BLOCK_M": 4}, (1,)) for d in (a, b, again)]
    assert len(ahead.distinct(launches)) == 2


@pytest.mark.gpu
def test_compiled_in_processes_of_their_own_a_sweep_compiles_nothing_more(tmp_path, monkeypatch):
    """A sweep's launches read as Triton's specialization data and compiled by JITFunction.preload in three
    processes (kernels.ahead.in_processes), into an empty cache: the sweep then adds no entry to it, in a process
    that had compiled none of them in memory."""
    from kernels import compiled

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    compiled.forget()
    shape = {"M": 300, "C": 512}
    sw, inputs, configs = _sweep("layer_norm", shape, "cuda")
    done = ahead.in_processes(ahead.recorded([lambda c=c: sw.run(c, *inputs) for c in configs]), processes=3)
    assert done.launches == len(configs) and not done.failed, done
    before = {p.name for p in tmp_path.iterdir()}
    compiled.forget()
    rows = [r for _, _, r in sweeps.tile_sweep_rows("layer_norm", shape, dtype=torch.float16, device="cuda")]
    assert all(r["valid"] for r in rows)
    assert {p.name for p in tmp_path.iterdir()} == before


# Run where kernels compile (no interpreter), the CPU standing for an H100 and a driver that only names it: the JIT
# specialises and compiles for sm_90 as on that GPU, and nothing is loaded onto one.
SPECIALIZED = """
import os, pathlib, torch
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver


class NamesAGpu:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


driver.set_active(NamesAGpu())
from kernels import ahead, compiled
from kernels.config import TileConfig
from kernels.ops.layer_norm import kernel as LN

x, w, b = torch.randn(17, 200), torch.randn(200), torch.randn(200)
launches = ahead.recorded([lambda m=m: LN.layer_norm(x, w, b, config=TileConfig(block_m=m)) for m in (1, 2, 2)])
specs, failed = ahead.specializations(launches)
cache = pathlib.Path(os.environ["TRITON_CACHE_DIR"])
print("read", len(specs), len(failed), sum(1 for _ in cache.iterdir()))
done = ahead.preload(specs, load=False)
compiled_ahead = {p.name for p in cache.iterdir()}
print("preloaded", done.launches, len(done.failed), len(compiled_ahead))
compiled.forget()
for fn, args, kwargs, grid in launches:
    fn.warmup(*args, grid=grid, **kwargs)
print("then the JIT added", len({p.name for p in cache.iterdir()} - compiled_ahead))
"""


def test_a_launch_preloaded_from_its_specialization_data_is_the_one_the_jit_would_compile(tmp_path):
    """kernels.ahead's path with Triton's own compiler, for a GPU named but absent: two distinct launches read as
    specialization data (compiling nothing), preloaded into an empty cache; the JIT then meeting the same launches,
    its memory cleared, finds both there and compiles nothing (the same cache keys)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env |= {"TRITON_CACHE_DIR": str(tmp_path), "EXPLORER_CPU_STANDS_FOR": "90"}
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", SPECIALIZED], env=env, cwd=root, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.split()[:1] in (["read"], ["preloaded"], ["then"])]
    assert lines == ["read 2 0 0", "preloaded 2 0 2", "then the JIT added 0"], (lines, done.stderr[-3000:])


def test_a_compile_ahead_asked_to_stop_begins_no_more_compiles():
    """Ten launches of a kernel whose compile takes 0.3 s, on two threads, asked to stop at once: the two compiles
    under way finish, no other begins, and the count says two; not stopped, all ten."""
    import threading
    import time

    class Slow:
        __name__ = "slow"

        def __init__(self):
            self.begun, self.lock = 0, threading.Lock()

        def warmup(self, *args, grid, **kwargs):
            with self.lock:
                self.begun += 1
            time.sleep(0.3)

    slow = Slow()
    launches = [(slow, (), {"BLOCK": 2**i}, (1,)) for i in range(10)]  # ten specialisations
    done = ahead.compile_ahead(launches, threads=2, stop=lambda: True)
    assert done.launches == slow.begun == 2 and not done.failed
    slow = Slow()
    everything = ahead.compile_ahead([(slow, *rest) for _, *rest in launches], threads=2)
    assert everything.launches == slow.begun == 10
