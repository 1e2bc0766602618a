"""The one switch between backends, the per-run tile choices, and the record of every launch.

The decoder calls its four operations through an Ops object. With backend "triton" they go to
kernels/, with "torch" to kernels.reference, with the same arguments. When a Recorder is attached,
each call also books its modeled traffic (from the kernel's own traffic model at the tiles actually
used) and, in a profiling pass, its time, under a kind such as "attention" or "ffn".
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

import kernels
from kernels import reference
from kernels.attention import decode_traffic, traffic_floor, tuned_config, tuned_decode_config
from kernels.attention import traffic as attention_traffic
from kernels.config import Traffic
from kernels.layer_norm import traffic as layer_norm_traffic
from kernels.layer_norm import traffic_unfused as layer_norm_traffic_unfused
from kernels.layer_norm import tuned_config as layer_norm_tuned
from kernels.linear import DECODE_ROWS
from kernels.linear import traffic as linear_traffic
from kernels.linear import traffic_unfused as linear_traffic_unfused
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


@dataclass
class Recorder:
    """Modeled traffic per kind for one step; with `timed`, measured time per kind as well."""

    timed: bool = False
    traffic: dict[str, Traffic] = field(default_factory=dict)
    launches: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    _events: list = field(default_factory=list)

    def add(self, kind: str, t: Traffic) -> None:
        self.traffic[kind] = self.traffic[kind] + t if kind in self.traffic else t
        self.launches[kind] += 1

    def time(self, kind: str, device: torch.device):
        return _Timer(self, kind, device) if self.timed else _NO_TIMER

    def times_ms(self) -> dict[str, float]:
        """Time per kind, after the caller synchronised the device once."""
        out: dict[str, float] = defaultdict(float)
        for kind, start, end in self._events:
            out[kind] += start.elapsed_time(end) if isinstance(start, torch.cuda.Event) else (end - start) * 1e3
        return dict(out)


# GPU cycles to spin before each timed operation in a profiling pass (~100 us at 2 GHz): the device
# is busy while Python launches the operation, so the start event fires just before its kernels and
# the events measure device time, not launch overhead.
SPIN_CYCLES = 200_000


class _Timer:
    def __init__(self, rec, kind, device):
        self.rec, self.kind, self.cuda = rec, kind, device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            torch.cuda._sleep(SPIN_CYCLES)
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.perf_counter()

    def __exit__(self, *exc):
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            end = time.perf_counter()
        self.rec._events.append((self.kind, self.start, end))


class _NoTimer:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


_NO_TIMER = _NoTimer()


def _itemsize(t: torch.Tensor) -> int:
    return t.element_size()


class Ops:
    def __init__(self, backend: str = "triton", tiles: Tiles | None = None, recorder: Recorder | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not known (allowed: {', '.join(BACKENDS)})")
        self.backend = backend
        self.tiles = tiles or Tiles()
        self.rec = recorder
        self.fn = kernels if backend == "triton" else reference

    def timer(self, kind, x):
        return self.rec.time(kind, x.device) if self.rec else _NO_TIMER

    def layer_norm(self, x, weight, bias, eps):
        cfg = self.tiles.layer_norm
        if self.backend == "triton" and cfg == "autotune":
            cfg = layer_norm_tuned(x, weight, bias, eps)
        with self.timer("layer_norm", x):
            y = self.fn.layer_norm(x, weight, bias, eps, config=cfg)
        if self.rec:
            rows, width = x.numel() // x.shape[-1], x.shape[-1]
            if self.backend == "triton":
                t = layer_norm_traffic(rows, width, _itemsize(x), config=cfg)
            else:
                t = layer_norm_traffic_unfused(rows, width, _itemsize(x))
            self.rec.add("layer_norm", t)
        return y

    def linear(self, kind, x, weight, bias=None, *, activation=None, residual=None):
        rows = x.numel() // x.shape[-1]
        decode = rows <= DECODE_ROWS
        cfg = self.tiles.linear_decode if decode else self.tiles.linear
        if self.backend == "triton" and cfg == "autotune":
            cfg = linear_tuned(x, weight, bias, activation=activation, residual=residual)
        with self.timer(kind, x):
            y = self.fn.linear(x, weight, bias, activation=activation, residual=residual, config=cfg)
        if self.rec:
            shape = (rows, weight.shape[0], weight.shape[1], _itemsize(x))
            flags = dict(bias=bias is not None, activation=activation, residual=residual is not None)
            if self.backend == "triton":
                t = linear_traffic(*shape, **flags, config=cfg, dtype=x.dtype, device=x.device)
            else:
                t = linear_traffic_unfused(*shape, **flags)
            self.rec.add(kind, t)
        return y

    def attention(self, q, k, v):
        cfg = self.tiles.attention
        if self.backend == "triton" and cfg == "autotune":
            cfg = tuned_config(q, k, v)
        with self.timer("attention", q):
            o = self.fn.attention(q, k, v, causal=True, config=cfg)
        if self.rec:
            b, h, tq, d = q.shape
            if self.backend == "triton":
                t = attention_traffic(b, h, tq, k.shape[2], d, _itemsize(q), config=cfg, dtype=q.dtype, device=q.device)
            else:  # SDPA is a fused kernel too; its tiles are its own, so it is booked at its floor
                t = traffic_floor(b, h, tq, k.shape[2], d, _itemsize(q))
            self.rec.add("attention", t)
        return o

    def decode_attention(self, q, k_cache, v_cache, lengths, host_lengths):
        cfg = self.tiles.decode_attention
        if self.backend == "triton" and cfg == "autotune":
            cfg = tuned_decode_config(q, k_cache, v_cache, lengths)
        with self.timer("decode attention", q):
            o = self.fn.decode_attention(q, k_cache, v_cache, lengths, config=cfg)
        if self.rec:
            _, h, max_len, d = k_cache.shape
            if self.backend == "triton":
                t = decode_traffic(host_lengths, h, max_len, d, _itemsize(q), config=cfg,
                                                 dtype=q.dtype, device=q.device)  # fmt: skip
            else:  # the masked SDPA reads every allocated position
                t = traffic_floor(len(host_lengths), h, 1, max_len, d, _itemsize(q), causal=False)
            self.rec.add("decode attention", t)
        return o

    def book(self, kind: str, t: Traffic) -> None:
        """Torch glue the backends share (embedding lookup, cache writes)."""
        if self.rec:
            self.rec.add(kind, t)
