"""How many programs of a kernel an SM holds at once, what stops it holding more, and in how many waves a grid runs:

    python -m kernels.occupancy [--arch 90] [--dtype bfloat16]

A program (a CUDA block) stays on its SM from its first instruction to its last, holding its warps, their
registers and its shared memory all along. An SM holds as many programs as the scarcest of four allows: its warp
slots, its register file, its shared memory and its count of blocks. The grid then runs in waves of
(programs an SM holds) x (SMs); the last wave is whatever is left over, and SMs it leaves empty wait.

The limits are the CUDA C++ Programming Guide's technical specifications per compute capability, with the
occupancy calculator's allocation rules: registers are given to each warp in units of 256, warps in fours, and
shared memory in units of 128 bytes, each block's with 1 KB the driver reserves (from sm_80 on). A kernel's own
registers, shared memory and warps are read from its compiled form (Triton's metadata, and the register count the
cubin records), so on a CPU they are those of a compile for the GPU named.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from .config import GPUS, STANDS_FOR
from .config import arch as arch_of


@dataclass(frozen=True)
class SM:
    """One SM's limits at a compute capability."""

    warps: int  # resident warps
    blocks: int  # resident blocks (programs)
    shared: int  # shared memory, bytes, with the largest carveout
    reserved: int  # shared memory the driver reserves for each block, bytes
    registers: int = 65536  # 32-bit registers
    register_unit: int = 256  # registers are allocated to a warp in units of this many
    warp_unit: int = 4  # warps are allocated register space in groups of this many
    shared_unit: int = 128  # shared memory is allocated in units of this many bytes


SMS = {
    75: SM(warps=32, blocks=16, shared=64 << 10, reserved=0),
    80: SM(warps=64, blocks=32, shared=164 << 10, reserved=1024),
    86: SM(warps=48, blocks=16, shared=100 << 10, reserved=1024),
    89: SM(warps=48, blocks=24, shared=100 << 10, reserved=1024),
    90: SM(warps=64, blocks=32, shared=228 << 10, reserved=1024),
    100: SM(warps=64, blocks=32, shared=228 << 10, reserved=1024),
    120: SM(warps=48, blocks=32, shared=100 << 10, reserved=1024),
}


@dataclass(frozen=True)
class Resources:
    """What one program of a compiled kernel holds while it runs."""

    warps: int
    registers: int  # per thread
    shared: int  # bytes of shared memory, the launch's and the kernel's own


