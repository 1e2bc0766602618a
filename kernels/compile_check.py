"""Compile every kernel for the GPUs a Space may offer, without a GPU: python -m kernels.compile_check

Triton compiles to PTX and cubin on any machine (ptxas ships with it), so this catches a kernel that
does not build for an architecture, and reads the shared memory the compiled kernel really uses,
which must stay within that GPU's limit and within what kernels/config.py estimates (the estimate is
what refuses a config before launch). What is compiled is what the launchers launch: each is called on
CPU tensors with launches recorded instead of run (kernels.launch.recording), in a process per GPU where
the CPU stands for that GPU (config.STANDS_FOR), and every argument's type is read from the value
launched with it. Run without TRITON_INTERPRET.
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
    """Yield (name, kernel, args, kwargs) for every kernel, as its launcher launches it for the decoder's shapes
    (GPT-2 small's and SmolLM2-135M's), recorded on CPU tensors rather than run (kernels.launch.recording).
    Run where the CPU stands for the GPU being compiled for (config.STANDS_FOR), so each tile rule answers as
    it would there."""
    import kernels as K

    from . import launch
    from .config import TileConfig
    from .matmul import kernel as L

    tdt = getattr(torch, dtype)
    t = lambda *shape: torch.randn(*shape, dtype=tdt)
    lengths = lambda batch, n: torch.full((batch,), n, dtype=torch.int32)
    C, H, D = 768, 12, 64  # GPT-2 small
    ln = (t(C), t(C), 1e-5)
    rms = (t(576), None, 1e-5)  # SmolLM2's RMSNorm: a weight, no bias
    cache = lambda batch, heads, n: (t(batch, heads, n, D), t(batch, heads, n, D))
    persistent = L.persistent_form(4096, tdt, "cpu")
    calls = {
        "layer_norm": lambda: K.layer_norm(t(4096, C), *ln[:2], residual=t(4096, C)),
        "rms_norm": lambda: K.rms_norm(t(4096, 576), t(576), residual=t(4096, 576)),
        "swiglu": lambda: K.swiglu(t(1024, 576), t(3072, 576)),
        "rotary": lambda: K.rotary(t(1, 9, 1024, D), torch.arange(1024)[None], 100000.0),
        "grouped_attention": lambda: K.grouped_attention(t(1, 9, 1024, D), *cache(1, 3, 1024)),
        "grouped_decode_attention": lambda: K.grouped_decode_attention(
            t(1, 9, 1, D), *cache(1, 3, 4096), lengths(1, 4000)
        ),
        "grouped_decode_attention B=8": lambda: K.grouped_decode_attention(
            t(8, 9, 1, D), *cache(8, 3, 4096), lengths(8, 4000)
        ),
        "linear": lambda: K.linear(t(4096, C), t(4 * C, C), t(4 * C), activation="gelu", residual=t(4096, 4 * C)),
        "linear split-k": lambda: K.linear(
            t(1, C), t(4 * C, C), t(4 * C), activation="gelu", config=TileConfig(split_k=4)
        ),
        "decode linear": lambda: K.decode_linear(
            t(1, C),
            t(3 * C, C),
            t(3 * C),
            norm=ln,
            kv=(*cache(1, H, 1024), lengths(1, 1000)),
            config=TileConfig(block_n=32, block_k=128, split_k=4),
            pdl=True,
        ),
        "decode prefetch c_attn": lambda: K.decode_linear(
            t(1, C), t(3 * C, C), t(3 * C), norm=ln, kv=(*cache(1, H, 1024), lengths(1, 1000)), pdl=True
        ),
        "decode prefetch c_fc": lambda: K.decode_linear(
            t(1, C), t(4 * C, C), t(4 * C), activation="gelu", norm=ln, pdl=True
        ),
        "decode prefetch mlp.c_proj": lambda: K.decode_linear(
            t(1, 4 * C), t(C, 4 * C), t(C), residual=t(1, C), pdl=True
        ),
        # SmolLM2's decode rung: RMSNorm prologues, rotary and a grouped cache write in c_attn's epilogue, SwiGLU
        # in c_fc's, the LM head in the K loop, attention launched to overlap.
        "decode prefetch llama c_attn": lambda: K.decode_linear(
            t(1, 576), t(960, 576), norm=rms, kv=(*cache(1, 3, 1024), lengths(1, 1000)), rope=1e5, pdl=True
        ),
        "decode prefetch llama c_fc": lambda: K.decode_linear(
            t(1, 576), t(3072, 576), activation="swiglu", norm=rms, pdl=True
        ),
        "decode llama lm_head": lambda: K.decode_linear(
            t(1, 576), t(4096, 576), norm=rms, config=TileConfig(block_n=128, block_k=64), pdl=True
        ),
        "grouped_decode_attention pdl": lambda: K.grouped_decode_attention(
            t(1, 9, 1, D), *cache(1, 3, 4096), lengths(1, 4000), pdl=True
        ),
        "attention": lambda: K.attention(t(1, H, 1024, D), t(1, H, 1024, D), t(1, H, 1024, D)),
        "decode layer": lambda: K.decode_layer(
            t(1, C),
            ln[:2],
            (t(3 * C, C), t(3 * C)),
            (t(C, C), t(C)),
            ln[:2],
            (t(4 * C, C), t(4 * C)),
            (t(C, 4 * C), t(C)),
            (*cache(1, H, 1024), lengths(1, 1000), lengths(1, 1001)),
        ),
        "kv write": lambda: K.kv_write(t(1, H, 1, D), t(1, H, 1, D), *cache(1, H, 1024), lengths(1, 1000)),
        "add": lambda: K.elementwise.add(t(1 << 20), t(1 << 20)),
        "bias add": lambda: K.elementwise.bias_add(t(1024, 1024), t(1024)),
        "gelu": lambda: K.elementwise.gelu(t(1 << 20)),
    }
    # Decode attention: a split of one key tile in the vector loop (B=1, 8192 keys: 64 splits), splits of several
    # tiles in the dot form (8 splits of 8192 keys, and the default at B=8); in two launches and in one, held
    # around the programmatic-dependent-launch wait or not.
    for form, batch, split_k in (("1 tile", 1, None), ("dot", 1, 8), ("dot default", 8, None)):
        for one_launch, pdl in ((False, False), (True, False), (True, True)):
            label = f"decode attention {form}{' one launch' if one_launch else ''}{' pdl' if pdl else ''}"
            calls[label] = lambda b=batch, s=split_k, o=one_launch, p=pdl: K.decode_attention(
                t(b, H, 1, D), *cache(b, H, 8192), lengths(b, 8000), config=TileConfig(split_k=s), one_launch=o, pdl=p
            )
    if persistent:  # the tile form too, where prefill takes the persistent form by default (config.tma_matmul)
        calls["linear tiles"] = lambda: _tiles_form(
            K.linear, t(4096, C), t(4 * C, C), t(4 * C), residual=t(4096, 4 * C)
        )
        calls["linear + gelu"] = lambda: K.linear(t(4096, C), t(4 * C, C), t(4 * C), activation="gelu")
    for name, call in calls.items():
        with launch.recording() as got:
            call()
        assert got, f"{name}: nothing launched"
        for i, (fn, args, kwargs) in enumerate(got):
            yield (name if len(got) == 1 else f"{name} [{i + 1}/{len(got)}]"), fn, args, kwargs


def _tiles_form(linear, *args, **kwargs):
    from .matmul.kernel import forced_form

    with forced_form(False):
        return linear(*args, **kwargs)


def _estimate(fn, kwargs: dict, itemsize: int, limits) -> int:
    """What config.py estimates the kernel's shared memory at when it validates the tiles (0: no estimate)."""
    from .attn import decode as AD
    from .attn import kernel as A
    from .attn.decode_tiles import decode_shared_memory
    from .config import TileConfig
    from .matmul import decode as FL
    from .matmul import kernel as L
    from .matmul import swiglu as SW

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
    elements' types."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(value, tuple):
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


