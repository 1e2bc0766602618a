"""LayerNorm with the residual add fused: the kernel, its launcher, tile rules and traffic (kernel.py)."""

from .kernel import default_config, layer_norm, resolve_config, traffic, traffic_unfused, tuned_config

__all__ = ["default_config", "layer_norm", "resolve_config", "traffic", "traffic_unfused", "tuned_config"]
