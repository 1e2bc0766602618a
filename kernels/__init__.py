"""Triton kernels of the decoder: LayerNorm, fused linear, the decode step's one-launch linear (LayerNorm
prologue, KV-cache-write epilogue), flash attention, decode attention and the decode step's KV-cache write;
and, as elementwise.add, elementwise.bias_add and elementwise.gelu, the separate launches an unfused
decoder makes."""

from . import elementwise
from .attn.decode import decode_attention
from .attn.grouped import grouped_decode_attention
from .attn.grouped_prefill import grouped_attention
from .attn.kernel import attention
from .config import TileConfig, Traffic, device_limits, supported_dtypes
from .kv_cache.kernel import kv_write
from .layer.kernel import decode_layer
from .matmul.decode import decode_linear
from .matmul.kernel import linear
from .matmul.swiglu import swiglu
from .norm.kernel import layer_norm
from .norm.rms import rms_norm
from .rope.kernel import rotary

__all__ = [
    "TileConfig",
    "Traffic",
    "attention",
    "decode_attention",
    "decode_layer",
    "decode_linear",
    "device_limits",
    "elementwise",
    "grouped_attention",
    "grouped_decode_attention",
    "kv_write",
    "layer_norm",
    "linear",
    "rms_norm",
    "rotary",
    "supported_dtypes",
    "swiglu",
]
