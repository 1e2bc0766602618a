"""Decode steps replayed from a CUDA graph.

An eager decode step launches about 14 kernels per layer (170 for GPT-2 small), and each launch costs
the host more time (Python, argument checks, the driver) than the kernel costs the GPU: the device
sits idle between kernels and the step is host-bound. A decode step's shapes never change (the KV
cache is static and the lengths live on the device), so the whole step is captured once into a CUDA
graph and each later step is one replay: the same kernels, launched by the driver back to back.
"""

from __future__ import annotations

import torch

from kernels.timing import collector_paused

from .cache import KVCache
from .ops import Tiles, Trace

# Captured graphs kept per model (GraphPool). 0 where the GPU is attached per call (the app sets it on
# ZeroGPU), so that nothing captured outlives the call that captured it.
KEEP = 2


class DecodeGraph:
    """model.decode(ids, cache) captured once; step(ids) replays it for the next token.

    greedy=True captures the greedy pick as well: each replay ends by writing the argmax of its logits
    into its own input, so the next replay needs no launch from the host at all (`sampled` is that
    buffer: read it, or copy it out, before the next replay)."""

    def __init__(
        self, model, cache: KVCache, *, tiles: Tiles | None = None, backend: str | None = None, greedy: bool = False
    ):
        device = cache.lengths.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA GPU; this model runs on {device.type}")
        self.model, self.cache = model, cache
        self.ids = torch.zeros(cache.lengths.shape[0], dtype=torch.long, device=device)
        kw = dict(tiles=tiles, backend=backend)
        lengths, host_lengths = cache.lengths.clone(), list(cache.host_lengths)
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # compile, autotune, allocate workspaces: nothing new while capturing
            model.decode(self.ids, cache, **kw)
        torch.cuda.current_stream(device).wait_stream(stream)
        # The warm-up wrote at position lengths[b] (overwritten by the next real step) and advanced the
        # lengths; capturing advances the host's copy but runs nothing. Both go back.
        cache.lengths.copy_(lengths)
        cache.host_lengths = host_lengths
        trace = Trace()
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: a CUDA call from another thread of the server (another visitor's event, a job ending)
        # cannot invalidate this capture. Calls unsafe while capturing are still refused in this thread, so
        # the collector waits: a model dropped with its pooled graphs is a reference cycle, and collecting it
        # here would destroy a graph mid-capture.
        with collector_paused(), torch.cuda.graph(self.graph, stream=stream, capture_error_mode="thread_local"):
            self.logits = model.decode(self.ids, cache, observer=trace, **kw)
            if greedy:
                self.ids.copy_(self.logits.argmax(dim=-1))
        self.greedy, self.sampled = greedy, self.ids
        cache.host_lengths = host_lengths
        cache.next_lengths = cache.lengths
        torch.cuda.synchronize(device)
        self.ops = tuple(trace.ops)  # what every replay runs, by name

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B,) -> next-token logits (B, vocab), a buffer the next step overwrites."""
        c = self.cache
        c.check_room()
        self.model._check_length(max(c.host_lengths) + 1)
        if ids is not self.ids:
            self.ids.copy_(ids)
        self.graph.replay()
        c.advance_host()
        return self.logits


class GraphPool:
    """Captured decode graphs, each with the KV cache it was captured on, kept for the next generation of
    the same shape on the same model (explorer.model.generate): capturing costs an eager step and the
    capture itself, more than a hundred replays. A generation takes its entry out while it runs and gives
    it back when it ends, so two at once never share a cache. At most KEEP entries, the oldest dropped."""

    def __init__(self):
        self.entries: dict = {}

    def take(self, key):
        return self.entries.pop(key, None)

    def give(self, key, entry) -> None:
        self.entries[key] = entry
        while len(self.entries) > KEEP:
            del self.entries[next(iter(self.entries))]
