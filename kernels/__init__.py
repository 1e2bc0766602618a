"""Triton kernels of the decoder: LayerNorm, fused linear, the decode step's one-launch linear (LayerNorm
prologue, KV-cache-write epilogue), flash attention, decode attention and the decode step's KV-cache write;
and, as elementwise.add, elementwise.bias_add and elementwise.gelu, the separate launches an unfused
decoder makes."""

from . import elementwise
from .attention import attention
from .attention_decode import decode_attention
from .config import TileConfig, Traffic, device_limits, supported_dtypes
from .decode_layer import decode_layer
from .fused_linear import decode_linear
from .kv_write import kv_write
from .layer_norm import layer_norm
from .linear import linear

__all__ = [
    "TileConfig",
    "Traffic",
    "attention",
    "decode_attention",
    "decode_layer",
    "decode_linear",
    "device_limits",
    "elementwise",
    "kv_write",
    "layer_norm",
    "linear",
    "supported_dtypes",
]
