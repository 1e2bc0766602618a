"""The decode step's one-launch linear: a LayerNorm or RMSNorm prologue, an epilogue the launcher picks (a
plain store, GELU, SwiGLU; the KV-cache write and rotary beside it). The kernels and launcher in kernel.py, its
work items in items.py, its tiles and traffic in tiles.py."""

from .items import finish, load_slice, row_stats, slice_times, store_gelu, store_linear, store_swiglu
from .kernel import decode_linear
from .tiles import (
    CPU_BLOCK_N,
    CPU_PREFETCH_ELEMENTS,
    PREFETCH_BLOCK_K,
    PREFETCH_ELEMENTS,
    PREFETCH_SLICE,
    cpu_config,
    prefetches,
    slice_tiles,
    splits_of,
)

__all__ = [
    "CPU_BLOCK_N",
    "CPU_PREFETCH_ELEMENTS",
    "PREFETCH_BLOCK_K",
    "PREFETCH_ELEMENTS",
    "PREFETCH_SLICE",
    "cpu_config",
    "decode_linear",
    "finish",
    "load_slice",
    "prefetches",
    "row_stats",
    "slice_tiles",
    "slice_times",
    "splits_of",
    "store_gelu",
    "store_linear",
    "store_swiglu",
]
