"""Compile every kernel for the GPUs a Space may offer, without a GPU: python -m kernels.compile_check

Triton compiles to PTX and cubin on any machine (ptxas ships with it), so this catches a kernel that
does not build for an architecture, and reads the shared memory the compiled kernel really uses,
which must stay within that GPU's limit and within what kernels/config.py estimates (the estimate is
what refuses a config before launch). What is compiled is what the launchers launch: each is called on
CPU tensors with launches recorded instead of run (kernels.launch.recording), in a process per GPU where
the CPU stands for that GPU (config.STANDS_FOR), and every argument's type is read from the value
launched with it. A kernel whose programs wait for each other (the persistent and megakernel rungs') must also
fit all of a launch's programs on the GPU at once, by the compiled kernel's residency (kernels.occupancy).
Run without TRITON_INTERPRET.
"""

import argparse
import os
import subprocess
import sys

import torch

from .config import GPUS, STANDS_FOR
from .config import arch as arch_of

DTYPES = ("float16", "bfloat16")
_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32", torch.int64: "i64"}


def launches(dtype):
    """Yield (name, kernel, args, kwargs, grid) for every kernel, as its launcher launches it for the decoder's shapes
    (each operation's compile cases, kernels.operations), recorded on CPU tensors rather than run
    (kernels.launch.recording). Run where the CPU stands for the GPU being compiled for (config.STANDS_FOR), so
    each tile rule answers as it would there."""
    from . import launch
    from .operations import OPERATIONS

    make = tensors(dtype)
    for op in OPERATIONS.values():
        for name, call in op.compiles(make).items():
            with launch.recording() as got:
                call()
            assert got, f"{name}: nothing launched"
            for i, (fn, args, kwargs, grid) in enumerate(got):
                yield (name if len(got) == 1 else f"{name} [{i + 1}/{len(got)}]"), fn, args, kwargs, grid


def tensors(dtype: str):
    """The CPU tensors every operation's compile cases launch with (kernels.operations.Make), in `dtype`."""
    from .operations import Make
    from .ops.linear import kernel as L

    tdt = getattr(torch, dtype)
    t = lambda *shape: torch.randn(*shape, dtype=tdt)
    return Make(
        t=t,
        lengths=lambda batch, n: torch.full((batch,), n, dtype=torch.int32),
        cache=lambda batch, heads, n: (t(batch, heads, n, 64), t(batch, heads, n, 64)),
        ln=(t(768), t(768), 1e-5),  # GPT-2 small's LayerNorm
        rms=(t(576), None, 1e-5),  # SmolLM2's RMSNorm: a weight, no bias
        persistent=L.persistent_form(4096, tdt, "cpu"),
    )


def _estimate(fn, kwargs: dict, itemsize: int, limits) -> int:
    """What config.py estimates the kernel's shared memory at when it validates the tiles (0: no estimate)."""
    from .config import TileConfig
    from .ops.attention import kernel as A
    from .ops.decode_attention import kernel as AD
    from .ops.decode_attention.tiles import decode_shared_memory
    from .ops.decode_linear import kernel as FL
    from .ops.linear import kernel as L
    from .ops.swiglu import kernel as SW

    tiles = {k.lower(): kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in kwargs}
    cfg = TileConfig(**tiles, num_stages=kwargs.get("num_stages"))
    if fn in (L._linear_kernel, L._linear_split_k_kernel, FL._decode_linear_kernel):
        return L.shared_memory(cfg, itemsize, limits)
    if fn is L._linear_persistent_kernel:
        return L.shared_memory(cfg, itemsize, limits, True, kwargs["HAS_RESIDUAL"])
    if fn is SW._swiglu_kernel:
        return SW.shared_memory(cfg, itemsize, limits)
    if fn is A._attention_kernel:
        return A.shared_memory(cfg, kwargs["HEAD_DIM"], itemsize, limits)
    if fn in (AD._decode_partial_kernel, AD._decode_one_launch_kernel):
        return decode_shared_memory(cfg, kwargs["HEAD_DIM"], itemsize)
    return 0


OPTIONS = ("num_warps", "num_stages", "launch_pdl")  # launch options, not kernel arguments


