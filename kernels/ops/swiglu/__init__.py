"""The gated feed-forward's gate and up projections as one matmul with SiLU(gate) * up in its epilogue
(kernel.py)."""

from .kernel import default_config, resolve_config, shared_memory, swiglu, traffic

__all__ = ["default_config", "resolve_config", "shared_memory", "swiglu", "traffic"]
