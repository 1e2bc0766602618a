"""The separate launches an unfused decoder makes around a matmul: add, bias_add, gelu (kernel.py)."""

from .kernel import (
    CPU_BLOCK,
    add,
    bias_add,
    default_config,
    gelu,
    resolve_config,
    traffic_add,
    traffic_bias_add,
    traffic_gelu,
)

__all__ = [
    "CPU_BLOCK",
    "add",
    "bias_add",
    "default_config",
    "gelu",
    "resolve_config",
    "traffic_add",
    "traffic_bias_add",
    "traffic_gelu",
]
