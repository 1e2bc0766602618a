"""Row normalisations, the residual add fused: LayerNorm (kernel.py: the kernel, its launcher, tile rules and
traffic model) and RMSNorm (rms.py: the same, on LayerNorm's tile rules); their statistics in stats.py."""

from . import rms
from .kernel import default_config, layer_norm, resolve_config, traffic, traffic_unfused, tuned_config
from .rms import rms_norm

__all__ = [
    "default_config",
    "layer_norm",
    "resolve_config",
    "rms",
    "rms_norm",
    "traffic",
    "traffic_unfused",
    "tuned_config",
]
