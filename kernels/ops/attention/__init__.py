"""Flash attention for the prefill: the kernel, its launcher, tile rules and traffic models (kernel.py)."""

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
    "attention",
    "check_qkv",
    "default_config",
    "resolve_config",
    "shared_memory",
    "traffic",
    "traffic_floor",
    "traffic_naive",
    "tuned_config",
]