@dataclass(frozen=True)
class Occupancy:
    resident: int  # programs one SM holds at once
    limits: dict  # programs per SM each resource allows: warps, registers, shared memory, blocks
    limiter: str  # the resource that allows fewest (several tie: the first of warps, registers, shared, blocks)
    program_warps: int  # warps of one program
    programs: int = 0  # the grid's programs
    sms: int = 0
    waves: float = 0.0  # programs / (resident x SMs)
    last_wave_fill: float = 0.0  # the share of the last wave's slots that hold a program

    @property
    def warps(self) -> int:
        """Warps resident on an SM."""
        return self.resident * self.program_warps


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(res: Resources, sm: SM, programs: int = 0, sms: int = 0) -> Occupancy:
    """Programs resident per SM for a kernel holding `res`, and, given the grid's programs and the GPU's SMs, the
    waves they run in."""
    per_warp = _round_up(max(res.registers, 1) * 32, sm.register_unit)
    warps_by_registers = (sm.registers // per_warp) // sm.warp_unit * sm.warp_unit
    shared = _round_up(res.shared + sm.reserved, sm.shared_unit)
    limits = {
        "warps": sm.warps // res.warps,
        "registers": warps_by_registers // res.warps,
        "shared memory": sm.shared // shared if shared else sm.blocks,
        "blocks": sm.blocks,
    }
    limiter = min(limits, key=limits.get)
    resident = limits[limiter]
    if not programs or not sms or not resident:
        return Occupancy(resident, limits, limiter, res.warps, programs, sms)
    slots = resident * sms
    waves = programs / slots
    left = programs - (math.ceil(waves) - 1) * slots
    return Occupancy(resident, limits, limiter, res.warps, programs, sms, waves, left / slots)


def registers(cubin: bytes) -> int:
    """Registers per thread of the one kernel in a cubin, as the cubin records them (cuobjdump, shipped with
    Triton, reads it on any machine)."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True, check=True)
    counts = [int(word[4:]) for word in out.stdout.split() if word.startswith("REG:")]
    if len(counts) != 1:
        raise ValueError(f"expected one kernel's register count in the cubin, found {counts}")
    return counts[0]


def resources(compiled) -> Resources:
    """A Triton CompiledKernel's: its warps and shared memory from its metadata, its registers from the GPU where
    it was loaded there (n_regs), else from its cubin."""
    md = compiled.metadata
    n_regs = getattr(compiled, "n_regs", None)
    regs = n_regs if isinstance(n_regs, int) and n_regs > 0 else registers(compiled.asm["cubin"])
    return Resources(md.num_warps, regs, md.shared)


def driver_resident(compiled) -> int:
    """Programs per SM the CUDA driver itself reports for a compiled kernel, loaded on this process's GPU
    (cuOccupancyMaxActiveBlocksPerMultiprocessor at its warps and shared memory): what occupancy() is held to."""
    import ctypes

    compiled._init_handles()
    count = ctypes.c_int()
    md = compiled.metadata
    threads, shared = ctypes.c_int(32 * md.num_warps), ctypes.c_size_t(md.shared)
    err = ctypes.CDLL("libcuda.so.1").cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(count), ctypes.c_void_p(compiled.function), threads, shared
    )
    if err:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: CUDA error {err}")
    return count.value


def grid_programs(grid, fn, args: tuple, kwargs: dict) -> int:
    """Programs a launch's grid (a tuple, or a function of the launch's arguments by name) starts."""
    if callable(grid):
        grid = grid({**dict(zip(fn.arg_names, args, strict=False)), **kwargs})
    return math.prod(int(g) for g in grid)


def place(fn, args: tuple, kwargs: dict, grid, arch: int, res: Resources | None = None):
    """(resources, Occupancy) of one recorded launch (kernels.launch.recording) on GPU `arch`: compiled for it,
    unless its resources are given, and its grid placed on that GPU's SMs."""
    if res is None:
        from .compile_check import build

        res = resources(build(fn, args, kwargs, arch))
    return res, occupancy(res, SMS[arch], grid_programs(grid, fn, args, kwargs), GPUS[arch].num_sms)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="90", help="75 .. 120, or sm_75 .. sm_120")
    parser.add_argument("--dtype", default="bfloat16", choices=["float16", "bfloat16"])
    parser.add_argument("--driver", action="store_true", help="on a GPU of that arch: the driver's count beside ours")
    args = parser.parse_args()
    try:
        arch = arch_of(args.arch, "--arch")
    except ValueError as e:
        sys.exit(str(e))
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles the kernels for a real GPU")
    if args.driver:
        import torch

        if not torch.cuda.is_available():
            sys.exit("--driver asks the CUDA driver: it needs a CUDA GPU")
        if torch.cuda.get_device_capability() != GPUS[arch].capability:
            sys.exit(f"--driver needs a GPU of sm_{arch}; this one is {torch.cuda.get_device_name()}")
    if args.dtype == "bfloat16" and not GPUS[arch].bf16:
        sys.exit(f"sm_{arch} has no bfloat16: use --dtype float16")
    if os.environ.get(STANDS_FOR) != str(arch):  # the tile rules answer as on that GPU: a process standing for it
        cmd = [sys.executable, "-m", "kernels.occupancy", "--arch", str(arch), "--dtype", args.dtype]
        cmd += ["--driver"] if args.driver else []
        sys.exit(subprocess.run(cmd, env=os.environ | {STANDS_FOR: str(arch)}).returncode)
    from .compile_check import build, launches

    gpu = GPUS[arch]
    print(f"sm_{arch} {gpu.name}, {gpu.num_sms} SMs, {args.dtype}: the decoder's launches (kernels.operations)")
    columns = f"{'warps':>5} {'regs':>4} {'shared':>7} {'per SM':>6}  {'limited by':13} {'programs':>8}"
    print(f"{'launch':58} {columns} waves")
    agree = total = 0
    for name, fn, a, kw, grid in launches(args.dtype):
        compiled = build(fn, a, kw, arch)
        res, occ = place(fn, a, kw, grid, arch, resources(compiled))
        row = f"{name[:58]:58} {res.warps:5} {res.registers:4} {res.shared:7} {occ.resident:6}  {occ.limiter:13}"
        row += f" {occ.programs:8} {occ.waves:5.2f} (last {occ.last_wave_fill:.0%})"
        if args.driver:
            driver = driver_resident(compiled)
            agree, total = agree + (driver == occ.resident), total + 1
            row += f"  driver {driver}{'' if driver == occ.resident else ' DIFFERS'}"
        print(row, flush=True)
    if args.driver:
        print(f"programs per SM: {agree} of {total} launches as the driver reports")
        sys.exit(0 if agree == total else 1)


if __name__ == "__main__":
    main()
