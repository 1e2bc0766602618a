"""The one switch between backends, the per-run tile choices, and the record of every launch.

The decoder calls its four operations through an Ops object. With backend "triton" they go to
kernels/, with "torch" to kernels.reference, with the same arguments. When a Recorder is attached,
each call also books its modeled traffic (from the kernel's own traffic model at the tiles actually
used) and, in a profiling pass, its time, under a kind such as "attention" or "ffn".
"""

from __future__ import annotations

import statistics
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
    """Modeled traffic per kind for one step; with `timed`, measured time per kind as well.

    On a GPU a timed call is measured as device time: a spin kernel is queued first and the call's
    kernels are launched while the device is still spinning, so the events around them see the
    kernels back to back, without the Python launch overhead in between. That holds only if the
    whole call was launched before the spin ended; the launch's host time is checked against the
    spin's measured length, and a call launched too slowly is run again behind a longer spin (the
    timed operations are pure, or idempotent like the cache write). The host time of each launch is
    kept too (`launch_ms`): it is the overhead a CUDA graph removes."""

    timed: bool = False
    traffic: dict[str, Traffic] = field(default_factory=dict)
    launches: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    per_length: list = field(default_factory=list)  # (kind, f(host_lengths) -> Traffic), see add_per_length
    _events: list = field(default_factory=list)
    _host: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    _device: torch.device | None = None

    def add(self, kind: str, t: Traffic) -> None:
        self.traffic[kind] = self.traffic[kind] + t if kind in self.traffic else t
        self.launches[kind] += 1

    def add_per_length(self, kind: str, host_lengths: list[int], model) -> None:
        """Traffic that grows with the sequences' lengths (decode attention): booked now, and kept as
        model(lengths) so a replayed CUDA graph can book it at later lengths."""
        self.per_length.append((kind, model))
        self.add(kind, model(host_lengths))

    def call(self, kind: str, device: torch.device, fn):
        if not self.timed:
            return fn()
        if device.type != "cuda":
            t0 = time.perf_counter()
            out = fn()
            self._events.append((kind, t0, time.perf_counter()))
            return out
        for _ in range(_MAX_RESPINS):
            cycles = _spin.cycles
            host0 = time.perf_counter()
            torch.cuda._sleep(cycles)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            host = (time.perf_counter() - host0) * 1e3
            if host < _SPIN_MARGIN * _spin.ms(cycles, device):
                break
            _spin.cycles = min(4 * cycles, _MAX_SPIN_CYCLES)  # launched after the spin ended: longer spin, again
        self._events.append((kind, start, end))
        self._host[kind] += host
        self._device = device
        return out

    def times_ms(self) -> dict[str, float]:
        """Time per kind, after the caller synchronised the device once. On a GPU, each timed call's
        interval less the interval two events show with nothing between them (a few microseconds,
        measured once per device), which would otherwise be counted once per call."""
        out: dict[str, float] = defaultdict(float)
        for kind, start, end in self._events:
            if isinstance(start, torch.cuda.Event):
                out[kind] += max(0.0, start.elapsed_time(end) - _spin.floor_ms(self._device))
            else:
                out[kind] += (end - start) * 1e3
        return dict(out)

    def launch_ms(self) -> dict[str, float]:
        """Host time spent launching each kind (GPU profiling passes only)."""
        return dict(self._host)


_SPIN_MARGIN = 0.8  # a launch must end within 80% of the spin
_MAX_RESPINS = 6
_MAX_SPIN_CYCLES = 1 << 27  # about 70 ms at 2 GHz


class _Spin:
    """GPU cycles to spin before a timed call, grown whenever a launch outlasts the spin; the spin's
    length in ms is measured once per device with events."""

    def __init__(self, cycles: int = 400_000):
        self.cycles = cycles
        self._ms_per_cycle: dict[int, float] = {}
        self._floor: dict[int, float] = {}

    def floor_ms(self, device: torch.device) -> float:
        """Median interval of two events recorded back to back behind a spin: what an empty timed
        call would show."""
        index = _index(device)
        if index not in self._floor:
            pairs = []
            for _ in range(21):
                torch.cuda._sleep(50_000)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                end.record()
                pairs.append((start, end))
            torch.cuda.synchronize(index)
            self._floor[index] = statistics.median(s.elapsed_time(e) for s, e in pairs)
        return self._floor[index]

    def ms(self, cycles: int, device: torch.device) -> float:
        index = _index(device)
        if index not in self._ms_per_cycle:
            probe = 1_000_000
            torch.cuda._sleep(probe)  # first call: a warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(probe)
            end.record()
            end.synchronize()
            self._ms_per_cycle[index] = start.elapsed_time(end) / probe
        return cycles * self._ms_per_cycle[index]


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_spin = _Spin()


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
        # The decode step's cache write: one Triton kernel per layer; the torch backend indexes.
        self.kv_writer = kernels.kv_write if backend == "triton" else None

    def call(self, kind: str, x: torch.Tensor, fn):
        """fn(), timed under `kind` in a profiling pass."""
        return self.rec.call(kind, x.device, fn) if self.rec else fn()

    def layer_norm(self, x, weight, bias, eps):
        cfg = self.tiles.layer_norm
        if self.backend == "triton" and cfg == "autotune":
            cfg = layer_norm_tuned(x, weight, bias, eps)
        y = self.call("layer_norm", x, lambda: self.fn.layer_norm(x, weight, bias, eps, config=cfg))
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
        y = self.call(
            kind, x, lambda: self.fn.linear(x, weight, bias, activation=activation, residual=residual, config=cfg)
        )
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
        o = self.call("attention", q, lambda: self.fn.attention(q, k, v, causal=True, config=cfg))
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
        o = self.call("decode attention", q, lambda: self.fn.decode_attention(q, k_cache, v_cache, lengths, config=cfg))
        if self.rec:
            _, h, max_len, d = k_cache.shape
            item, dtype, device = _itemsize(q), q.dtype, q.device
            if self.backend == "triton":

                def model(lengths):
                    return decode_traffic(lengths, h, max_len, d, item, config=cfg, dtype=dtype, device=device)
            else:  # the masked SDPA reads every allocated position

                def model(lengths):
                    return traffic_floor(len(lengths), h, 1, max_len, d, item, causal=False)

            self.rec.add_per_length("decode attention", host_lengths, model)
        return o

    def book(self, kind: str, t: Traffic) -> None:
        """Torch glue the backends share (embedding lookup, cache writes)."""
        if self.rec:
            self.rec.add(kind, t)
