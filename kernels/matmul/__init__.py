"""Linear layers: the prefill matmul with its fused epilogues (kernel.py), and the decode step's one-launch
linear with a LayerNorm prologue and a KV-cache-write epilogue (decode.py; its work items in decode_items.py,
its tiles and traffic in decode_tiles.py); and the gated feed-forward's gate and up projections as one matmul
with SiLU(gate) * up in its epilogue (swiglu.py)."""

from .decode import decode_linear
from .decode_items import finish, load_slice, row_stats, slice_times, store_gelu, store_linear, store_swiglu
from .decode_tiles import (
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
from .kernel import (
    DECODE_ROWS,
    check_args,
    default_config,
    linear,
    operand_bytes,
    persistent_form,
    resolve_config,
    shared_memory,
    traffic,
    traffic_unfused,
    tuned_config,
)

__all__ = [
    "CPU_BLOCK_N",
    "CPU_PREFETCH_ELEMENTS",
    "DECODE_ROWS",
    "PREFETCH_BLOCK_K",
    "PREFETCH_ELEMENTS",
    "PREFETCH_SLICE",
    "check_args",
    "cpu_config",
    "decode_linear",
    "default_config",
    "linear",
    "load_slice",
    "operand_bytes",
    "persistent_form",
    "prefetches",
    "resolve_config",
    "shared_memory",
    "slice_times",
    "store_gelu",
    "store_linear",
    "store_swiglu",
    "row_stats",
    "finish",
    "slice_tiles",
    "splits_of",
    "traffic",
    "traffic_unfused",
    "tuned_config",
]
