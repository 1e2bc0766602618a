"""RMSNorm with the residual add fused, on LayerNorm's tile rules (kernel.py)."""

from .kernel import rms_norm, traffic

__all__ = ["rms_norm", "traffic"]