def compile_for(arch: int, dtypes):
    """Yield (dtype, name, shared bytes used, estimate) for every recorded launch, compiled for arch; raises if a
    kernel fails to build. Runs where the CPU stands for that GPU (config.STANDS_FOR)."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from .config import device_limits

    limits = device_limits("cpu")
    assert limits == GPUS[arch], "run with the CPU standing for this GPU"
    for dtype in dtypes:
        if dtype == "bfloat16" and not limits.bf16:
            continue  # no bf16 before Ampere; config.supported_dtypes does not offer it there
        itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        for name, fn, args, kwargs in launches(dtype):
            options = dict(num_warps=kwargs.get("num_warps", 4), num_stages=kwargs.get("num_stages", 3))
            k = triton.compile(_source(fn, args, kwargs), target=GPUTarget("cuda", arch, 32), options=options)
            yield dtype, f"{name} ({fn.__name__})", k.metadata.shared, _estimate(fn, kwargs, itemsize, limits)


def _dtype(value: str) -> str:
    if value not in DTYPES:
        raise ValueError(f"unknown --dtype {value}: choose from {' '.join(DTYPES)}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", nargs="*", default=[str(a) for a in GPUS], help="75 .. 120, or sm_75 .. sm_120")
    parser.add_argument("--dtype", nargs="*", default=list(DTYPES), help=" ".join(DTYPES))
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
            failed |= subprocess.run(cmd, env=os.environ | {STANDS_FOR: str(a)}).returncode
        sys.exit(1 if failed else 0)
    sys.exit(0 if check(archs[0], dtypes) else 1)


def check(arch: int, dtypes) -> bool:
    """Compile every launch for arch, a line each, then a line of totals; whether every one fits."""
    gpu = GPUS[arch]
    failures, counts, most = 0, {}, 0
    for dtype, name, shared, estimate in compile_for(arch, dtypes):
        ok = shared <= gpu.shared_memory and (estimate == 0 or shared <= estimate)
        failures += not ok
        counts[dtype] = counts.get(dtype, 0) + 1
        most = max(most, shared)
        head = f"sm_{arch} {gpu.name:12} {dtype:9} {name:66}"
        limit = gpu.shared_memory
        print(f"{head} shared {shared:7} estimate {estimate:7} limit {limit:7} {'ok' if ok else 'OVER'}", flush=True)
    launched = ", ".join(f"{n} {d}" for d, n in counts.items())
    verdict = "all ok" if not failures else f"{failures} OVER"
    print(
        f"summary sm_{arch} {gpu.name}: {sum(counts.values())} launches ({launched}), {verdict}; "
        f"most shared memory {most} of {gpu.shared_memory} bytes",
        flush=True,
    )
    return not failures


if __name__ == "__main__":
    main()
