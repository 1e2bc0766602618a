"""decode_linear's Llama forms (the decode rung of a Llama block): RMSNorm in the prologue, SwiGLU over a gate_up
weight in the epilogue, and c_attn's epilogue turning q and k by rotary positions before it writes a grouped-query
cache. Each against float64 PyTorch, and the cache against the rows the launch returns."""

import pytest
import torch

from kernels import TileConfig, decode_linear, reference
from kernels.config import cdiv
from kernels.matmul.decode import traffic
from tests.test_fused_linear import FORMS, _config, _counters_are_zero, only_the_new_rows_changed
from tests.tolerances import DTYPES, assert_close, f64, float16_here

# (rows, in_features, features): one row, a few, a whole decode tile; widths that are not powers of two. (16, 300, 20):
# 16 rows of 512 (the power of two over 300) pass STATS_ELEMENTS, so the K loop takes its chunked statistics.
SHAPES = [(1, 40, 17), (3, 96, 100), (16, 72, 24), (16, 300, 20)]


def _rms(x, weight, eps, dtype):
    """float64 RMSNorm, rounded to the input dtype as the kernel's dot operand is."""
    return reference.rms_norm(*f64(x, weight), eps).to(dtype).double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,features", SHAPES)
@pytest.mark.parametrize("split_k", [1, 4])
@pytest.mark.parametrize("form", FORMS)
def test_rms_prologue_and_swiglu_epilogue_match_float64(device, dtype, rows, k, features, split_k, form):
    float16_here(device, dtype, (rows, k, features) == (3, 96, 100))
    if device.type == "cpu" and form == "prefetch" and k == 300:
        pytest.skip("the chunked statistics are the K loop's; the prefetch form of 300 columns on a GPU only")
    x = torch.randn(rows, k, device=device, dtype=dtype) * 2 + 0.5
    norm = (torch.rand(k, device=device, dtype=dtype) + 0.5, None, 1e-5)
    gate_up = (torch.randn(2 * features, k, device=device) / k**0.5).to(dtype)
    h = _rms(x, norm[0], norm[2], dtype)

    cfg = _config(k, split_k, form, 2 * features, device)
    y = decode_linear(x, gate_up, activation="swiglu", norm=norm, config=cfg, pdl=True)
    assert y.shape == (rows, features)
    assert_close("linear", y, reference.swiglu(h, f64(gate_up)[0]), dtype)
    # RMSNorm alone before a projection (ln_f before the LM head), in the same tiles.
    y = decode_linear(x, gate_up, norm=norm, config=cfg)
    assert_close("linear", y, h @ f64(gate_up)[0].T, dtype)
    assert _counters_are_zero(device)


