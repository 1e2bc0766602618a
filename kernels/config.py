"""Tile configurations, device limits and validation for every kernel.

A TileConfig names the tile sizes and launch options a person can choose. Each kernel reads the
fields it uses and ignores the rest; a field left as None takes that kernel's default for the
device and shape. Validation happens on the host before any launch, so an impossible choice is a
ValueError that names the field, the value and the limit, never a crash inside a compiler.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, fields, replace

import torch

# Shared memory assumed when kernels run in Triton's CPU interpreter: 99 KiB, what one block may
# use on an A10G or L4 (the common Spaces GPUs), so a config accepted on CPU also fits there.
CPU_SHARED_MEMORY = 101376
# Multiprocessor count assumed on CPU: the interpreter runs programs one after another, so a small
# number keeps default grids (split counts) small.
CPU_NUM_SMS = 4
# L2 size assumed when torch cannot tell (CPU): 50 MiB, an H100's or H200's. It only feeds the HBM
# level of the traffic models, so CPU runs chart what the common large GPU would move.
CPU_L2_BYTES = 50 * 1024 * 1024
# Share of L2 the HBM models let a re-read working set use. H100/H200 L2 is two partitions, and
# what a kernel streams once (outputs, the other operand) competes for the same lines, so counting on
# all of it would call re-reads hits long after they stop being hits. An assumption, not a fit: every
# shape measured so far (kernels.ncu_check) has working sets far below either bound.
L2_USABLE = 0.5
# Bytes per L2 sector: the unit in which L2 serves requests, so a 4-byte scalar load or store costs 32.
SECTOR = 32

KERNELS = ("layer_norm", "linear", "attention", "decode_attention")


@dataclass(frozen=True)
class TileConfig:
    block_m: int | None = None  # rows (queries, tokens) per program
    block_n: int | None = None  # columns (keys, output features) per program or per loop step
    block_k: int | None = None  # reduction step of the matmul
    group_m: int | None = None  # matmul: row tiles grouped so neighbours share weight tiles in L2
    split_k: int | None = None  # decode paths: splits of the reduction (linear) or of the keys (attention)
    num_warps: int | None = None
    num_stages: int | None = None

    def merged(self, default: TileConfig) -> TileConfig:
        """Fields left as None take the value from `default`."""
        return replace(default, **{f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None})

    def __str__(self) -> str:
        parts = [f"{f.name}={v}" for f in fields(self) if (v := getattr(self, f.name)) is not None]
        return "TileConfig(" + ", ".join(parts) + ")"


# Allowed values of each field, per kernel: (low, high), powers of two in between.
BOUNDS = {
    **{name: {"block_m": (1, 64), "block_n": (16, 65536), "num_warps": (1, 32)} for name in ("layer_norm", "rms_norm")},
    "linear": {
        "block_m": (16, 256),
        "block_n": (16, 256),
        "block_k": (16, 256),
        "group_m": (1, 64),
        "split_k": (1, 64),
        "num_warps": (1, 16),
        "num_stages": (1, 8),
    },
    # block_m is fixed at 16 (all rows in one tile), checked by the launcher itself.
    "decode_linear": {
        # 8 in the prefetch form only (the K loop's tl.dot needs 16); past 256 only where the prefetch form's
        # slice still fits (fused_linear_tiles: in practice, the interpreter's one program per launch).
        "block_n": (8, 4096),
        "block_k": (16, 4096),  # from block_k >= a split's K slice on, the prefetch form (fused_linear)
        "split_k": (1, 64),
        "num_warps": (1, 16),
        "num_stages": (1, 8),
    },
    "attention": {"block_m": (16, 256), "block_n": (16, 256), "num_warps": (1, 16), "num_stages": (1, 8)},
    "decode_attention": {"block_n": (16, 1024), "split_k": (1, 256), "num_warps": (1, 16), "num_stages": (1, 8)},
    # kernels.ops.elementwise.kernel: block_n elements of the flat view per program.
    **{name: {"block_n": (16, 65536), "num_warps": (1, 32)} for name in ("add", "bias_add", "gelu")},
}


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    shared_memory: int  # bytes one program (thread block) may use
    num_sms: int
    capability: tuple[int, int]  # (0, 0) on CPU
    bf16: bool
    l2_bytes: int = CPU_L2_BYTES  # L2 cache size; only the traffic models' HBM level reads it
    stands_for: int | None = None  # the architecture (90 for sm_90) of the GPU these limits stand for, if any

    @property
    def is_cpu(self) -> bool:
        return self.capability == (0, 0)


MiB = 1 << 20
# The GPUs a Space may offer, by architecture: sm_75 is 75. Shared memory is the most one block may use (opted
# in), from the CUDA C++ Programming Guide's table of compute capabilities (64 KB on 7.5, 163 KB on 8.0, 99 KB on
# 8.6, 8.9 and 12.0, 227 KB on 9.0 and 10.0); SMs and L2 are the named card's, from NVIDIA's datasheets and the
# sizes torch reports. One card per architecture: sm_89 is the L4 (an L40S has 142 SMs and 96 MB of L2, the
# same shared memory), sm_90 the H100 (an H200 has the same SMs and shared memory, and 60 MB of L2).
GPUS = {
    75: DeviceLimits("T4", 65536, 40, (7, 5), False, 4 * MiB),
    80: DeviceLimits("A100", 166912, 108, (8, 0), True, 40 * MiB),
    86: DeviceLimits("A10G", 101376, 80, (8, 6), True, 6 * MiB),
    89: DeviceLimits("L4", 101376, 58, (8, 9), True, 48 * MiB),
    90: DeviceLimits("H100", 232448, 132, (9, 0), True, 50 * MiB),
    100: DeviceLimits("B200", 232448, 148, (10, 0), True, 132644864),  # 126.5 MiB
    120: DeviceLimits("RTX Pro 6000", 101376, 188, (12, 0), True, 128 * MiB),  # ZeroGPU's since May 2026
}


def arch(text, what: str = "GPU") -> int:
    """An architecture of GPUS from "120" or "sm_120"; a ValueError naming the ones allowed otherwise (what: the
    setting that gave it, for the message)."""
    value = str(text).strip().lower().removeprefix("sm_")
    if not value.isdigit() or int(value) not in GPUS:
        raise ValueError(f"unknown {what} {text}: choose from {' '.join(map(str, GPUS))}")
    return int(value)


# An H200 as the tile rules see it, for code that plans for one with no GPU to ask (the app's estimates, whose
# compile times were timed there; kernels.ncu_check --model-only on CPU).
H200 = replace(GPUS[90], name="NVIDIA H200")


# Forms of a kernel that need more than every GPU has, each chosen by compute capability (a GPU's (major, minor)),
# with a fallback everywhere else. Each was compiled for sm_90, sm_100 and sm_120 by Triton 3.9 (kernels.compile_check).


def tma_matmul(capability: tuple[int, int]) -> bool:
    """Whether prefill's linear takes its persistent form (kernels.ops.linear.kernel._linear_persistent_kernel): where
    the GPU has a TMA unit and a tensor-core MMA that Triton pipelines with it, Hopper's wgmma (sm_90) and
    datacenter Blackwell's tcgen05 (sm_100, sm_103). Consumer Blackwell (sm_120: the RTX Pro 6000) has the TMA unit
    but neither MMA: Triton builds the form there with mma.sync, and its tiles, chosen for 227 KB of shared memory,
    fit sm_120's 99 KB only without pipelining. There, and before Hopper, the tile kernel runs."""
    return capability[0] in (9, 10)


