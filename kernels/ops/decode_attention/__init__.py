"""Split-K decode attention over the KV cache (kernel.py), its tiles, launch plan and traffic model
(tiles.py)."""

from .kernel import attend_item, decode_attention, tuned_decode_config
from .tiles import (
    PREFETCH_ELEMENTS_PER_WARP,
    decode_shared_memory,
    decode_split,
    decode_traffic,
    default_decode_config,
    launch_plan,
    loops_in_dot_form,
    resolve_decode_config,
)

__all__ = [
    "PREFETCH_ELEMENTS_PER_WARP",
    "attend_item",
    "decode_attention",
    "decode_shared_memory",
    "decode_split",
    "decode_traffic",
    "default_decode_config",
    "launch_plan",
    "loops_in_dot_form",
    "resolve_decode_config",
    "tuned_decode_config",
]
