"""The one switch between backends, the per-run tile choices, and the names of the operations.

The decoder calls every operation through an Ops object, under its GPT-2 name (ln_1, attn.c_attn,
attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, ln_f, lm_head, wte/wpe, kv write). With backend
"triton" they go to kernels/, with "torch" to kernels.reference, with the same arguments.

An observer may be attached: a callable `observer(op, run)` that gets an Op record (the name, the
kernel, the tiles and sizes of the call) and must return `run()`. The measure layer uses it to see
which operations a step ran and to time them; nothing here knows what it does with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

import kernels
from kernels import reference
from kernels.attention import tuned_config, tuned_decode_config
from kernels.layer_norm import tuned_config as layer_norm_tuned
from kernels.linear import DECODE_ROWS
from kernels.linear import tuned_config as linear_tuned

BACKENDS = ("triton", "torch")


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


@dataclass(frozen=True, slots=True)
class Op:
    """One named operation of a forward pass, as an observer sees it.

    `sizes` by kernel:
      layer_norm        rows, width, residual (0/1)
      linear            rows, out_features, in_features, bias (0/1), gelu (0/1), residual (0/1)
      attention         batch, heads, queries, keys, head_dim
      decode_attention  batch, heads, max_len, head_dim (each sequence reads its own length of it)
      kv_write          batch, heads, tokens, head_dim, decode (0/1)
      embedding         rows, width
    """

    name: str
    kernel: str
    backend: str
    sizes: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    config: kernels.TileConfig | None = None  # the tiles the call used; None: the kernel's defaults


Observer = Callable[[Op, Callable[[], object]], object]


class Ops:
    def __init__(self, backend: str = "triton", tiles: Tiles | None = None, observer: Observer | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not known (allowed: {', '.join(BACKENDS)})")
        self.backend = backend
        self.tiles = tiles or Tiles()
        self.observer = observer
        self.fn = kernels if backend == "triton" else reference
        # The decode step's cache write: one Triton kernel per layer; the torch backend indexes.
        self.kv_writer = kernels.kv_write if backend == "triton" else None

    def _run(self, name: str, kernel: str, x: torch.Tensor, sizes: tuple, config, run):
        if self.observer is None:
            return run()
        op = Op(name, kernel, self.backend, tuple(int(s) for s in sizes), x.dtype, x.device, config)
        return self.observer(op, run)

    def _tuned(self, cfg, tune):
        return tune() if self.backend == "triton" and cfg == "autotune" else cfg

    def layer_norm(self, name, x, weight, bias, eps, *, residual=None):
        cfg = self._tuned(self.tiles.layer_norm, lambda: layer_norm_tuned(x, weight, bias, eps, residual=residual))
        sizes = (x.numel() // x.shape[-1], x.shape[-1], residual is not None)
        run = lambda: self.fn.layer_norm(x, weight, bias, eps, residual=residual, config=cfg)
        return self._run(name, "layer_norm", x, sizes, cfg, run)

    def linear(self, name, x, weight, bias=None, *, activation=None, residual=None):
        rows = x.numel() // x.shape[-1]
        cfg = self.tiles.linear_decode if rows <= DECODE_ROWS else self.tiles.linear
        cfg = self._tuned(cfg, lambda: linear_tuned(x, weight, bias, activation=activation, residual=residual))
        sizes = (rows, *weight.shape, bias is not None, activation == "gelu", residual is not None)
        run = lambda: self.fn.linear(x, weight, bias, activation=activation, residual=residual, config=cfg)
        return self._run(name, "linear", x, sizes, cfg, run)

    def attention(self, name, q, k, v):
        cfg = self._tuned(self.tiles.attention, lambda: tuned_config(q, k, v))
        b, h, tq, d = q.shape
        run = lambda: self.fn.attention(q, k, v, causal=True, config=cfg)
        return self._run(name, "attention", q, (b, h, tq, k.shape[2], d), cfg, run)

    def decode_attention(self, name, q, k_cache, v_cache, lengths):
        cfg = self._tuned(self.tiles.decode_attention, lambda: tuned_decode_config(q, k_cache, v_cache, lengths))
        b, h, max_len, d = k_cache.shape
        run = lambda: self.fn.decode_attention(q, k_cache, v_cache, lengths, config=cfg)
        return self._run(name, "decode_attention", q, (b, h, max_len, d), cfg, run)

    def kv_write(self, name, cache, layer: int, k, v, *, decode: bool):
        b, h, t, d = k.shape
        run = lambda: cache.write(layer, k, v, decode=decode, writer=self.kv_writer)
        return self._run(name, "kv_write", k, (b, h, t, d, decode), None, run)

    def embedding(self, name, wte, wpe, ids, positions):
        run = lambda: wte(ids) + wpe(positions)  # (B, T, C)
        return self._run(name, "embedding", wte.weight, (ids.numel(), wte.weight.shape[1]), None, run)


class Trace:
    """An observer that lists the operations a pass ran, handing each call on to `inner` if given."""

    def __init__(self, inner: Observer | None = None):
        self.ops: list[Op] = []
        self.inner = inner

    def __call__(self, op: Op, run):
        self.ops.append(op)
        return self.inner(op, run) if self.inner is not None else run()