def dependent_launch(capability: tuple[int, int]) -> bool:
    """Whether the GPU has programmatic dependent launch (kernels.pdl; griddepcontrol in PTX): sm_90 on, the
    Blackwells included."""
    return capability >= (9, 0)


def mma_barrier_bytes(device, dots: int = 1) -> int:
    """Shared memory Triton reserves beyond the tiles for the tensor-core MMAs of a pipelined loop: on sm_100 and
    sm_103 each tl.dot runs on tcgen05 with its accumulator in tensor memory, and gets a pair of 8-byte barriers
    that say when its MMA has finished (an i64 2x1 local_alloc in the compiled kernel: the linear's one dot 16
    bytes, SwiGLU's two 32). Hopper's wgmma and mma.sync wait in registers. Counted whatever the tile (below 64
    rows Triton takes mma.sync even there): 16 bytes too many costs nothing, 16 too few fails at launch."""
    capability = device_limits(device).capability
    return 16 * dots if capability[0] == 10 else 0


@functools.cache
def _cuda_limits(index: int) -> DeviceLimits:
    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0)
    if not smem:
        import triton

        smem = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return standing_in(physical_limits(props, smem), os.environ.get(GPU_STANDS_FOR))


def physical_limits(props, shared_memory: int) -> DeviceLimits:
    """A GPU's limits from its torch device properties and the shared memory one block may use."""
    capability = (props.major, props.minor)
    l2 = getattr(props, "L2_cache_size", 0) or CPU_L2_BYTES
    return DeviceLimits(
        props.name, int(shared_memory), props.multi_processor_count, capability, capability >= (8, 0), int(l2)
    )


