"""LayerNorm, the residual add fused (kernel.py: the kernel, its launcher, tile rules and traffic model)."""

from .kernel import default_config, layer_norm, resolve_config, traffic, traffic_unfused, tuned_config

__all__ = ["default_config", "layer_norm", "resolve_config", "traffic", "traffic_unfused", "tuned_config"]
