"""The sizes an operation runs at, one record per kind (kernels.operations names each operation's): what a
traffic model, a launch count or a chart reads of a call, by name."""

from typing import NamedTuple


class NormSizes(NamedTuple):  # layer_norm, rms_norm
    rows: int
    width: int
    residual: bool  # the residual add fused in front


class LinearSizes(NamedTuple):  # linear
    rows: int
    out_features: int
    in_features: int
    bias: bool
    gelu: bool
    residual: bool


class DecodeLinearSizes(NamedTuple):  # decode_linear
    rows: int
    out_features: int
    in_features: int
    bias: bool
    gelu: bool
    residual: bool
    norm: bool  # the normalisation in its prologue
    kv_heads: int  # heads of the KV cache its epilogue writes (0: none)
    head_dim: int = 0  # their size (0: none)
    swiglu: bool = False  # the weight is gate_up (2F, in), the output F wide
    rms: bool = False  # the norm is RMSNorm (a weight, no bias)
    rope: bool = False  # q and k turned by rotary positions in the epilogue


class RowsSizes(NamedTuple):  # bias_add, embedding, token_embedding
    rows: int
    width: int


class ElementsSizes(NamedTuple):  # gelu, add
    elements: int


class AttentionSizes(NamedTuple):  # attention
    batch: int
    heads: int
    queries: int
    keys: int
    head_dim: int


class DecodeAttentionSizes(NamedTuple):  # decode_attention: each sequence reads its own length of the cache
    batch: int
    heads: int
    max_len: int
    head_dim: int
    one_launch: bool


class SwigluSizes(NamedTuple):  # swiglu: gate and up projections in one matmul, SiLU(gate) * up its epilogue
    rows: int
    features: int  # F, each half of the (2F, in_features) weight
    in_features: int


class RotarySizes(NamedTuple):  # rotary
    batch: int
    heads: int
    tokens: int
    head_dim: int


class GroupedAttentionSizes(NamedTuple):  # grouped_attention: kv_heads key/value heads serve `heads` query heads
    batch: int
    heads: int
    kv_heads: int
    queries: int
    keys: int
    head_dim: int


class GroupedDecodeSizes(NamedTuple):  # grouped_decode_attention: each sequence reads its own length of the cache
    batch: int
    heads: int
    kv_heads: int
    max_len: int
    head_dim: int


class KVWriteSizes(NamedTuple):  # kv_write
    batch: int
    heads: int
    tokens: int
    head_dim: int
    decode: bool


class DecodeLayerSizes(NamedTuple):  # decode_layer: each sequence reads its own length of the cache
    batch: int
    width: int
    heads: int
    max_len: int


class DecodeStepSizes(NamedTuple):  # decode_step: a whole decode step; each sequence reads its own length of the cache
    batch: int
    shape: tuple  # kernels.ops.decode_step.Shape: width, heads, key/value heads, hidden width, vocabulary, layers
    max_len: int