def _signature(value, path: tuple, consts: dict, attrs: dict, constant: bool = False, specialize: bool = True):
    """One argument's type for ASTSource, read from the value launched with it, as the JIT specialises a launch:
    a tensor is a pointer to its dtype, an integer an i32 (i64 past its range), 1 and None constants; pointers
    and integers that are multiples of 16 say so (without that, masks forbid vector loads and the loop is not
    pipelined), except an integer the kernel says not to specialise on. A tuple argument is a tuple of its
    elements' types, a constexpr tuple one constant."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(value, tuple) and not constant:  # a constexpr tuple is one constant, as the JIT takes it
        return tuple(_signature(v, (*path, j), consts, attrs) for j, v in enumerate(value))
    if type(value) is int and not specialize:
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if constant or value is None or (type(value) is int and value == 1) or isinstance(value, (bool, str)):
        consts[path] = value
        return "constexpr"
    if isinstance(value, torch.Tensor):
        if value.data_ptr() % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        return "*" + _TYPES[value.dtype]
    if isinstance(value, TensorDescriptor):
        return f"tensordesc<{_TYPES[value.base.dtype]}{list(value.block_shape)}>".replace(" ", "")
    if isinstance(value, int):
        if value % 16 == 0:
            attrs[path] = [["tt.divisibility", 16]]
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for {type(value).__name__} at argument {path}")


def _source(fn, args: tuple, kwargs: dict):
    """The ASTSource of one recorded launch: every parameter's type or constant value, by name."""
    from triton.compiler import ASTSource

    values = dict(zip(fn.arg_names, args, strict=False)) | {k: v for k, v in kwargs.items() if k not in OPTIONS}
    sig, consts, attrs = {}, {}, {}
    for i, param in enumerate(fn.params):
        name = fn.arg_names[i]
        if name not in values:
            assert param.has_default, f"{fn.__name__}: nothing launched for {name}"
            values[name] = param.default
        specialize = not getattr(param, "do_not_specialize", False)
        sig[name] = _signature(values[name], (i,), consts, attrs, constant=param.is_constexpr, specialize=specialize)
    return ASTSource(fn, sig, constexprs=consts, attrs=attrs)


def build(fn, args: tuple, kwargs: dict, arch: int):
    """One recorded launch compiled for arch (Triton's CompiledKernel: its asm and metadata)."""
    import triton
    from triton.backends.compiler import GPUTarget

    options = dict(num_warps=kwargs.get("num_warps", 4), num_stages=kwargs.get("num_stages", 3))
    return triton.compile(_source(fn, args, kwargs), target=GPUTarget("cuda", arch, 32), options=options)


def compile_for(arch: int, dtypes, stamped: bool = False):
    """Yield (dtype, name, shared bytes used, estimate, PTX) for every recorded launch, compiled for arch; raises
    if a kernel fails to build. Runs where the CPU stands for that GPU (config.STANDS_FOR). stamped: each kernel's
    variant that writes its programs' times and SMs (kernels.stamps), handed a buffer as stamping() hands it (and
    the megakernel's trace, as its tasks' stamps)."""
    import torch

    from .config import device_limits

    limits = device_limits("cpu")
    assert limits == GPUS[arch], "run with the CPU standing for this GPU"
    for dtype in dtypes:
        if dtype == "bfloat16" and not limits.bf16:
            continue  # no bf16 before Ampere; config.supported_dtypes does not offer it there
        itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        for name, fn, args, kwargs, grid in launches(dtype):
            if stamped and "Stamps" in fn.arg_names:
                kwargs = kwargs | {"Stamps": torch.zeros(1024, dtype=torch.int64)}
                if "Trace" in fn.arg_names:  # the megakernel's tasks stamp themselves as well while stamping
                    kwargs["Trace"] = torch.zeros(1024, dtype=torch.int64)
            k = build(fn, args, kwargs, arch)
            held = _all_resident(fn, args, kwargs, grid, k, arch)
            name = f"{name} ({fn.__name__})"
            yield dtype, name, k.metadata.shared, _estimate(fn, kwargs, itemsize, limits), k.asm.get("ptx", ""), held


