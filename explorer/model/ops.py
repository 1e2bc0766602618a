"""The one switch between backends, the per-run tile choices, and the names of the operations.

The decoder calls every operation through an Ops object, under its GPT-2 name (ln_1, attn.c_attn,
attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, ln_f, lm_head, wte/wpe, kv write). With backend
"triton" they go to kernels/, with "torch" to kernels.reference, with the same arguments.

`fusion` chooses how many operations share a launch (a rung of the fusion ladder; Triton only):
- "none": every operation its own kernel, as eager PyTorch launches them: the matmul, then the bias,
  the GELU and the residual add each as a separate elementwise kernel;
- "epilogue": bias, GELU and residual add in the matmul's epilogue (one kernel per projection);
- "decode": in decode steps, each LayerNorm (or RMSNorm) in the prologue of the projection after it, the
  KV-cache write (after a Llama's rotary positions) in c_attn's epilogue, a Llama's SwiGLU in c_fc's, split-K
  and decode attention each finished by their own last program (kernels.arrival): five kernels per layer.
  Prefill and full-sequence passes run as "epilogue";
- "overlap": the decode rung's kernels, each launched with programmatic dependent launch (kernels.pdl) so
  that it starts while the kernel before it finishes and loads its weights before it waits for that
  kernel's output. Needs a GPU of compute capability 9.0 or later (Hopper); elsewhere it runs as "decode";
- "persistent": each GPT-2 block of a decode step in one launch (kernels.ops.decode_layer);
- "megakernel": a whole decode step in one launch, its operations tasks that wait only for the tiles they read
  (kernels.ops.decode_step); more than 16 sequences run as "decode". A Llama runs "persistent" as "overlap".
The torch backend runs PyTorch's own operations whatever the rung.

An observer may be attached: a callable `observer(op, run)` that gets an Op record (the name, the
kernel, the tiles and sizes of the call) and must return `run()`. The measure layer uses it to see
which operations a step ran and to time them; nothing here knows what it does with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import kernels
from kernels import elementwise, reference
from kernels.operations import OPERATIONS
from kernels.ops.attention.kernel import tuned_config
from kernels.ops.decode_attention.kernel import tuned_decode_config
from kernels.ops.decode_linear.kernel import tuned_config as decode_linear_tuned
from kernels.ops.decode_step import shape_of as step_shape
from kernels.ops.layer_norm.kernel import tuned_config as layer_norm_tuned
from kernels.ops.linear.kernel import DECODE_ROWS
from kernels.ops.linear.kernel import tuned_config as linear_tuned

BACKENDS = ("triton", "torch")
FUSIONS = ("none", "epilogue", "decode", "overlap", "persistent", "megakernel")
DEFAULT_FUSION = "overlap"
# the rungs whose decode steps run the fused decode kernels (the megakernel's where it cannot take a step whole)
DECODE_RUNGS = ("decode", "overlap", "persistent", "megakernel")


@dataclass(frozen=True)
class Tiles:
    """Tiles per kernel for one run; None takes the kernel's default, "autotune" times a few."""

    layer_norm: kernels.TileConfig | str | None = None
    linear: kernels.TileConfig | str | None = None  # prefill-shaped inputs (more than 16 rows)
    linear_decode: kernels.TileConfig | str | None = None  # decode-shaped inputs (16 rows or fewer)
    attention: kernels.TileConfig | str | None = None
    decode_attention: kernels.TileConfig | str | None = None

    def fixed(self, kernel: str) -> kernels.TileConfig | None:
        """The kernel's tiles where they are fixed in advance; None (its defaults) for autotune, whose
        pick is only known at the first launch."""
        cfg = getattr(self, kernel)
        return None if cfg == "autotune" else cfg


# The charts' categories, by the part of the block an operation computes with, and for attention by kernel.
CATEGORIES = {
    "ln_1": "layer_norm",
    "ln_2": "layer_norm",
    "ln_f": "layer_norm",
    "attn.c_attn": "qkv/out proj",
    "attn.c_proj": "qkv/out proj",
    "mlp.c_fc": "ffn",
    "mlp.c_proj": "ffn",
    "lm_head": "lm_head",
    "wte/wpe": "embedding",
    "wte": "embedding",
    "kv write": "kv write",
    "rope": "rotary",
}
KERNEL_CATEGORIES = {
    "attention": "attention",
    "grouped_attention": "attention",
    "decode_attention": "decode attention",
    "grouped_decode_attention": "decode attention",
    "decode_layer": "decode layer",
    "decode_step": "decode step",
    "rms_norm": "layer_norm",  # the block's normalisation, whichever kind
}
# The operations of a launch that runs several (the megakernel rung's step; kernels.operations' `parts`), under the
# categories their own kernels take on the other rungs, so that rungs compare bar for bar; and the counters its
# tasks wait on, which no other rung has.
PART_CATEGORIES = {
    "embedding": "embedding",
    "c_attn": "qkv/out proj",
    "attention": "decode attention",
    "c_proj": "qkv/out proj",
    "c_fc": "ffn",
    "mlp.c_proj": "ffn",
    "lm_head": "lm_head",
    "counters": "counters",
}


