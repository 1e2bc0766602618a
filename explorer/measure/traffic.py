"""Bytes and FLOPs of each named operation, from the traffic model beside its kernel, and the chart
category each name falls under. Every Traffic has two levels: bytes between L2 and the SMs (every load
and store the kernel issues, tile re-reads included: what tiling controls) and bytes to and from HBM
(what the L2 lets through, given the working set and this device's L2 size).

The decoder only names its operations (explorer.model.ops.Op); this is where a name becomes bytes.
A Triton call is booked at the tiles it ran with; the torch backend's calls are booked as PyTorch
runs them (unfused bias, GELU and residual passes; SDPA at its floor, since its tiles are its own).
Results are cached: one step of GPT-2 small names about 170 operations, most of them alike.
"""

from __future__ import annotations

import functools
import operator

from kernels import elementwise
from kernels.attn import grouped, grouped_prefill
from kernels.attn.decode import decode_traffic
from kernels.attn.kernel import traffic as attention_traffic
from kernels.attn.kernel import traffic_floor
from kernels.config import Traffic
from kernels.kv_cache.kernel import traffic as kv_write_traffic
from kernels.layer.kernel import traffic as decode_layer_traffic
from kernels.matmul import swiglu
from kernels.matmul.decode import traffic as fused_linear_traffic
from kernels.matmul.kernel import traffic as linear_traffic
from kernels.matmul.kernel import traffic_unfused as linear_unfused
from kernels.norm import rms
from kernels.norm.kernel import traffic as layer_norm_traffic
from kernels.norm.kernel import traffic_unfused as layer_norm_unfused
from kernels.rope.kernel import traffic as rotary_traffic

from ..model.ops import Op


@functools.lru_cache(maxsize=8192)
def op_traffic(op: Op, lengths: tuple[int, ...] = ()) -> Traffic:
    """Modeled traffic of one call; `lengths` (keys per sequence) for decode attention and decode layers only."""
    item = op.dtype.itemsize
    on = dict(dtype=op.dtype, device=op.device)
    triton = op.backend == "triton"
    s = op.sizes
    if op.kernel == "layer_norm":
        if triton:
            return layer_norm_traffic(s.rows, s.width, item, residual=s.residual, config=op.config, device=op.device)
        return layer_norm_unfused(s.rows, s.width, item, residual=s.residual, device=op.device)
    if op.kernel in ("linear", "decode_linear"):
        flags = dict(bias=bool(s.bias), activation="gelu" if s.gelu else None, residual=bool(s.residual))
        if op.kernel == "decode_linear":
            fused = dict(norm=s.norm, rms=s.rms, kv=s.kv_heads or None, head_dim=s.head_dim or None, rope=s.rope)
            if s.swiglu:
                flags["activation"] = "swiglu"
            return fused_linear_traffic(*s[:3], item, **flags, **fused, config=op.config, **on)
        if triton:
            return linear_traffic(*s[:3], item, **flags, config=op.config, **on)
        return linear_unfused(*s[:3], item, **flags, device=op.device)
    if op.kernel == "bias_add":
        return elementwise.traffic_bias_add(s.rows, s.width, item)
    if op.kernel == "gelu":
        return elementwise.traffic_gelu(s.elements, item)
    if op.kernel == "add":
        return elementwise.traffic_add(s.elements, item)
    if op.kernel == "attention":
        if triton:
            return attention_traffic(*s, item, config=op.config, **on)
        return traffic_floor(*s, item)
    if op.kernel == "decode_attention":
        if triton:
            return decode_traffic(
                list(lengths), s.heads, s.max_len, s.head_dim, item, config=op.config, one_launch=s.one_launch, **on
            )
        return traffic_floor(s.batch, s.heads, 1, s.max_len, s.head_dim, item, causal=False)  # SDPA reads every slot
    if op.kernel == "decode_layer":
        return decode_layer_traffic(list(lengths), s.width, s.heads, s.max_len, item, **on)
    if op.kernel == "kv_write":
        if s.decode and triton:
            return kv_write_traffic(s.batch, s.heads, s.head_dim, item)
        moved = 2 * s.batch * s.heads * s.tokens * s.head_dim * item  # K and V rows read, written to the cache
        return Traffic(moved, moved, 0, 2 * moved)
    if op.kernel == "embedding":
        n = s.rows * s.width  # two rows gathered and added per token
        return Traffic(2 * n * item, n * item, n, 3 * n * item)
    if op.kernel == "token_embedding":
        n = s.rows * s.width  # one row gathered per token
        return Traffic(n * item, n * item, 0, 2 * n * item)
    return _llama_op(op, s, item, triton, lengths)


