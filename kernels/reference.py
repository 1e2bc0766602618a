"""PyTorch twins of the Triton kernels, with the same signatures.

They are the test oracle (called on float64 copies of the inputs), the baseline the benchmarks time
against, and the "torch" backend of the decoder. `config` is accepted and ignored so either module
can be dropped in for the other.
"""

import torch
import torch.nn.functional as F


def layer_norm(x, weight, bias, eps=1e-5, *, residual=None, config=None):
    if residual is None:
        return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)
    s = x + residual
    return F.layer_norm(s, (x.shape[-1],), weight, bias, eps), s


def rms_norm(x, weight, eps=1e-5, *, residual=None, config=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, in fp32 at least (as Llama's RMSNorm
    computes it; float64 stays float64, for the tests' oracle)."""
    s = x if residual is None else x + residual
    wide = torch.promote_types(s.dtype, torch.float32)
    h = s.to(wide)
    y = (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight.to(wide)).to(x.dtype)
    return y if residual is None else (y, s)


def rotary(x, positions, theta=10000.0, *, block_m=None):
    """x (B, H, T, D) rotated by its rows' positions (B, T), Llama's rotate_half convention, computed in x's
    precision or fp32, whichever is wider."""
    wide = torch.promote_types(x.dtype, torch.float32)
    half = x.shape[-1] // 2
    inv_freq = theta ** -(torch.arange(0, half, dtype=wide, device=x.device) * 2 / x.shape[-1])
    angle = positions.to(wide)[:, None, :, None] * inv_freq  # (B, 1, T, D/2)
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x[..., :half].to(wide), x[..., half:].to(wide)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def swiglu(x, gate_up, *, config=None):
    """silu(x @ W_gate.T) * (x @ W_up.T), gate_up = [W_gate; W_up] (2F, K)."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.silu(gate) * up


def linear(x, weight, bias=None, *, activation=None, residual=None, config=None):
    y = F.linear(x, weight, bias)
    if activation == "gelu":
        y = F.gelu(y, approximate="tanh")
    elif activation is not None:
        raise ValueError(f"linear: activation={activation!r} is not supported (allowed: None, 'gelu')")
    return y if residual is None else y + residual


def attention(q, k, v, *, causal=True, config=None):
    tq, tk = q.shape[2], k.shape[2]
    if not causal:
        return F.scaled_dot_product_attention(q, k, v)
    if tq == tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # Bottom-right aligned: query i sits at key position tk - tq + i.
    mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril(tk - tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def unplanned():
    """PyTorch's attention without cuDNN's, for a run whose attention meets a new length at each step (a prefill,
    every step with the cache off). On Hopper PyTorch picks cuDNN's attention, which builds a plan for each length
    the first time it meets it: 60-75 ms a step on an H200 with the cache off, where flash attention's first call
    at a new length takes 0.2 ms. That is planning, not moving bytes, so the decoder's torch backend leaves it out;
    the benchmarks, at fixed shapes, keep PyTorch's own choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def decode_attention(q, k_cache, v_cache, lengths, *, config=None, one_launch=False):
    # A mask over the whole allocation keeps shapes fixed and the host unsynchronised; it reads all
    # T_max positions, which the Triton kernel does not.
    keep = torch.arange(k_cache.shape[2], device=q.device)[None, :] < lengths[:, None]  # (B, T_max)
    return F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=keep[:, None, None, :])


def grouped_attention(q, k, v, *, causal=True, block_m=None, block_n=None):
    """Every key/value head repeated for its group of query heads, then ordinary attention."""
    group = q.shape[1] // k.shape[1]
    return attention(q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), causal=causal)


def grouped_decode_attention(q, k_cache, v_cache, lengths, *, block_n=None):
    """Every key/value head repeated for its group of query heads, then ordinary decode attention."""
    group = q.shape[1] // k_cache.shape[1]
    repeat = lambda t: t.repeat_interleave(group, dim=1)
    return decode_attention(q, repeat(k_cache), repeat(v_cache), lengths)


def kv_write(k, v, k_cache, v_cache, lengths):
    rows, pos = torch.arange(k.shape[0], device=k.device), lengths.long()
    k_cache[rows, :, pos] = k[:, :, 0]  # (B, H, D) at each sequence's own position
    v_cache[rows, :, pos] = v[:, :, 0]
