"""Triton kernels of the decoder: LayerNorm, fused linear, flash attention and decode attention."""

from .attention import attention, decode_attention
from .config import TileConfig, Traffic, device_limits, supported_dtypes
from .layer_norm import layer_norm
from .linear import linear

__all__ = [
    "TileConfig",
    "Traffic",
    "attention",
    "decode_attention",
    "device_limits",
    "layer_norm",
    "linear",
    "supported_dtypes",
]
