"""The prefill matmul with its fused epilogues (bias, GELU, residual): kernel, launcher, tile rules, traffic
(kernel.py)."""

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
    "DECODE_ROWS",
    "check_args",
    "default_config",
    "linear",
    "operand_bytes",
    "persistent_form",
    "resolve_config",
    "shared_memory",
    "traffic",
    "traffic_unfused",
    "tuned_config",
]