# (lengths, T_max, query heads, key/value heads, head_dim, split_k): a group of 3 and of 1, head sizes that are no
# power of two, a sequence at position 0, another at the cache's last slot.
ROPE_CASES = [
    ([0], 1, 3, 1, 10, 1),
    ([16, 0, 5], 17, 6, 2, 24, 2),
    ([126, 1], 127, 4, 4, 16, 4),
    ([0, 16, 3, 9], 17, 9, 3, 8, 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths,t_max,heads,kv_heads,head_dim,split_k", ROPE_CASES)
@pytest.mark.parametrize("form", FORMS)
def test_rope_turns_q_and_k_and_the_grouped_cache_gets_k_and_v(
    device, dtype, lengths, t_max, heads, kv_heads, head_dim, split_k, form
):
    batch, c, theta = len(lengths), 40, 10000.0
    out = (heads + 2 * kv_heads) * head_dim
    x = torch.randn(batch, 1, c, device=device, dtype=dtype)
    norm = (torch.rand(c, device=device, dtype=dtype) + 0.5, None, 1e-5)
    w = (torch.randn(out, c, device=device) / c**0.5).to(dtype)
    caches = torch.randn(2, 2, batch, kv_heads, t_max, head_dim, device=device, dtype=dtype)
    k_cache, v_cache = caches[0, 1], caches[1, 1]  # one layer's views of a whole-model cache
    before = caches.clone()
    lens = torch.tensor(lengths, device=device, dtype=torch.int32)

    cfg = _config(c, split_k, form, out, device)
    y = decode_linear(x, w, norm=norm, kv=(k_cache, v_cache, lens), rope=theta, config=cfg, pdl=True)[:, 0]

    # float64: the projection rounded to the dtype (the values the rotary launch would read), q's and k's heads
    # turned at each sequence's position, V's as they are.
    qkv = (_rms(x[:, 0], norm[0], norm[2], dtype) @ f64(w)[0].T).to(dtype).double()
    turned = (heads + kv_heads) * head_dim
    qk = qkv[:, :turned].view(batch, 1, heads + kv_heads, head_dim).transpose(1, 2)
    qk = reference.rotary(qk, torch.tensor(lengths)[:, None], theta).transpose(1, 2).reshape(batch, turned)
    assert_close("rotary", y, torch.cat([qk, qkv[:, turned:]], dim=-1), dtype)

    k_new = y[:, heads * head_dim : turned].view(batch, kv_heads, head_dim)
    v_new = y[:, turned:].view(batch, kv_heads, head_dim)
    only_the_new_rows_changed(caches, before, k_new, v_new, lengths, device)


def test_the_fused_forms_equal_the_unfused_launches(device):
    """The decode rung against the epilogue rung's launches on the same inputs: rms_norm, then linear and
    rotary, or swiglu."""
    from kernels import linear, rms_norm, rotary, swiglu

    x = torch.randn(2, 48, device=device, dtype=torch.float16)
    norm = (torch.rand(48, device=device, dtype=torch.float16) + 0.5, None, 1e-5)
    gate_up = torch.randn(2 * 40, 48, device=device, dtype=torch.float16) / 7
    h = rms_norm(x, norm[0], norm[2])
    assert_close("linear", decode_linear(x, gate_up, activation="swiglu", norm=norm), swiglu(h, gate_up), torch.float16)

    w = torch.randn((4 + 2 * 2) * 8, 48, device=device, dtype=torch.float16) / 7
    caches = torch.zeros(2, 2, 2, 5, 8, device=device, dtype=torch.float16)
    lens = torch.tensor([3, 0], device=device)
    y = decode_linear(x, w, norm=norm, kv=(caches[0], caches[1], lens), rope=5e5)
    qkv = linear(h, w)
    qk = rotary(qkv[:, :48].view(2, 1, 6, 8).transpose(1, 2), lens[:, None], 5e5).transpose(1, 2).reshape(2, 48)
    assert_close("linear", y, torch.cat([qk, qkv[:, 48:]], dim=-1), torch.float16)


def test_traffic_counts_the_gated_output_the_rms_weight_and_the_grouped_cache_rows():
    """Against GPT-2's forms at the same shapes: SwiGLU stores half the columns it computes; RMSNorm reads no bias;
    a cache of H_kv heads of D stores 2 H_kv D per row whatever the width; rope reads the positions in every tile."""
    args = dict(config=TileConfig(block_n=8, block_k=1024, split_k=1), dtype=torch.bfloat16, device="cpu")
    gelu = traffic(1, 3072, 576, 2, bias=False, activation="gelu", norm=True, **args)
    gated = traffic(1, 3072, 576, 2, bias=False, activation="swiglu", norm=True, rms=True, **args)
    assert gelu.bytes_written - gated.bytes_written == 1536 * 2  # F of 2F columns stored
    assert gelu.bytes_read - gated.bytes_read == cdiv(3072, 8) * 576 * 2  # each tile's slice of the LN bias
    plain = traffic(1, 960, 576, 2, bias=False, norm=True, rms=True, kv=3, head_dim=64, **args)
    turned = traffic(1, 960, 576, 2, bias=False, norm=True, rms=True, kv=3, head_dim=64, rope=True, **args)
    assert plain.bytes_written - traffic(1, 960, 576, 2, bias=False, norm=True, rms=True, **args).bytes_written == (
        2 * 3 * 128
    )
    assert turned.bytes_read - plain.bytes_read == (576 // 8) * 32  # q's 72 tiles read the positions too
    assert turned.flops > plain.flops and turned.hbm_bytes == plain.hbm_bytes


def test_refusals_name_the_llama_arguments():
    x, w = torch.randn(1, 32), torch.randn(64, 32)
    with pytest.raises(ValueError, match=r"rope turns q and k at the cache's lengths, so it needs kv"):
        decode_linear(x, w, rope=1e4)
    with pytest.raises(ValueError, match=r"norm weight and bias must have shape \(32,\), got \(31,\)"):
        decode_linear(x, w, norm=(torch.ones(31), None, 1e-5))
    with pytest.raises(ValueError, match=r"activation='swiglu' takes gate_up .* got weight \(63, 32\)"):
        decode_linear(x, torch.randn(63, 32), activation="swiglu")