# The GPU suite runs on one GPU (an H200) for all the GPUs a Space may offer: with this variable set to one of them
# (EXPLORER_GPU_STANDS_FOR=sm_120), the GPU stands for it. Unset, nothing changes.
GPU_STANDS_FOR = "EXPLORER_GPU_STANDS_FOR"


def standing_in(real: DeviceLimits, stands_for: str | None) -> DeviceLimits:
    """The limits the kernels see on the GPU `real` standing for the GPU of GPUS named by `stands_for` ("sm_120",
    "120"; None or "": `real` itself).

    What the code decides from is the stood-for GPU's: shared memory per block (so every tile rule, default and
    refusal is that GPU's), compute capability (so the forms chosen are that GPU's: the persistent TMA linear,
    programmatic dependent launch, the pipeline stages) and bf16. What the hardware does stays the real GPU's: its
    SM count, which sizes the grids whose programs must all be resident at once (the persistent layer's grid
    barrier would wait forever for programs that no SM is free to run) and the splits sized to fill the GPU; and
    its L2, which the traffic models hold against the real GPU's counters. Triton still compiles for the real GPU.

    A GPU cannot stand for one that needs more than it has: more shared memory per block, bf16, or a form the
    real GPU lacks. That is a ValueError in one line."""
    if not stands_for:
        return real
    number = arch(stands_for, GPU_STANDS_FOR)
    other, label = GPUS[number], f"sm_{number} ({GPUS[number].name})"
    lacks = {
        f"{other.shared_memory} bytes of shared memory per block": other.shared_memory > real.shared_memory,
        "bf16": other.bf16 and not real.bf16,
        "the persistent TMA linear": tma_matmul(other.capability) and not tma_matmul(real.capability),
        "programmatic dependent launch": dependent_launch(other.capability) and not dependent_launch(real.capability),
    }
    if any(lacks.values()):
        needs = ", ".join(what for what, lacked in lacks.items() if lacked)
        raise ValueError(f"the {real.name} cannot stand for {label}: that needs {needs}, which it lacks")
    return replace(
        other, name=f"{real.name} standing for {label}", num_sms=real.num_sms, l2_bytes=real.l2_bytes, stands_for=number
    )


# kernels.compile_check records the launchers' launches on CPU tensors, in a process of its own where the CPU
# stands for a GPU of GPUS (this variable holds its architecture, "120"), so that every tile rule answers as it
# would there. Nothing that runs kernels sets it.
STANDS_FOR = "EXPLORER_CPU_STANDS_FOR"


@functools.cache
def _cpu_limits() -> DeviceLimits:
    spec = os.environ.get(STANDS_FOR)
    if spec:
        return GPUS[arch(spec, STANDS_FOR)]
    return DeviceLimits("CPU (Triton interpreter)", CPU_SHARED_MEMORY, CPU_NUM_SMS, (0, 0), False)


def device_limits(device: torch.device | str | DeviceLimits | None = None) -> DeviceLimits:
    """What the kernels may use on `device` (read from the GPU; documented defaults on CPU)."""
    if isinstance(device, DeviceLimits):
        return device
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        return _cuda_limits(device.index if device.index is not None else torch.cuda.current_device())
    return _cpu_limits()


@functools.lru_cache(maxsize=64)  # asked on every launch
def overlaps_launches(device) -> bool:
    """Whether kernels may be launched with programmatic dependent launch (config.dependent_launch). A kernel
    so launched may start while the kernel before it on the stream is finishing; it must not read what that
    kernel writes (nor write what it reads) before its grid-dependency wait. The interpreter has no such
    launch: there the kernels run one after another as usual."""
    from . import pdl

    return dependent_launch(device_limits(device).capability) and pdl.gdc_wait is not None


def pipeline_stages(device) -> int:
    """Default software-pipeline depth: 3 from Ampere on (async copies), 2 before. In the CPU
    interpreter stages mean nothing, and 1 leaves the documented shared memory to larger tiles,
    which the interpreter runs faster (its cost is per program, not per element)."""
    limits = device_limits(device)
    if limits.is_cpu:
        return 1
    return 2 if limits.capability < (8, 0) else 3


