"""Where a run's kernels sit on a GPU's SMs: every Triton launch of one prefill and one decode step at a run's
settings (model, dtype, rung, tiles, batch, prompt length), compiled for the GPU named, each with the programs
an SM holds and the waves its grid runs in (kernels.occupancy). Run as a program of its own, since it compiles
for a real GPU (Triton's interpreter must be off) and the tile rules must answer as on that GPU:

    python -m explorer.measure.occupancy --arch 90 --settings '{"model": "bundled", "dtype": "float16"}'

prints the rows, and each kernel's source as written in kernels/, as one line of JSON. The launches are recorded,
not run (kernels.launch.recording): the kernels are compiled, never executed, so no GPU is needed and none is used.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

from kernels import launch
from kernels.config import GPUS, STANDS_FOR, TileConfig
from kernels.occupancy import place

from ..model.cache import KVCache
from ..model.ops import Tiles

COLUMNS = ["phase", "operation", "kernel", "warps", "registers", "shared", "resident", "limiter", "programs", "waves"]
OPTIONS = ("num_warps", "num_stages")
PICTURE_PROMPT, PICTURED_AT = 256, 1024  # a prefill shorter than this is pictured (tile_reads) at that length


def recorded(model, *, batch: int, prompt: int, tiles: Tiles | None = None, decode: bool = True) -> list[tuple]:
    """(phase, operation, kernel function, args, kwargs, grid) of every Triton launch of a prefill of `prompt`
    tokens and (with `decode`) the decode step after it, each sequence of the batch alike."""
    out, phase = [], ["prefill"]

    def observe(op, run):
        with launch.recording() as got:
            result = run()
        out.extend((phase[0], op.name, *g) for g in got)
        return result

    cache = KVCache.for_model(model, batch, prompt + 1)
    ids = torch.randint(model.config.vocab_size, (batch, prompt), device=model.device)
    model.prefill(ids, cache, [prompt] * batch, tiles=tiles, observer=observe)
    if decode:
        phase[0] = "decode"
        model.decode(ids[:, -1], cache, tiles=tiles, observer=observe)
    return out


def decode_rows(arch: int, model, *, batch: int, prompt: int, tiles: Tiles | None = None) -> list[dict]:
    """rows() of the decode step alone, after a prefill of `prompt` tokens (recorded, not run)."""
    launches = recorded(model, batch=batch, prompt=prompt, tiles=tiles)
    return rows(arch, [launch for launch in launches if launch[0] == "decode"])


def kernel_name(fn) -> str:
    """A Triton kernel's name as the page shows it: _layer_norm_kernel is layer_norm."""
    return fn.__name__.strip("_").removesuffix("_kernel")


def constants(fn, args: tuple, kwargs: dict) -> str:
    """A launch's compile-time values, as the kernel names them: its constexpr parameters and launch options."""
    values = dict(zip(fn.arg_names, args, strict=False)) | kwargs
    named = [p.name for p in fn.params if p.is_constexpr and p.name in values] + [o for o in OPTIONS if o in values]
    return ", ".join(f"{n}={_shown(values[n])}" for n in named)


def _shown(value):
    """A constexpr as the kernel's source names it: a device function (an epilogue, say) by its name."""
    return value.__name__ if hasattr(value, "arg_names") else value


def rows(arch: int, launches: list[tuple]) -> list[dict]:
    """Each launch compiled for `arch` (once per distinct kernel and arguments) and placed on its SMs."""
    from kernels.compile_check import _source

    built = {}
    out = []
    for phase, name, fn, args, kwargs, grid in launches:
        key = (_source(fn, args, kwargs).hash(), kwargs.get("num_warps"), kwargs.get("num_stages"))
        res, occ = place(fn, args, kwargs, grid, arch, built.get(key))
        built[key] = res
        out.append(
            dict(
                phase=phase,
                operation=name,
                kernel=kernel_name(fn),
                warps=res.warps,
                registers=res.registers,
                shared=res.shared,
                resident=occ.resident,
                limiter=occ.limiter,
                programs=occ.programs,
                waves=round(occ.waves, 3),
                constants=constants(fn, args, kwargs),
            )
        )
    return out


def tiles_of(spec: dict | None) -> Tiles:
    """Tiles from {kernel: {field: value} or "autotune" or None}, as settings_key writes them."""
    made = {}
    for kernel, value in (spec or {}).items():
        made[kernel] = TileConfig(**value) if isinstance(value, dict) else value
    return Tiles(**made)


def sources(launches: list[tuple]) -> dict:
    """Each kernel's source as written (its JIT function's), by the name rows() gives it."""
    return {kernel_name(fn): fn.src for _, _, fn, _, _, _ in launches}


def compute(arch: int, settings: dict) -> dict:
    """{"rows": rows(), "sources": sources(), "tiles": the prefill's matmul and attention as tile_reads walks
    them} of a prefill and a decode step at `settings`. The tiles pictured are the run's prefill's, or where that
    is shorter than PICTURE_PROMPT tokens (its grids a tile or two) those of a prefill of PICTURED_AT; its length
    under "prompt". With settings["decode_only"]: {"rows"} of the decode step alone, nothing pictured."""
    from ..model.weights import load_model
    from . import tile_reads

    model, _ = load_model(settings.get("model", "bundled"), dtype=getattr(torch, settings.get("dtype", "float16")))
    model = model.with_fusion(settings.get("fusion", model.fusion))
    batch, prompt = int(settings.get("batch", 1)), int(settings.get("prompt_tokens") or 16)
    tiles = tiles_of(settings.get("tiles"))
    if settings.get("decode_only"):
        return dict(rows=decode_rows(arch, model, batch=batch, prompt=prompt, tiles=tiles))
    launches = recorded(model, batch=batch, prompt=prompt, tiles=tiles)
    long = prompt if prompt >= PICTURE_PROMPT else min(PICTURED_AT, model.config.n_positions)
    pictured = launches if long == prompt else recorded(model, batch=1, prompt=long, tiles=tiles, decode=False)
    picture = tile_reads.from_launches(pictured) | dict(
        prompt=long, itemsize=torch.empty((), dtype=model.dtype).element_size()
    )
    return dict(rows=rows(arch, launches), sources=sources(launches), tiles=picture)


def run(arch: int, settings: dict | list[dict], timeout: float = 300) -> dict | list[dict]:
    """compute() in a process of its own, compiling for `arch` with the CPU standing for it; for a list of
    settings, a list of what compute() returns for each, in one process (the kernels they share compiled once)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {STANDS_FOR: str(arch)}
    cmd = [sys.executable, "-m", "explorer.measure.occupancy", "--arch", str(arch), "--settings", json.dumps(settings)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, choices=sorted(GPUS))
    parser.add_argument(
        "--settings", default="{}", help="model, dtype, fusion, tiles, batch, prompt_tokens, decode_only (JSON; a list)"
    )
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get(STANDS_FOR) != str(args.arch):
        sys.exit(run_here_message(args.arch))
    settings = json.loads(args.settings)
    if isinstance(settings, list):
        print(json.dumps([compute(args.arch, s) for s in settings]))
    else:
        print(json.dumps(compute(args.arch, settings)))


def run_here_message(arch: int) -> str:
    return f"run with TRITON_INTERPRET unset and {STANDS_FOR}={arch}, as occupancy.run() starts it"


if __name__ == "__main__":
    main()
