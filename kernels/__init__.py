"""Triton kernels of the decoder: LayerNorm, fused linear, the decode step's one-launch linear (LayerNorm
prologue, KV-cache-write epilogue), flash attention, decode attention and the decode step's KV-cache write;
and, as elementwise.add, elementwise.bias_add and elementwise.gelu, the separate launches an unfused
decoder makes."""

from .config import TileConfig, Traffic, device_limits, supported_dtypes
from .ops import elementwise
from .ops.attention.kernel import attention
from .ops.decode_attention.kernel import decode_attention
from .ops.decode_layer.kernel import decode_layer
from .ops.decode_linear.kernel import decode_linear
from .ops.decode_step.kernel import Step as decode_step_parts
from .ops.decode_step.kernel import decode_step
from .ops.grouped_attention.kernel import grouped_attention
from .ops.grouped_decode_attention.kernel import grouped_decode_attention
from .ops.kv_write.kernel import kv_write
from .ops.layer_norm.kernel import layer_norm
from .ops.linear.kernel import linear
from .ops.rms_norm.kernel import rms_norm
from .ops.rotary.kernel import rotary
from .ops.swiglu.kernel import swiglu

__all__ = [
    "TileConfig",
    "Traffic",
    "attention",
    "decode_attention",
    "decode_layer",
    "decode_step",
    "decode_step_parts",
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