def buffered_stages(num_stages: int, device) -> int:
    """Pipeline buffers Triton allocates for num_stages: as many on Ampere and later, at least two on
    Turing (seen in the kernels compiled for sm_75 by kernels.compile_check)."""
    limits = device_limits(device)
    return max(2, num_stages) if not limits.is_cpu and limits.capability < (8, 0) else num_stages


EVERYWHERE = (torch.float32, torch.float16)  # verified on every device, the interpreter included


def supported_dtypes(device: torch.device | str | None = None) -> list[torch.dtype]:
    """Dtypes the kernels are verified in on this device. bf16 needs sm80+; on CPU the Triton
    interpreter mishandles bf16, so CPU offers float32 and float16 only."""
    limits = device_limits(device)
    if limits.is_cpu:
        return [torch.float32, torch.float16]
    return ([torch.bfloat16] if limits.bf16 else []) + [torch.float16, torch.float32]


@functools.lru_cache(maxsize=64)
def _allowed(device: torch.device) -> tuple[torch.dtype, ...]:
    return tuple(supported_dtypes(device))


_VERIFIED: set = set()  # (dtype, device index) pairs already allowed: the GPU-only dtypes' fast path


def check_dtype(name: str, tensor: torch.Tensor) -> None:
    dtype = tensor.dtype
    if dtype in EVERYWHERE:  # on every launch: most calls end here
        return
    if (dtype, tensor.get_device()) in _VERIFIED:  # the rest (bf16 on a GPU) here, without a torch.device
        return
    allowed = _allowed(tensor.device)  # the device's answer is kept
    if dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise ValueError(f"{name}: dtype {dtype} is not supported on {tensor.device.type} (allowed: {names})")
    _VERIFIED.add((dtype, tensor.get_device()))


def as_config(kernel: str, config) -> TileConfig:
    if config is None:
        return TileConfig()
    if isinstance(config, TileConfig):
        return config
    raise ValueError(f"{kernel}: config must be None, a TileConfig or 'autotune', got {config!r}")


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def check_fields(kernel: str, cfg: TileConfig) -> None:
    """Each set field is an int, a power of two (stages: any int) within the kernel's bounds."""
    bounds = BOUNDS[kernel]
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if value is None:
            continue
        if f.name not in bounds:
            continue  # fields other kernels use are ignored
        lo, hi = bounds[f.name]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{kernel}: {f.name}={value!r} must be an integer")
        if f.name == "num_stages":
            if not lo <= value <= hi:
                raise ValueError(f"{kernel}: num_stages={value} is outside the allowed range {lo}..{hi}")
            continue
        if not _is_pow2(value) or not lo <= value <= hi:
            allowed = ", ".join(str(1 << i) for i in range(lo.bit_length() - 1, hi.bit_length()))
            raise ValueError(f"{kernel}: {f.name}={value} is not allowed (powers of two from {lo} to {hi}: {allowed})")


def check_shared_memory(kernel: str, cfg: TileConfig, need: int, device: torch.device, what: str) -> None:
    limits = device_limits(device)
    if need > limits.shared_memory:
        raise ValueError(
            f"{kernel}: {cfg} needs about {need} bytes of shared memory ({what}), more than the "
            f"{limits.shared_memory} bytes one block may use on {limits.name}; use smaller tiles or fewer stages"
        )


