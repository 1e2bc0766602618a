"""Every operation of the decoder, declared once: the record of sizes a call runs at, the bytes and FLOPs a call
moves on each backend (its traffic model beside its kernel for Triton's; PyTorch's launches as PyTorch runs them:
unfused bias, GELU and residual passes, SDPA at its floor), whether that depends on each sequence's length, and,
for the kernels a visitor can sweep, the sweep: its default grid and shape, random inputs, the launch at one
config, its traffic and the programs the interpreter runs for it.

The traffic book (explorer.measure.traffic), the tile sweep (explorer.measure.sweeps) and the estimate of a sweep
(explorer.app.estimate) read this table; none of them names an operation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from . import elementwise, reference, sizes
from .config import TileConfig, Traffic, cdiv
from .ops import decode_step as decode_step_parts
from .ops.attention.kernel import attention, traffic_floor
from .ops.attention.kernel import resolve_config as attention_tiles
from .ops.attention.kernel import traffic as attention_traffic
from .ops.decode_attention.kernel import decode_attention, decode_traffic
from .ops.decode_attention.tiles import resolve_decode_config
from .ops.decode_layer.kernel import decode_layer
from .ops.decode_layer.kernel import traffic as decode_layer_traffic
from .ops.decode_linear.kernel import decode_linear as decode_linear_launch
from .ops.decode_linear.kernel import traffic as decode_linear_traffic
from .ops.decode_linear.tiles import resolve_config as decode_linear_tiles
from .ops.decode_step.kernel import decode_step
from .ops.grouped_attention import kernel as grouped_prefill
from .ops.grouped_decode_attention import kernel as grouped
from .ops.grouped_decode_attention.kernel import grouped_decode_attention
from .ops.kv_write.kernel import kv_write
from .ops.kv_write.kernel import traffic as kv_write_traffic
from .ops.layer_norm import kernel as norm_kernel
from .ops.layer_norm.kernel import layer_norm
from .ops.layer_norm.kernel import traffic as layer_norm_traffic
from .ops.layer_norm.kernel import traffic_unfused as layer_norm_unfused
from .ops.linear.kernel import DECODE_ROWS, linear
from .ops.linear.kernel import resolve_config as linear_config
from .ops.linear.kernel import traffic as linear_traffic
from .ops.linear.kernel import traffic_unfused as linear_unfused
from .ops.rms_norm import kernel as rms
from .ops.rotary.kernel import rotary
from .ops.rotary.kernel import traffic as rotary_traffic
from .ops.swiglu import kernel as swiglu_module

# book(sizes, itemsize, *, triton, config, dtype, device, lengths) -> Traffic: one call's bytes and FLOPs
Book = Callable[..., Traffic]


@dataclass(frozen=True)
class Sweep:
    """How the tile sweep runs one kernel: every config of `grid` at a `shape` (by default `shape`, a GPU's)."""

    grid: dict  # tile field -> the values swept
    shape: dict  # the default shape: size name -> value
    inputs: Callable  # (shape, dtype, device) -> a fresh tuple of random inputs
    run: Callable  # (config, *inputs) -> the kernel's output at that config
    traffic: Callable  # (shape, itemsize, config, dtype, device) -> Traffic
    programs: Callable  # (shape, config as a dict) -> programs (and their loop steps) the interpreter runs
    elements: Callable  # (shape) -> the elements of its inputs and output, what one input set holds
    check: Callable = lambda shape: None  # raises ValueError for a shape the kernel cannot take


@dataclass(frozen=True)
class Counted:
    """How kernels.ncu_check holds one kernel to the hardware counters, at a case's shape (size name -> value)."""

    model: Callable  # (shape, itemsize, dtype, device) -> (its Traffic, the TileConfig it launches with or None)
    call: Callable  # (shape, rand, device) -> a function that launches it once on inputs made by rand(*sizes)


@dataclass(frozen=True)
class Make:
    """The CPU tensors kernels.compile_check launches with (recorded, not run), in the dtype it compiles."""

    t: Callable  # t(*shape): random values
    lengths: Callable  # lengths(batch, n): every sequence n long
    cache: Callable  # cache(batch, heads, n): a K and a V cache of 64-wide heads
    ln: tuple  # GPT-2 small's LayerNorm: (weight, bias, eps)
    rms: tuple  # SmolLM2's RMSNorm: (weight, None, eps)
    persistent: bool  # prefill takes the persistent linear on the GPU the CPU stands for


@dataclass(frozen=True)
class Operation:
    name: str
    sizes: type  # the NamedTuple of kernels.sizes a call's sizes are recorded in
    book: Book
    launch: Callable | None = None  # the launcher (None: PyTorch's own gather)
    reference: Callable | None = None  # its PyTorch twin in kernels.reference, where it has one of its own
    tiles: Callable | None = None  # its tile rule: the config a call runs with, from the one asked for
    by_length: bool = False  # its traffic depends on each sequence's length (decode attention over a cache)
    sweep: Sweep | None = None
    # launches(sizes, config, dtype, device) -> kernels one Triton call launches (split-K, a merge launched apart)
    launches: Callable = lambda s, config, dtype, device: 1
    counted: Counted | None = None  # held to the hardware counters by kernels.ncu_check
    # compiles(make) -> {label: a launch as the decoder makes it}: what kernels.compile_check builds for each GPU
    compiles: Callable = lambda make: {}
    # the tiles config="autotune" times, by the kind its launcher asks kernels.autotune for
    candidates: dict = field(default_factory=dict)
    # where one launch runs several operations (the megakernel rung's step): its book split by them, called as book
    # is, as {operation: Traffic} summing to the book's
    parts: Book | None = None


def _passes(reads: int, writes: int, elements: int, item: int, flops: int = 0) -> Traffic:
    """Elementwise PyTorch launches, each reading or writing `elements` values: `reads` and `writes` of them."""
    n = elements * item
    return Traffic(reads * n, writes * n, flops, 2 * n)


def _random(dtype, device):
    return lambda *shape: torch.randn(*shape, device=device, dtype=dtype)


def _full_cache(B: int, T: int, device):
    return torch.full((B,), T, device=device, dtype=torch.int32)


# --- Held to the hardware counters (kernels.ncu_check) -------------------------------------------------------


def _lengths(batch: int, n: int, device):
    return torch.full((batch,), n, device=device, dtype=torch.int32)


def _counted_norm(kernel: str, module, launch, with_bias: bool) -> Counted:
    def model(g, item, dtype, device):
        t = module.traffic(g["rows"], g["width"], item, residual=True, device=device)
        return t, module.resolve_config(None, g["rows"], g["width"], device, kernel)

    def call(g, rand, device):
        x, r, w = rand(g["rows"], g["width"]), rand(g["rows"], g["width"]), rand(g["width"])
        if with_bias:
            b = rand(g["width"])
            return lambda: launch(x, w, b, residual=r)
        return lambda: launch(x, w, residual=r)

    return Counted(model, call)


def _counted_linear_model(g, item, dtype, device):
    from .ops.linear import kernel as mod

    t = mod.traffic(g["rows"], g["out"], g["inp"], item, activation="gelu", dtype=dtype, device=device)
    persistent = mod.persistent_form(g["rows"], dtype, device)
    return t, mod.resolve_config(None, g["rows"], g["out"], g["inp"], dtype, device, persistent)


def _counted_linear_call(g, rand, device):
    x, w, b = rand(g["rows"], g["inp"]), rand(g["out"], g["inp"]), rand(g["out"])
    return lambda: linear(x, w, b, activation="gelu")


def _counted_swiglu_model(g, item, dtype, device):
    t = swiglu_module.traffic(g["rows"], g["out"], g["inp"], item, dtype=dtype, device=device)
    return t, swiglu_module.resolve_config(None, g["rows"], g["out"], g["inp"], dtype, device)


def _counted_decode_linear_model(g, item, dtype, device):
    from .ops.decode_linear import kernel as mod

    fused = dict(kv=g["kv"], head_dim=64, rope=True) if "kv" in g else dict(activation="swiglu")
    fused |= dict(bias=False, norm=True, rms=True, dtype=dtype, device=device)
    t = mod.traffic(g["rows"], g["out"], g["inp"], item, **fused)
    return t, mod.resolve_config(None, g["rows"], g["out"], g["inp"], dtype, device)


def _counted_decode_linear_call(g, rand, device):
    from .ops.decode_linear.kernel import decode_linear

    x, w, norm = rand(g["rows"], g["inp"]), rand(g["out"], g["inp"]), (rand(g["inp"]), None, 1e-5)
    if "kv" not in g:
        return lambda: decode_linear(x, w, activation="swiglu", norm=norm)
    kc, vc = (rand(g["rows"], g["kv"], 1024, 64) for _ in range(2))
    lengths = _lengths(g["rows"], 1000, device)
    return lambda: decode_linear(x, w, norm=norm, kv=(kc, vc, lengths), rope=1e5)


def _counted_swiglu_call(g, rand, device):
    x, w = rand(g["rows"], g["inp"]), rand(2 * g["out"], g["inp"])
    return lambda: swiglu_module.swiglu(x, w)


def _counted_attention_model(g, item, dtype, device):
    from .ops.attention import kernel as mod

    t = mod.traffic(g["batch"], g["heads"], g["t"], g["t"], g["d"], item, dtype=dtype, device=device)
    return t, mod.resolve_config(None, g["t"], g["d"], dtype, device)


def _counted_attention_call(g, rand, device):
    q, k, v = (rand(g["batch"], g["heads"], g["t"], g["d"]) for _ in range(3))
    return lambda: attention(q, k, v, causal=True)


def _counted_decode_attention_model(g, item, dtype, device):
    from .ops.decode_attention.tiles import resolve_decode_config

    t = decode_traffic([g["n"]] * g["batch"], g["heads"], g["n"], g["d"], item, dtype=dtype, device=device)
    return t, resolve_decode_config(None, g["batch"] * g["heads"], g["n"], g["d"], dtype, device)


def _counted_decode_attention_call(g, rand, device):
    q = rand(g["batch"], g["heads"], 1, g["d"])
    kc, vc = (rand(g["batch"], g["heads"], g["n"], g["d"]) for _ in range(2))
    lengths = _lengths(g["batch"], g["n"], device)
    return lambda: decode_attention(q, kc, vc, lengths)


def _counted_grouped_model(g, item, dtype, device):
    lengths, cache = [g["n"]] * g["batch"], g.get("cache", g["n"])
    return grouped.traffic(lengths, g["heads"], g["kv"], g["d"], item, max_len=cache, device=device), None


def _counted_grouped_call(g, rand, device):
    q = rand(g["batch"], g["heads"], 1, g["d"])
    kc, vc = (rand(g["batch"], g["kv"], g.get("cache", g["n"]), g["d"]) for _ in range(2))
    n = _lengths(g["batch"], g["n"], device)
    return lambda: grouped_decode_attention(q, kc, vc, n)


def _counted_rotary_model(g, item, dtype, device):
    return rotary_traffic(g["batch"], g["heads"], g["t"], g["d"], item), None


def _counted_rotary_call(g, rand, device):
    x = rand(g["batch"], g["heads"], g["t"], g["d"])
    positions = torch.arange(g["t"], device=device)[None, :].expand(g["batch"], -1).contiguous()
    return lambda: rotary(x, positions, 100000.0)


def _counted_kv_write_model(g, item, dtype, device):
    return kv_write_traffic(g["batch"], g["heads"], g["d"], item), None


def _counted_kv_write_call(g, rand, device):
    k, v = rand(g["batch"], g["heads"], 1, g["d"]), rand(g["batch"], g["heads"], 1, g["d"])
    kc, vc = (rand(g["batch"], g["heads"], g["t_max"], g["d"]) for _ in range(2))
    lengths = torch.arange(g["batch"], device=device, dtype=torch.int32) % g["t_max"]
    return lambda: kv_write(k, v, kc, vc, lengths)


# --- Built for every GPU (kernels.compile_check): each launch as the decoder makes it, at GPT-2 small's shapes
# (C=768, 12 heads of 64) and SmolLM2-135M's (576 wide, 9 heads over 3) -----------------------------------------

C, H, D = 768, 12, 64  # GPT-2 small


def _compiles_linear(m: Make) -> dict:
    from .config import TileConfig
    from .ops.linear.kernel import forced_form

    def tiles_form(*args, **kwargs):
        with forced_form(False):
            return linear(*args, **kwargs)

    t = m.t
    calls = {
        "linear": lambda: linear(t(4096, C), t(4 * C, C), t(4 * C), activation="gelu", residual=t(4096, 4 * C)),
        "linear split-k": lambda: linear(
            t(1, C), t(4 * C, C), t(4 * C), activation="gelu", config=TileConfig(split_k=4)
        ),
    }
    if m.persistent:  # the tile form too, where prefill takes the persistent form by default (config.tma_matmul)
        calls["linear tiles"] = lambda: tiles_form(t(4096, C), t(4 * C, C), t(4 * C), residual=t(4096, 4 * C))
        calls["linear + gelu"] = lambda: linear(t(4096, C), t(4 * C, C), t(4 * C), activation="gelu")
    return calls


def _compiles_decode_linear(m: Make) -> dict:
    from .config import TileConfig
    from .ops.decode_linear.kernel import decode_linear

    t, kv = m.t, lambda heads: (*m.cache(1, heads, 1024), m.lengths(1, 1000))
    return {
        "decode linear": lambda: decode_linear(
            t(1, C),
            t(3 * C, C),
            t(3 * C),
            norm=m.ln,
            kv=kv(H),
            config=TileConfig(block_n=32, block_k=128, split_k=4),
            pdl=True,
        ),  # fmt: skip
        "decode prefetch c_attn": lambda: decode_linear(t(1, C), t(3 * C, C), t(3 * C), norm=m.ln, kv=kv(H), pdl=True),
        "decode prefetch c_fc": lambda: decode_linear(
            t(1, C), t(4 * C, C), t(4 * C), activation="gelu", norm=m.ln, pdl=True
        ),
        "decode prefetch mlp.c_proj": lambda: decode_linear(t(1, 4 * C), t(C, 4 * C), t(C), residual=t(1, C), pdl=True),
        # SmolLM2's decode rung: RMSNorm prologues, rotary and a grouped cache write in c_attn's epilogue, SwiGLU
        # in c_fc's, the LM head in the K loop.
        "decode prefetch llama c_attn": lambda: decode_linear(
            t(1, 576), t(960, 576), norm=m.rms, kv=kv(3), rope=1e5, pdl=True
        ),
        "decode prefetch llama c_fc": lambda: decode_linear(
            t(1, 576), t(3072, 576), activation="swiglu", norm=m.rms, pdl=True
        ),
        "decode llama lm_head": lambda: decode_linear(
            t(1, 576), t(4096, 576), norm=m.rms, config=TileConfig(block_n=128, block_k=64), pdl=True
        ),
    }


def _compiles_decode_attention(m: Make) -> dict:
    """A split of one key tile in the vector loop (B=1, 8192 keys: 64 splits), splits of several tiles in the dot
    form (8 splits of 8192 keys, and the default at B=8); in two launches and in one, held around the
    programmatic-dependent-launch wait or not."""
    from .config import TileConfig

    calls = {}
    for form, batch, split_k in (("1 tile", 1, None), ("dot", 1, 8), ("dot default", 8, None)):
        for one_launch, pdl in ((False, False), (True, False), (True, True)):
            label = f"decode attention {form}{' one launch' if one_launch else ''}{' pdl' if pdl else ''}"
            calls[label] = lambda b=batch, s=split_k, o=one_launch, p=pdl: decode_attention(
                m.t(b, H, 1, D), *m.cache(b, H, 8192), m.lengths(b, 8000), config=TileConfig(split_k=s),
                one_launch=o, pdl=p,
            )  # fmt: skip
    return calls


def _compiles_grouped_decode(m: Make) -> dict:
    t, cache, lengths = m.t, m.cache, m.lengths
    return {
        "grouped_decode_attention": lambda: grouped_decode_attention(
            t(1, 9, 1, D), *cache(1, 3, 4096), lengths(1, 4000)
        ),
        "grouped_decode_attention B=8": lambda: grouped_decode_attention(
            t(8, 9, 1, D), *cache(8, 3, 4096), lengths(8, 4000)
        ),
        "grouped_decode_attention pdl": lambda: grouped_decode_attention(
            t(1, 9, 1, D), *cache(1, 3, 4096), lengths(1, 4000), pdl=True
        ),
    }


def _compiles_decode_layer(m: Make) -> dict:
    from .ops.decode_layer.kernel import decode_layer

    t, ln = m.t, m.ln[:2]
    return {
        "decode layer": lambda: decode_layer(
            t(1, C),
            ln,
            (t(3 * C, C), t(3 * C)),
            (t(C, C), t(C)),
            ln,
            (t(4 * C, C), t(4 * C)),
            (t(C, 4 * C), t(C)),
            (*m.cache(1, H, 1024), m.lengths(1, 1000), m.lengths(1, 1001)),
        )
    }


def _step_shape(g) -> decode_step_parts.Shape:
    llama = g.get("kv", g["heads"]) != g["heads"]
    return decode_step_parts.Shape(
        g["width"], g["heads"], g.get("kv", g["heads"]), g["ffn"], g["vocab"], g["layers"], llama
    )


def _counted_decode_step_model(g, item, dtype, device):
    lengths = [g["context"] + 1] * g["batch"]  # each sequence attends over its cache and the new token
    return decode_step_parts.traffic(lengths, _step_shape(g), g["t_max"], item, dtype=dtype, device=device), None


def _step_of(shape, rand, positions: int):
    """A random model's parameters of this shape, as the one-launch step takes them (kernels.ops.decode_step)."""
    c = shape.width
    if shape.llama:
        layer = lambda: ((rand(c),), (rand(shape.qkv, c),), (rand(c, c),), (rand(c),), (rand(shape.fc, c),),
                         (rand(c, shape.ffn),))  # fmt: skip
        wte = rand(shape.vocab, c)
        layers = tuple(layer() for _ in range(shape.layers))
        return decode_step_parts.Step(wte, None, layers, (rand(c),), wte, 1e-5, 1e5)
    ln = lambda: (rand(c), rand(c))
    layer = lambda: (ln(), (rand(3 * c, c), rand(3 * c)), (rand(c, c), rand(c)), ln(), (rand(4 * c, c), rand(4 * c)),
                     (rand(c, 4 * c), rand(c)))  # fmt: skip
    wte = rand(shape.vocab, c)
    layers = tuple(layer() for _ in range(shape.layers))
    return decode_step_parts.Step(wte, rand(positions, c), layers, ln(), wte, 1e-5)


def _counted_decode_step_call(g, rand, device):
    shape = _step_shape(g)
    step = _step_of(shape, rand, g["t_max"])
    B = g["batch"]
    caches = [rand(shape.layers, B, shape.kv_heads, g["t_max"], shape.head_dim) for _ in range(2)]
    lengths = _lengths(B, g["context"], device)
    kv = (*caches, lengths, lengths + 1)
    ids = torch.randint(0, g["vocab"], (B,), device=device)
    return lambda: decode_step(ids, step, kv)


def _compiles_decode_step(m: Make) -> dict:
    """GPT-2 small's shape and SmolLM2-135M's, two layers each."""
    cases = {}
    for label, shape in (
        ("decode step", decode_step_parts.Shape(C, H, H, 4 * C, 50257, 2)),
        ("decode step (llama)", decode_step_parts.Shape(576, 9, 3, 1536, 49152, 2, llama=True)),
    ):
        step = _step_of(shape, m.t, 1024)
        k_cache, v_cache = (torch.stack([c, c]) for c in m.cache(1, shape.kv_heads, 1024))
        kv = (k_cache, v_cache, m.lengths(1, 1000), m.lengths(1, 1001))
        cases[label] = functools.partial(decode_step, torch.zeros(1, dtype=torch.int64), step, kv)
    return cases


def _compiles_one(label: str, make_call) -> Callable:
    """An operation built in one launch: {label: make_call(make)}."""
    return lambda m: {label: make_call(m)}


# --- Normalisation -------------------------------------------------------------------------------------------


def _norm_programs(g, c):  # three passes over a program's rows: statistics, then the store
    return 3 * cdiv(g["M"], c.get("block_m", 64))


def _book_layer_norm(s, item, *, triton, config, dtype, device, lengths):
    if triton:
        return layer_norm_traffic(s.rows, s.width, item, residual=s.residual, config=config, device=device)
    return layer_norm_unfused(s.rows, s.width, item, residual=s.residual, device=device)


def _book_rms_norm(s, item, *, triton, config, dtype, device, lengths):
    """PyTorch's RMSNorm as kernels.reference runs it: x^2, its mean, x * rsqrt and * weight (four reads, three
    writes), after the residual add's two and one."""
    if triton:
        return rms.traffic(s.rows, s.width, item, residual=s.residual, config=config, device=device)
    n = s.rows * s.width
    norm = _passes(4, 3, n, item, 4 * n)
    return norm + _passes(2, 1, n, item, n) if s.residual else norm


LAYER_NORM = Operation(
    "layer_norm",
    sizes.NormSizes,
    _book_layer_norm,
    layer_norm,
    reference.layer_norm,
    norm_kernel.resolve_config,
    counted=_counted_norm("layer_norm", norm_kernel, layer_norm, True),
    candidates={"layer_norm": [TileConfig(block_m=m, num_warps=w) for m in (1, 2, 4, 8) for w in (2, 4, 8)]},
    compiles=_compiles_one("layer_norm", lambda m: lambda: layer_norm(m.t(4096, C), *m.ln[:2], residual=m.t(4096, C))),
    sweep=Sweep(
        grid=dict(block_m=[1, 2, 4, 8, 16], num_warps=[1, 2, 4, 8]),
        shape=dict(M=4096, C=768),
        inputs=lambda g, dtype, device: (
            _random(dtype, device)(g["M"], g["C"]),
            _random(dtype, device)(g["M"], g["C"]),
            _random(dtype, device)(g["C"]),
            _random(dtype, device)(g["C"]),
        ),
        run=lambda c, x, res, w, b: layer_norm(x, w, b, residual=res, config=c),
        traffic=lambda g, item, c, dtype, device: layer_norm_traffic(g["M"], g["C"], item, residual=True, config=c),
        programs=_norm_programs,
        elements=lambda g: 3 * g["M"] * g["C"],
    ),
)
RMS_NORM = Operation(
    "rms_norm",
    sizes.NormSizes,
    _book_rms_norm,
    rms.rms_norm,
    reference.rms_norm,
    norm_kernel.resolve_config,  # called with name="rms_norm"
    counted=_counted_norm("rms_norm", rms, rms.rms_norm, False),
    compiles=_compiles_one(
        "rms_norm", lambda m: lambda: rms.rms_norm(m.t(4096, 576), m.t(576), residual=m.t(4096, 576))
    ),
    sweep=Sweep(  # RMSNorm holds rows as LayerNorm does
        grid=dict(block_m=[1, 2, 4, 8, 16], num_warps=[1, 2, 4, 8]),
        shape=dict(M=4096, C=576),  # SmolLM2-135M's width
        inputs=lambda g, dtype, device: (
            _random(dtype, device)(g["M"], g["C"]),
            _random(dtype, device)(g["M"], g["C"]),
            _random(dtype, device)(g["C"]),
        ),
        run=lambda c, x, res, w: rms.rms_norm(x, w, residual=res, config=c),
        traffic=lambda g, item, c, dtype, device: rms.traffic(g["M"], g["C"], item, residual=True, config=c),
        programs=_norm_programs,
        elements=lambda g: 3 * g["M"] * g["C"],
    ),
)


# --- Matrix products -----------------------------------------------------------------------------------------


def _linear_flags(s) -> dict:
    return dict(bias=bool(s.bias), activation="gelu" if s.gelu else None, residual=bool(s.residual))


def _book_linear(s, item, *, triton, config, dtype, device, lengths):
    if triton:
        return linear_traffic(*s[:3], item, **_linear_flags(s), config=config, dtype=dtype, device=device)
    return linear_unfused(*s[:3], item, **_linear_flags(s), device=device)


def _book_decode_linear(s, item, *, triton, config, dtype, device, lengths):
    flags = _linear_flags(s)
    if s.swiglu:
        flags["activation"] = "swiglu"
    fused = dict(norm=s.norm, rms=s.rms, kv=s.kv_heads or None, head_dim=s.head_dim or None, rope=s.rope)
    return decode_linear_traffic(*s[:3], item, **flags, **fused, config=config, dtype=dtype, device=device)


def _book_swiglu(s, item, *, triton, config, dtype, device, lengths):
    """PyTorch's: F.linear at its floor, then SiLU and the product."""
    if triton:
        return swiglu_module.traffic(s.rows, s.features, s.in_features, item, config=config, dtype=dtype, device=device)
    matmul = linear_unfused(s.rows, 2 * s.features, s.in_features, item, bias=False, device=device)
    n = s.rows * s.features
    return matmul + _passes(1, 1, n, item) + _passes(2, 1, n, item)


def _linear_launches(s, config, dtype, device) -> int:
    """A projection of a few rows splits K over programs whose partial sums a second launch adds."""
    if s.rows > DECODE_ROWS:
        return 1
    return 2 if linear_config(config, s.rows, s.out_features, s.in_features, dtype, device).split_k > 1 else 1


def _matmul_programs(g, c, n: str) -> int:
    return cdiv(g["M"], c.get("block_m", 64)) * cdiv(g[n], c.get("block_n", 64)) * cdiv(g["K"], c.get("block_k", 32))


LINEAR = Operation(
    "linear",
    sizes.LinearSizes,
    _book_linear,
    linear,
    reference.linear,
    linear_config,
    launches=_linear_launches,
    counted=Counted(_counted_linear_model, _counted_linear_call),
    compiles=_compiles_linear,
    candidates={
        "linear": [
            TileConfig(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=s)
            for (m, n, k, w, s) in [
                (128, 128, 64, 8, 3),
                (128, 256, 64, 8, 3),
                (64, 128, 64, 4, 4),
                (128, 64, 64, 4, 4),
                (64, 64, 64, 4, 4),
                (128, 128, 32, 4, 4),
            ]
        ],
        "linear_decode": [  # a few rows: the split-K form
            TileConfig(block_m=16, block_n=n, block_k=k, split_k=s, num_warps=4, num_stages=st)
            for n in (32, 64, 128)
            for k in (64, 128)
            for s in (1, 2, 4, 8)
            for st in (3, 4)
        ],
    },
    sweep=Sweep(
        grid=dict(block_m=[16, 32, 64, 128], block_n=[32, 64, 128, 256], block_k=[32, 64], num_stages=[2, 3, 4]),
        shape=dict(M=1024, K=768, N=3072),
        inputs=lambda g, dtype, device: (
            _random(dtype, device)(g["M"], g["K"]),
            _random(dtype, device)(g["N"], g["K"]) / g["K"] ** 0.5,
            _random(dtype, device)(g["N"]),
        ),
        run=lambda c, x, w, b: linear(x, w, b, activation="gelu", config=c),
        traffic=lambda g, item, c, dtype, device: linear_traffic(
            g["M"], g["N"], g["K"], item, activation="gelu", config=c, dtype=dtype, device=device
        ),
        programs=lambda g, c: _matmul_programs(g, c, "N"),
        elements=lambda g: g["M"] * g["K"] + g["N"] * g["K"] + g["M"] * g["N"],
    ),
)
DECODE_LINEAR = Operation(
    "decode_linear",
    sizes.DecodeLinearSizes,
    _book_decode_linear,
    decode_linear_launch,
    None,  # its reference is the unfused launches it replaces, composed in tests/ops/test_decode_linear.py
    decode_linear_tiles,
    counted=Counted(_counted_decode_linear_model, _counted_decode_linear_call),
    compiles=_compiles_decode_linear,
)
SWIGLU = Operation(
    "swiglu",
    sizes.SwigluSizes,
    _book_swiglu,
    swiglu_module.swiglu,
    reference.swiglu,
    swiglu_module.resolve_config,
    counted=Counted(_counted_swiglu_model, _counted_swiglu_call),
    compiles=_compiles_one("swiglu", lambda m: lambda: swiglu_module.swiglu(m.t(1024, 576), m.t(3072, 576))),
    sweep=Sweep(  # its tiles hold two weight tiles, the gate's and the up's
        grid=dict(block_m=[16, 32, 64, 128], block_n=[32, 64, 128], block_k=[32, 64], num_stages=[2, 3, 4]),
        shape=dict(M=1024, K=576, F=1536),
        inputs=lambda g, dtype, device: (
            _random(dtype, device)(g["M"], g["K"]),
            _random(dtype, device)(2 * g["F"], g["K"]) / g["K"] ** 0.5,
        ),
        run=lambda c, x, w: swiglu_module.swiglu(x, w, config=c),
        traffic=lambda g, item, c, dtype, device: swiglu_module.traffic(
            g["M"], g["F"], g["K"], item, config=c, dtype=dtype, device=device
        ),
        # a step loads three tiles (x, the gate's, the up's) where a matmul's loads two
        programs=lambda g, c: 3 * _matmul_programs(g, c, "F") // 2,
        elements=lambda g: g["M"] * g["K"] + 2 * g["F"] * g["K"] + g["M"] * g["F"],
    ),
)


# --- Attention -----------------------------------------------------------------------------------------------


def _book_attention(s, item, *, triton, config, dtype, device, lengths):
    if triton:
        return attention_traffic(*s, item, config=config, dtype=dtype, device=device)
    return traffic_floor(*s, item)


def _book_decode_attention(s, item, *, triton, config, dtype, device, lengths):
    if triton:
        return decode_traffic(
            list(lengths), s.heads, s.max_len, s.head_dim, item, config=config, one_launch=s.one_launch,
            dtype=dtype, device=device,
        )  # fmt: skip
    return traffic_floor(s.batch, s.heads, 1, s.max_len, s.head_dim, item, causal=False)  # SDPA reads every slot


def _book_grouped_attention(s, item, *, triton, config, dtype, device, lengths):
    """PyTorch's: every key/value head copied for its group (repeat_interleave), then SDPA at its floor."""
    if triton:
        return grouped_prefill.traffic(s.batch, s.heads, s.kv_heads, s.queries, s.keys, s.head_dim, item, device=device)
    copies = _passes(1, s.heads // s.kv_heads, 2 * s.batch * s.kv_heads * s.keys * s.head_dim, item)
    return copies + traffic_floor(s.batch, s.heads, s.queries, s.keys, s.head_dim, item)


def _book_grouped_decode(s, item, *, triton, config, dtype, device, lengths):
    if triton:
        return grouped.traffic(list(lengths), s.heads, s.kv_heads, s.head_dim, item, max_len=s.max_len, device=device)
    copies = _passes(1, s.heads // s.kv_heads, 2 * s.batch * s.kv_heads * s.max_len * s.head_dim, item)
    return copies + traffic_floor(s.batch, s.heads, 1, s.max_len, s.head_dim, item, causal=False)


def _decode_programs(g, c, heads: int) -> int:
    """A program per (sequence, head) and split, each walking its share of the keys in tiles of block_n."""
    splits, bn = c.get("split_k", 1), c.get("block_n", 64)
    return g["B"] * heads * splits * max(1, cdiv(cdiv(g["T"], splits), bn))


def _check_groups(g) -> None:
    if g["KV"] < 1 or g["H"] % g["KV"]:
        raise ValueError(
            f"H={g['H']} query heads cannot share KV={g['KV']} key/value heads evenly: H must be a multiple of KV "
            "(SmolLM2's 9 over 3, say)."
        )


ATTENTION = Operation(
    "attention",
    sizes.AttentionSizes,
    _book_attention,
    attention,
    reference.attention,
    attention_tiles,
    counted=Counted(_counted_attention_model, _counted_attention_call),
    candidates={
        "attention": [
            TileConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
            for (m, n, w, s) in [(128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 32, 4, 4)]
        ]
    },
    compiles=_compiles_one(
        "attention", lambda m: lambda: attention(m.t(1, H, 1024, D), m.t(1, H, 1024, D), m.t(1, H, 1024, D))
    ),
    sweep=Sweep(
        grid=dict(block_m=[16, 32, 64, 128], block_n=[16, 32, 64, 128], num_warps=[4, 8], num_stages=[1, 2, 3]),
        shape=dict(B=1, H=12, T=1024, D=64),
        inputs=lambda g, dtype, device: tuple(_random(dtype, device)(g["B"], g["H"], g["T"], g["D"]) for _ in "qkv"),
        run=lambda c, q, k, v: attention(q, k, v, config=c),
        traffic=lambda g, item, c, dtype, device: attention_traffic(
            g["B"], g["H"], g["T"], g["T"], g["D"], item, config=c, dtype=dtype, device=device
        ),
        programs=lambda g, c: g["B"] * g["H"] * cdiv(g["T"], c.get("block_m", 64)) * cdiv(g["T"], c.get("block_n", 64)),
        elements=lambda g: 3 * g["B"] * g["H"] * g["T"] * g["D"],
    ),
)
DECODE_ATTENTION = Operation(
    "decode_attention",
    sizes.DecodeAttentionSizes,
    _book_decode_attention,
    decode_attention,
    reference.decode_attention,
    resolve_decode_config,
    by_length=True,
    counted=Counted(_counted_decode_attention_model, _counted_decode_attention_call),
    compiles=_compiles_decode_attention,
    candidates={
        "decode_attention": [
            TileConfig(block_n=n, split_k=s, num_warps=w, num_stages=2)
            for n in (32, 64, 128)
            for s in (8, 16, 32, 64)
            for w in (2, 4)
        ]
    },
    launches=lambda s, config, dtype, device: 1 if s.one_launch else 2,  # the splits merged by a second launch
    sweep=Sweep(
        grid=dict(block_n=[16, 32, 64, 128, 256], split_k=[1, 4, 16, 64], num_warps=[2, 4]),
        shape=dict(B=1, H=12, T=8192, D=64),
        inputs=lambda g, dtype, device: (
            _random(dtype, device)(g["B"], g["H"], 1, g["D"]),
            _random(dtype, device)(g["B"], g["H"], g["T"], g["D"]),
            _random(dtype, device)(g["B"], g["H"], g["T"], g["D"]),
            _full_cache(g["B"], g["T"], device),
        ),
        run=lambda c, q, kc, vc, n: decode_attention(q, kc, vc, n, config=c),
        traffic=lambda g, item, c, dtype, device: decode_traffic(
            [g["T"]] * g["B"], g["H"], g["T"], g["D"], item, config=c, dtype=dtype, device=device
        ),
        programs=lambda g, c: _decode_programs(g, c, g["H"]),
        elements=lambda g: 2 * g["B"] * g["H"] * g["T"] * g["D"],
    ),
)
GROUPED_ATTENTION = Operation(
    "grouped_attention",
    sizes.GroupedAttentionSizes,
    _book_grouped_attention,
    grouped_prefill.grouped_attention,
    reference.grouped_attention,
    compiles=_compiles_one(
        "grouped_attention",
        lambda m: lambda: grouped_prefill.grouped_attention(m.t(1, 9, 1024, D), *m.cache(1, 3, 1024)),
    ),
)
GROUPED_DECODE_ATTENTION = Operation(
    "grouped_decode_attention",
    sizes.GroupedDecodeSizes,
    _book_grouped_decode,
    grouped_decode_attention,
    reference.grouped_decode_attention,
    by_length=True,
    counted=Counted(_counted_grouped_model, _counted_grouped_call),
    compiles=_compiles_grouped_decode,
    sweep=Sweep(
        grid=dict(block_n=[32, 64, 128], split_k=[1, 4, 16, 64]),
        shape=dict(B=1, H=9, KV=3, T=8192, D=64),
        inputs=lambda g, dtype, device: (
            _random(dtype, device)(g["B"], g["H"], 1, g["D"]),
            _random(dtype, device)(g["B"], g["KV"], g["T"], g["D"]),
            _random(dtype, device)(g["B"], g["KV"], g["T"], g["D"]),
            _full_cache(g["B"], g["T"], device),
        ),
        run=lambda c, q, kc, vc, n: grouped_decode_attention(q, kc, vc, n, block_n=c.block_n, split_k=c.split_k),
        traffic=lambda g, item, c, dtype, device: grouped.traffic(
            [g["T"]] * g["B"], g["H"], g["KV"], g["D"], item, device=device, block_n=c.block_n, split_k=c.split_k
        ),
        programs=lambda g, c: _decode_programs(g, c, g["KV"]),  # a program per key/value head and split
        elements=lambda g: 2 * g["B"] * g.get("KV", 1) * g["T"] * g["D"],
        check=_check_groups,
    ),
)


# --- The rest of a block -------------------------------------------------------------------------------------


def _book_kv_write(s, item, *, triton, config, dtype, device, lengths):
    if s.decode and triton:
        return kv_write_traffic(s.batch, s.heads, s.head_dim, item)
    moved = 2 * s.batch * s.heads * s.tokens * s.head_dim * item  # K and V rows read, written to the cache
    return Traffic(moved, moved, 0, 2 * moved)


def _book_rotary(s, item, *, triton, config, dtype, device, lengths):
    """PyTorch's: x * cos, the rotated half, * sin and the sum (five reads, four writes)."""
    if triton:
        return rotary_traffic(s.batch, s.heads, s.tokens, s.head_dim, item)
    n = s.batch * s.heads * s.tokens * s.head_dim
    return _passes(5, 4, n, item, 3 * n)


def _book_embedding(s, item, **_):
    n = s.rows * s.width  # two rows gathered and added per token
    return Traffic(2 * n * item, n * item, n, 3 * n * item)


def _book_token_embedding(s, item, **_):
    n = s.rows * s.width  # one row gathered per token
    return Traffic(n * item, n * item, 0, 2 * n * item)


OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (  # the sweeps in the order the sweep tab offers them
        ATTENTION,
        DECODE_ATTENTION,
        LINEAR,
        LAYER_NORM,
        RMS_NORM,
        SWIGLU,
        GROUPED_DECODE_ATTENTION,
        DECODE_LINEAR,
        GROUPED_ATTENTION,
        Operation(
            "kv_write",
            sizes.KVWriteSizes,
            _book_kv_write,
            kv_write,
            reference.kv_write,
            counted=Counted(_counted_kv_write_model, _counted_kv_write_call),
            compiles=_compiles_one(
                "kv write",
                lambda m: lambda: kv_write(m.t(1, H, 1, D), m.t(1, H, 1, D), *m.cache(1, H, 1024), m.lengths(1, 1000)),
            ),
        ),
        Operation(
            "rotary",
            sizes.RotarySizes,
            _book_rotary,
            rotary,
            reference.rotary,
            counted=Counted(_counted_rotary_model, _counted_rotary_call),
            compiles=_compiles_one(
                "rotary", lambda m: lambda: rotary(m.t(1, 9, 1024, D), torch.arange(1024)[None], 100000.0)
            ),
        ),
        Operation(
            "decode_layer",
            sizes.DecodeLayerSizes,
            lambda s, item, *, dtype, device, lengths, **_: decode_layer_traffic(
                list(lengths), s.width, s.heads, s.max_len, item, dtype=dtype, device=device
            ),
            decode_layer,
            by_length=True,
            compiles=_compiles_decode_layer,
        ),
        Operation(
            "decode_step",
            sizes.DecodeStepSizes,
            lambda s, item, *, dtype, device, lengths, **_: decode_step_parts.traffic(
                list(lengths), s.shape, s.max_len, item, dtype=dtype, device=device
            ),
            decode_step,
            by_length=True,
            counted=Counted(_counted_decode_step_model, _counted_decode_step_call),
            parts=lambda s, item, *, dtype, device, lengths, **_: decode_step_parts.parts(
                list(lengths), s.shape, s.max_len, item, dtype=dtype, device=device
            ),
            compiles=_compiles_decode_step,
        ),
        Operation(
            "bias_add",
            sizes.RowsSizes,
            lambda s, item, **_: elementwise.traffic_bias_add(*s, item),
            elementwise.bias_add,
            compiles=_compiles_one("bias add", lambda m: lambda: elementwise.bias_add(m.t(1024, 1024), m.t(1024))),
        ),
        Operation(
            "gelu",
            sizes.ElementsSizes,
            lambda s, item, **_: elementwise.traffic_gelu(s.elements, item),
            elementwise.gelu,
            compiles=_compiles_one("gelu", lambda m: lambda: elementwise.gelu(m.t(1 << 20))),
        ),
        Operation(
            "add",
            sizes.ElementsSizes,
            lambda s, item, **_: elementwise.traffic_add(s.elements, item),
            elementwise.add,
            compiles=_compiles_one("add", lambda m: lambda: elementwise.add(m.t(1 << 20), m.t(1 << 20))),
        ),
        Operation("embedding", sizes.RowsSizes, _book_embedding, launches=lambda *_: 3),  # two gathers and an add
        Operation("token_embedding", sizes.RowsSizes, _book_token_embedding),
    )
}
SWEEPS: dict[str, Sweep] = {name: op.sweep for name, op in OPERATIONS.items() if op.sweep is not None}
CANDIDATES: dict[str, list] = {kind: c for op in OPERATIONS.values() for kind, c in op.candidates.items()}


def operation(name: str) -> Operation:
    """The operation named `name`, or a ValueError listing those there are."""
    if name not in OPERATIONS:
        raise ValueError(f"operation {name!r} is not known (allowed: {', '.join(OPERATIONS)})")
    return OPERATIONS[name]


def sweep(kernel: str) -> Sweep:
    """The tile sweep of `kernel`, or a ValueError listing the kernels a sweep takes."""
    if kernel not in SWEEPS:
        raise ValueError(f"kernel {kernel!r} is not known (allowed: {', '.join(SWEEPS)})")
    return SWEEPS[kernel]