def _passes(reads: int, writes: int, elements: int, item: int, flops: int = 0) -> Traffic:
    """Elementwise PyTorch launches, each reading or writing `elements` values: `reads` and `writes` of them."""
    n = elements * item
    return Traffic(reads * n, writes * n, flops, 2 * n)


def _llama_op(op: Op, s, item: int, triton: bool, lengths: tuple[int, ...]) -> Traffic:
    """The Llama family's operations. The torch backend's are booked as kernels.reference runs them: RMSNorm
    as x^2, its mean, x * rsqrt and * weight (four reads, three writes, after the residual add's two and one);
    rotary as x * cos, the rotated half, * sin and the sum (five reads, four writes); SwiGLU as F.linear at
    its floor, then SiLU and the product; grouped attention as every key/value head copied for its group
    (repeat_interleave) and then SDPA at its floor."""
    on = dict(dtype=op.dtype, device=op.device)
    if op.kernel == "rms_norm":
        if triton:
            return rms.traffic(s.rows, s.width, item, residual=s.residual, config=op.config, device=op.device)
        add = _passes(2, 1, s.rows * s.width, item, s.rows * s.width) if s.residual else None
        norm = _passes(4, 3, s.rows * s.width, item, 4 * s.rows * s.width)
        return norm + add if add else norm
    if op.kernel == "rotary":
        if triton:
            return rotary_traffic(s.batch, s.heads, s.tokens, s.head_dim, item)
        return _passes(
            5, 4, s.batch * s.heads * s.tokens * s.head_dim, item, 3 * s.batch * s.heads * s.tokens * s.head_dim
        )
    if op.kernel == "swiglu":
        if triton:
            return swiglu.traffic(s.rows, s.features, s.in_features, item, config=op.config, **on)
        matmul = linear_unfused(s.rows, 2 * s.features, s.in_features, item, bias=False, device=op.device)
        return matmul + _passes(1, 1, s.rows * s.features, item) + _passes(2, 1, s.rows * s.features, item)
    group = s.heads // s.kv_heads
    if op.kernel == "grouped_attention":
        if triton:
            return grouped_prefill.traffic(
                s.batch, s.heads, s.kv_heads, s.queries, s.keys, s.head_dim, item, device=op.device
            )
        copies = _passes(1, group, 2 * s.batch * s.kv_heads * s.keys * s.head_dim, item)
        return copies + traffic_floor(s.batch, s.heads, s.queries, s.keys, s.head_dim, item)
    if op.kernel == "grouped_decode_attention":
        if triton:
            return grouped.traffic(
                list(lengths), s.heads, s.kv_heads, s.head_dim, item, max_len=s.max_len, device=op.device
            )
        copies = _passes(1, group, 2 * s.batch * s.kv_heads * s.max_len * s.head_dim, item)
        return copies + traffic_floor(s.batch, s.heads, 1, s.max_len, s.head_dim, item, causal=False)
    raise ValueError(f"no traffic model for kernel {op.kernel!r}")


KEYED_BY_LENGTHS = (
    "decode_attention",
    "decode_layer",
    "grouped_decode_attention",
)  # the kernels whose traffic depends on each length


def traffic_at(op: Op, lengths: tuple[int, ...]) -> Traffic:
    """op_traffic, given the lengths only where the kernel reads them (so alike calls share one cache entry)."""
    return op_traffic(op, lengths if op.kernel in KEYED_BY_LENGTHS else ())


def total_traffic(ops, lengths: tuple[int, ...]) -> Traffic:
    """Modeled traffic of a pass's operations together; `lengths` as traffic_at takes them."""
    return functools.reduce(operator.add, (traffic_at(op, lengths) for op in ops))


def step_traffic(step) -> dict[str, Traffic]:
    """Modeled traffic of one Step, per chart category. In a decode step each sequence attends over
    as many keys as the new token's position (its length once the fed token is in the cache)."""
    return dict(_by_category(step.ops, tuple(step.positions) if step.phase == "decode" else ()))


@functools.lru_cache(maxsize=4096)
def _by_category(ops: tuple[Op, ...], lengths: tuple[int, ...]) -> dict[str, Traffic]:
    out: dict[str, Traffic] = {}
    for op in ops:
        t = traffic_at(op, lengths)
        kind = op.category
        out[kind] = out[kind] + t if kind in out else t
    return out