def fit_defaults(kernel: str, cfg: TileConfig, user: TileConfig, need, device) -> TileConfig:
    """Shrink the fields the user left unset (stages first, then the tiles) until `need(cfg)` bytes
    fit this device's shared memory. A user's own choices are never changed: if they do not fit,
    validation says so."""
    limit = device_limits(device).shared_memory
    lows = BOUNDS[kernel]
    while need(cfg) > limit:
        for name in ("num_stages", "block_k", "block_n", "block_m"):
            value = getattr(cfg, name)
            if name in lows and getattr(user, name) is None and value is not None and value > lows[name][0]:
                cfg = replace(cfg, **{name: value - 1 if name == "num_stages" else value // 2})
                break
        else:
            return cfg
    return cfg


class explain_resources:
    """Turn Triton's compile-time out-of-resources error into the same ValueError validation raises. A
    plain class, not a generator-based context manager: it wraps every launch."""

    __slots__ = ("kernel", "cfg")

    def __init__(self, kernel: str, cfg: TileConfig):
        self.kernel, self.cfg = kernel, cfg

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if kind is None:
            return False
        from triton.runtime.errors import OutOfResources

        if issubclass(kind, OutOfResources):
            raise ValueError(
                f"{self.kernel}: {self.cfg} needs {e.required} of {e.name} but the device allows {e.limit}; "
                "use smaller tiles or fewer stages"
            ) from None
        return False


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def prev_pow2(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


_poisoned = False  # see poisoned_outputs


@contextlib.contextmanager
def poisoned_outputs(on: bool = True):
    """Within this block every output buffer a launcher allocates starts as NaN (the tests run in one), so an
    element a kernel forgot to write fails the comparison instead of passing by luck."""
    global _poisoned
    before, _poisoned = _poisoned, on
    try:
        yield
    finally:
        _poisoned = before


def new_output(like: torch.Tensor, shape=None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous tensor on like's device, of like's shape and dtype unless given. Made from `like`, not by
    torch.empty(shape, dtype=, device=): parsing those arguments costs the host more than the rest of a launch."""
    if _poisoned:
        shape = like.shape if shape is None else shape
        return torch.full(shape, float("nan"), dtype=dtype or like.dtype, device=like.device)
    if shape is None:
        if dtype is None:
            return torch.empty_like(like, memory_format=torch.contiguous_format)
        return torch.empty_like(like, dtype=dtype, memory_format=torch.contiguous_format)
    return like.new_empty(shape) if dtype is None else like.new_empty(shape, dtype=dtype)


@dataclass(frozen=True)
class Traffic:
    """Modeled cost of one launch (or of an unfused sequence of launches), at two levels.

    bytes_read / bytes_written: between L2 and the SMs, every global load and store the kernel issues,
    tile re-reads included (what ncu counts as lts__t_sectors_srcunit_tex_op_read/write). It is what
    tiling controls.
    hbm_read / hbm_written: between HBM and L2, starting from cold caches. Re-reads whose working set
    fits the usable share of L2 are served there (config.l2_miss); every byte written is counted as
    reaching HBM eventually, since dirty lines are written back when evicted, whether during this
    kernel or a later one (so the HBM bytes of a sequence of launches add up). Left as None, each
    equals its L2 level: right for a plain copy, which reads and writes every byte once.
    min_bytes: the floor, each input read once and each output written once.
    """

    bytes_read: int
    bytes_written: int
    flops: int
    min_bytes: int
    hbm_read: int | None = None
    hbm_written: int | None = None

    def __post_init__(self):
        if self.hbm_read is None:
            object.__setattr__(self, "hbm_read", self.bytes_read)
        if self.hbm_written is None:
            object.__setattr__(self, "hbm_written", self.bytes_written)

    @property
    def bytes(self) -> int:
        """Bytes the SMs request, re-reads included (see hbm_bytes for the HBM level)."""
        return self.bytes_read + self.bytes_written

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_read + self.hbm_written

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def l2_miss(working_set: int, device) -> float:
    """Share of re-reads that go to HBM when the data re-read sits in a working set of this many bytes:
    none while it fits the usable share of L2 (L2_USABLE), then the part that does not fit, so the
    share grows smoothly towards 1 as the working set outgrows L2."""
    usable = L2_USABLE * device_limits(device).l2_bytes
    return 0.0 if working_set <= usable else 1.0 - usable / working_set


def hbm_reads(floor: int, issued: int, working_set: int, device) -> int:
    """HBM bytes read by a kernel that issues `issued` bytes of loads over data of `floor` bytes: the
    first touch of each byte comes from HBM (cold caches), the re-reads from L2 as l2_miss says."""
    return floor + round(max(0, issued - floor) * l2_miss(working_set, device))


def sectors(nbytes: int) -> int:
    """Bytes L2 moves for one access of nbytes: whole 32-byte sectors."""
    return cdiv(nbytes, SECTOR) * SECTOR


def resident_programs(need: int, device) -> int:
    """Programs running at once across the GPU when each needs `need` bytes of shared memory: the
    per-block limit stands in for an SM's shared memory (equal to within 1 KiB from Ampere on).
    Registers may allow fewer; the models only use this to size working sets."""
    limits = device_limits(device)
    return limits.num_sms * max(1, min(limits.shared_memory // max(1, need), 8))