# Kernels whose programs wait for each other: every program of a launch must be resident at once.
WAITING = {"_decode_layer_kernel", "_decode_step_kernel"}


def _all_resident(fn, args, kwargs, grid, compiled, arch: int) -> bool | None:
    """For a kernel whose programs wait for each other, whether the GPU holds all of a launch's programs at once
    (the compiled kernel's residency, kernels.occupancy, times the SMs); None for the others."""
    if fn.__name__ not in WAITING:
        return None
    from .occupancy import SMS, grid_programs, occupancy, resources

    return (
        grid_programs(grid, fn, args, kwargs) <= occupancy(resources(compiled), SMS[arch]).resident * GPUS[arch].num_sms
    )


def _dtype(value: str) -> str:
    if value not in DTYPES:
        raise ValueError(f"unknown --dtype {value}: choose from {' '.join(DTYPES)}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="*", default=[str(a) for a in GPUS], help="75 .. 120, or sm_75 .. sm_120")
    parser.add_argument("--dtype", nargs="*", default=list(DTYPES), help=" ".join(DTYPES))
    parser.add_argument("--ptx", metavar="DIR", help="also write each launch's PTX to DIR/sm_<arch>/<dtype>/")
    parser.add_argument(
        "--stamped", action="store_true", help="the variants that stamp their programs (kernels.stamps)"
    )
    args = parser.parse_args()
    try:
        archs, dtypes = [arch_of(a, "--arch") for a in args.arch], [_dtype(d) for d in args.dtype]
    except ValueError as e:  # one line naming the values allowed, not a traceback
        sys.exit(str(e))
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles the kernels for real GPUs")
    if len(archs) > 1 or os.environ.get(STANDS_FOR) != str(archs[0]):
        # One process per GPU, in which the CPU stands for it: the tile rules read the device once and keep it.
        failed = 0
        for a in archs:
            cmd = [sys.executable, "-m", "kernels.compile_check", "--arch", str(a), "--dtype", *dtypes]
            cmd += ["--ptx", args.ptx] if args.ptx else []
            cmd += ["--stamped"] if args.stamped else []
            failed |= subprocess.run(cmd, env=os.environ | {STANDS_FOR: str(a)}).returncode
        sys.exit(1 if failed else 0)
    sys.exit(0 if check(archs[0], dtypes, args.ptx, args.stamped) else 1)


def check(arch: int, dtypes, ptx: str | None = None, stamped: bool = False) -> bool:
    """Compile every launch for arch, a line each, then a line of totals; whether every one fits. With `ptx`, each
    launch's PTX goes to ptx/sm_<arch>/<dtype>/<launch>.ptx, to compare a kernel's instructions before and after a
    change (python -m kernels.ptx BEFORE AFTER)."""
    from pathlib import Path

    gpu = GPUS[arch]
    failures, counts, most = 0, {}, 0
    for dtype, name, shared, estimate, asm, held in compile_for(arch, dtypes, stamped):
        if ptx:
            folder = Path(ptx) / f"sm_{arch}" / dtype
            folder.mkdir(parents=True, exist_ok=True)
            (folder / (name.replace("/", "of").replace(" ", "_") + ".ptx")).write_text(asm)
        ok = shared <= gpu.shared_memory and (estimate == 0 or shared <= estimate) and held is not False
        failures += not ok
        counts[dtype] = counts.get(dtype, 0) + 1
        most = max(most, shared)
        head = f"sm_{arch} {gpu.name:12} {dtype:9} {name:66}"
        limit = gpu.shared_memory
        verdict = "ok" if ok else ("NOT ALL RESIDENT" if held is False else "OVER")
        print(f"{head} shared {shared:7} estimate {estimate:7} limit {limit:7} {verdict}", flush=True)
    launched = ", ".join(f"{n} {d}" for d, n in counts.items())
    verdict = "all ok" if not failures else f"{failures} OVER or not all resident"
    print(
        f"summary sm_{arch} {gpu.name}: {sum(counts.values())} launches ({launched}), {verdict}; "
        f"most shared memory {most} of {gpu.shared_memory} bytes",
        flush=True,
    )
    return not failures


if __name__ == "__main__":
    main()
