"""Attention: flash attention for the prefill (kernel.py), and split-K decode attention over the KV cache
(decode.py; its tiles, plan and traffic in decode_tiles.py)."""

from .decode import attend_item, decode_attention, tuned_decode_config
from .decode_tiles import (
    PREFETCH_ELEMENTS_PER_WARP,
    decode_shared_memory,
    decode_split,
    decode_traffic,
    default_decode_config,
    launch_plan,
    loops_in_dot_form,
    resolve_decode_config,
)
from .kernel import (
    LOG2E,
    MASKED_SCORE,
    attention,
    check_qkv,
    default_config,
    resolve_config,
    shared_memory,
    traffic,
    traffic_floor,
    traffic_naive,
    tuned_config,
)

__all__ = [
    "LOG2E",
    "MASKED_SCORE",
    "PREFETCH_ELEMENTS_PER_WARP",
    "attend_item",
    "attention",
    "check_qkv",
    "decode_attention",
    "decode_shared_memory",
    "decode_split",
    "decode_traffic",
    "default_config",
    "default_decode_config",
    "launch_plan",
    "loops_in_dot_form",
    "resolve_config",
    "resolve_decode_config",
    "shared_memory",
    "traffic",
    "traffic_floor",
    "traffic_naive",
    "tuned_config",
    "tuned_decode_config",
]