@dataclass(frozen=True, slots=True)
class Op:
    """One named operation of a forward pass, as an observer sees it: its sizes are the kernel's record of
    them (kernels.sizes: NormSizes for layer_norm, LinearSizes for linear, ...)."""

    name: str
    kernel: str
    backend: str
    sizes: tuple  # kernels.operations.OPERATIONS[kernel].sizes
    dtype: torch.dtype
    device: torch.device
    config: kernels.TileConfig | None = None  # the tiles the call used; None: the kernel's defaults
    part: str = ""  # the block's parameters it computes with ("mlp.c_fc"), where the name says more; else the name

    @property
    def category(self) -> str:
        """What it is in the charts: attention by kernel, the rest by the part of the block it belongs to (a
        fused launch "ln_2+mlp.c_fc" and a separate "mlp.c_fc.gelu" both under the projection's)."""
        if self.kernel in KERNEL_CATEGORIES:
            return KERNEL_CATEGORIES[self.kernel]
        part = self.part or self.name
        return CATEGORIES.get(part, part)


Observer = Callable[[Op, Callable[[], object]], object]


class Ops:
    def __init__(
        self,
        backend: str = "triton",
        tiles: Tiles | None = None,
        observer: Observer | None = None,
        fusion: str = DEFAULT_FUSION,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not known (allowed: {', '.join(BACKENDS)})")
        check_fusion(fusion)
        self.backend = backend
        self.fusion = fusion if backend == "triton" else "epilogue"
        self.pdl = self.fusion == "overlap"  # launch the decode kernels to overlap (kernels.pdl)
        self.tiles = tiles or Tiles()
        self.observer = observer
        self.fn = kernels if backend == "triton" else reference
        # The decode step's cache write: one Triton kernel per layer; the torch backend indexes.
        self.kv_writer = kernels.kv_write if backend == "triton" else None

    def _run(self, name: str, kernel: str, x: torch.Tensor, sizes: tuple, config, run, part: str = ""):
        if self.observer is None:
            return run()
        op = Op(name, kernel, self.backend, OPERATIONS[kernel].sizes(*sizes), x.dtype, x.device, config, part)
        return self.observer(op, run)

    def _unplanned(self, run):
        """PyTorch's attention at a new length, without a plan built for it (reference.unplanned)."""
        if self.backend != "torch":
            return run()
        with reference.unplanned():
            return run()

    def _tuned(self, cfg, tune):
        return tune() if self.backend == "triton" and cfg == "autotune" else cfg

    def layer_norm(self, name, x, weight, bias, eps, *, residual=None):
        cfg = self._tuned(self.tiles.layer_norm, lambda: layer_norm_tuned(x, weight, bias, eps, residual=residual))
        sizes = (x.numel() // x.shape[-1], x.shape[-1], residual is not None)
        run = lambda: self.fn.layer_norm(x, weight, bias, eps, residual=residual, config=cfg)
        return self._run(name, "layer_norm", x, sizes, cfg, run)

    def linear(self, name, x, weight, bias=None, *, activation=None, residual=None):
        if self.fusion == "none" and (bias is not None or activation is not None or residual is not None):
            return self._unfused_linear(name, x, weight, bias, activation, residual)
        rows = x.numel() // x.shape[-1]
        cfg = self.tiles.linear_decode if rows <= DECODE_ROWS else self.tiles.linear
        cfg = self._tuned(cfg, lambda: linear_tuned(x, weight, bias, activation=activation, residual=residual))
        sizes = (rows, *weight.shape, bias is not None, activation == "gelu", residual is not None)
        run = lambda: self.fn.linear(x, weight, bias, activation=activation, residual=residual, config=cfg)
        return self._run(name, "linear", x, sizes, cfg, run)

    def _unfused_linear(self, name, x, weight, bias, activation, residual):
        """The matmul alone, then the bias, the GELU and the residual add, each its own launch."""
        y = self.linear(name, x, weight)
        rows, width = y.numel() // y.shape[-1], y.shape[-1]
        if bias is not None:
            run = lambda: elementwise.bias_add(y, bias)
            y = self._run(f"{name}.bias", "bias_add", y, (rows, width), None, run, part=name)
        if activation == "gelu":
            y = self._run(f"{name}.gelu", "gelu", y, (y.numel(),), None, lambda: elementwise.gelu(y), part=name)
        if residual is not None:
            run = lambda: elementwise.add(residual, y)
            y = self._run(f"{name}.residual", "add", y, (y.numel(),), None, run, part=name)
        return y

    def fuses_decode(self, rows: int) -> bool:
        """Whether a decode step of this many sequences runs the decode rung's fused kernels."""
        return self.fusion in DECODE_RUNGS and rows <= DECODE_ROWS

    def decode_linear(
        self,
        name,
        x,
        weight,
        bias=None,
        *,
        activation=None,
        residual=None,
        norm=None,
        kv=None,
        rope=None,
        part: str = "",
    ):
        """One launch: the norm `norm` = (weight, bias, eps) of x (LayerNorm, or RMSNorm with bias None), the
        projection, its epilogue (GELU, or SwiGLU over a gate_up weight), and with `kv` = (k_cache, v_cache,
        lengths) the new K and V rows stored in the cache, turned first by rotary positions where `rope` (theta)
        is given. `part`: the projection's name where `name` names the fused launch."""
        rows = x.numel() // x.shape[-1]
        tune = lambda: decode_linear_tuned(
            x, weight, bias, activation=activation, residual=residual, norm=norm, kv=kv, rope=rope
        )
        cfg = self._tuned(self.tiles.linear_decode, tune)
        heads, head_dim = kv[0].shape[1::2] if kv else (0, 0)  # the cache rows the epilogue writes
        rms = bool(norm) and norm[1] is None
        flags = (bias is not None, activation == "gelu", residual is not None, bool(norm), heads, head_dim)
        sizes = (rows, *weight.shape, *flags, activation == "swiglu", rms, rope is not None)
        run = lambda: kernels.decode_linear(
            x,
            weight,
            bias,
            activation=activation,
            residual=residual,
            norm=norm,
            kv=kv,
            rope=rope,
            config=cfg,
            pdl=self.pdl,
        )
        return self._run(name, "decode_linear", x, sizes, cfg, run, part=part)

    def block(self, block, x, attend, positions):
        """One block as this rung runs it: in a decode step on the persistent rung the whole block in one launch,
        on the decode rungs its fused launches (block.decode_fused), else its forward, operation by operation."""
        rows = x.shape[0]
        if attend.mode == "decode" and self.runs_layers_whole(rows):
            cache, layer = attend.cache, attend.next_layer()
            kv = (cache.k[layer], cache.v[layer], cache.lengths, cache.next_lengths)
            return self.decode_layer("block", x, block, kv, block.eps)
        if attend.mode == "decode" and self.fuses_decode(rows):
            return block.decode_fused(x, self, attend, positions)
        return block(x, self, attend, positions)

    def runs_layers_whole(self, rows: int) -> bool:
        """Whether a decode step of this many sequences runs each block in one launch (the persistent rung)."""
        return self.fusion == "persistent" and rows <= DECODE_ROWS

    def runs_step_whole(self, rows: int) -> bool:
        """Whether a decode step of this many sequences is one launch (the megakernel rung)."""
        return self.fusion == "megakernel" and rows <= DECODE_ROWS

    def decode_step(self, name, model, ids, cache):
        """A whole decode step in one launch (GPT-2's or a Llama's): ids (B,) -> logits (B, vocab); the tokens go in at
        cache.lengths and attend over cache.next_lengths."""
        step = model.step_parts()
        kv = (cache.k, cache.v, cache.lengths, cache.next_lengths)
        shape = step_shape(step, kv)
        run = lambda: kernels.decode_step(ids, step, kv)
        return self._run(name, "decode_step", step.wte, (ids.shape[0], shape, cache.max_len), None, run)

    def decode_layer(self, name, x, block, kv, eps):
        """One block in one launch; `block` gives its parameters as explorer.model.gpt.Block names them, `kv` is
        (k_cache, v_cache, lengths, next_lengths)."""
        a, m = block.attn, block.mlp
        params = [
            (block.ln_1.weight, block.ln_1.bias),
            (a.c_attn.weight, a.c_attn.bias),
            (a.c_proj.weight, a.c_proj.bias),
            (block.ln_2.weight, block.ln_2.bias),
            (m.c_fc.weight, m.c_fc.bias),
            (m.c_proj.weight, m.c_proj.bias),
        ]
        b, heads, max_len, _ = kv[0].shape
        run = lambda: kernels.decode_layer(x, *params, kv, eps)
        return self._run(name, "decode_layer", x, (b, x.shape[-1], heads, max_len), None, run)

    def attention(self, name, q, k, v):
        cfg = self._tuned(self.tiles.attention, lambda: tuned_config(q, k, v))
        b, h, tq, d = q.shape
        run = lambda: self._unplanned(lambda: self.fn.attention(q, k, v, causal=True, config=cfg))
        return self._run(name, "attention", q, (b, h, tq, k.shape[2], d), cfg, run)

    def decode_attention(self, name, q, k_cache, v_cache, lengths):
        cfg = self._tuned(self.tiles.decode_attention, lambda: tuned_decode_config(q, k_cache, v_cache, lengths))
        b, h, max_len, d = k_cache.shape
        if self.fusion in DECODE_RUNGS:  # the last split to finish merges: one launch
            run = lambda: kernels.decode_attention(
                q, k_cache, v_cache, lengths, config=cfg, one_launch=True, pdl=self.pdl
            )
            return self._run(name, "decode_attention", q, (b, h, max_len, d, True), cfg, run)
        run = lambda: self.fn.decode_attention(q, k_cache, v_cache, lengths, config=cfg)
        return self._run(name, "decode_attention", q, (b, h, max_len, d, False), cfg, run)

    def kv_write(self, name, cache, layer: int, k, v, *, decode: bool):
        b, h, t, d = k.shape
        run = lambda: cache.write(layer, k, v, decode=decode, writer=self.kv_writer)
        return self._run(name, "kv_write", k, (b, h, t, d, decode), None, run)

    def rms_norm(self, name, x, weight, eps, *, residual=None):
        cfg = self.tiles.fixed("layer_norm")  # the normalisation's tiles, whichever kind the block has
        sizes = (x.numel() // x.shape[-1], x.shape[-1], residual is not None)
        run = lambda: self.fn.rms_norm(x, weight, eps, residual=residual, config=cfg)
        return self._run(name, "rms_norm", x, sizes, cfg, run)

    def rotary(self, name, x, positions, theta):
        """x (B, H, T, D) turned by its rows' positions (B, T)."""
        run = lambda: self.fn.rotary(x, positions, theta)
        return self._run(name, "rotary", x, tuple(x.shape), None, run, part="rope")

    def swiglu(self, name, x, gate_up):
        """SiLU(x @ W_gate.T) * (x @ W_up.T), gate_up = [W_gate; W_up]: one matmul, the gating in its epilogue."""
        rows = x.numel() // x.shape[-1]
        cfg = self.tiles.fixed("linear_decode" if rows <= DECODE_ROWS else "linear")
        run = lambda: self.fn.swiglu(x, gate_up, config=cfg)
        return self._run(name, "swiglu", x, (rows, gate_up.shape[0] // 2, gate_up.shape[1]), cfg, run)

    def grouped_attention(self, name, q, k, v):
        b, h, tq, d = q.shape
        run = lambda: self._unplanned(lambda: self.fn.grouped_attention(q, k, v, causal=True))
        return self._run(name, "grouped_attention", q, (b, h, k.shape[1], tq, k.shape[2], d), None, run)

    def grouped_decode_attention(self, name, q, k_cache, v_cache, lengths):
        b, h, _, d = q.shape
        if self.fusion in DECODE_RUNGS:  # launched to overlap the kernel ahead on the overlap rung
            run = lambda: kernels.grouped_decode_attention(q, k_cache, v_cache, lengths, pdl=self.pdl)
        else:
            run = lambda: self.fn.grouped_decode_attention(q, k_cache, v_cache, lengths)
        sizes = (b, h, k_cache.shape[1], k_cache.shape[2], d)
        return self._run(name, "grouped_decode_attention", q, sizes, None, run)

    def token_embedding(self, name, wte, ids):
        """The token's row of the embedding alone (rotary positions need no table)."""
        run = lambda: wte(ids)  # (B, T, C)
        return self._run(name, "token_embedding", wte.weight, (ids.numel(), wte.weight.shape[1]), None, run)

    def embedding(self, name, wte, wpe, ids, positions):
        run = lambda: wte(ids) + wpe(positions)  # (B, T, C)
        return self._run(name, "embedding", wte.weight, (ids.numel(), wte.weight.shape[1]), None, run)


def check_fusion(fusion: str) -> None:
    if fusion not in FUSIONS:
        raise ValueError(f"fusion={fusion!r} is not a rung of the ladder (allowed: {', '.join(FUSIONS)})")


class Trace:
    """An observer that lists the operations a pass ran, handing each call on to `inner` if given."""

    def __init__(self, inner: Observer | None = None):
        self.ops: list[Op] = []
        self.inner = inner

    def __call__(self, op: Op, run):
        self.ops.append(op)
        return self.inner(op, run) if self.inner is not None else run()
