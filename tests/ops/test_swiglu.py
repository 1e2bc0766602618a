"""The gated feed-forward's gate and up projections as one matmul with SiLU(gate) * up in its epilogue."""

import pytest
import torch

from kernels import TileConfig, reference, swiglu
from kernels.ops.swiglu import kernel as swiglu_mod
from tests.tolerances import DTYPES, assert_close, f64, float16_here

# (rows, in_features, features): decode rows 1 and 5, the 16-row boundary, prefill rows 17, 127, 1000;
# SmolLM2's width 576 and widths that are not powers of two.
SHAPES = [(1, 576, 96), (5, 96, 200), (16, 200, 96), (17, 96, 264), (127, 200, 40), (1000, 40, 72)]
CONFIGS = [
    None,
    # Small tiles: many programs, a K tail (200 % 16 == 8), grouped ordering, column tiles past F.
    TileConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=1, num_stages=1),
    TileConfig(block_m=32, block_n=64, block_k=32, group_m=4),
]


def _inputs(device, dtype, rows, k, f):
    x = torch.randn(rows, k, device=device, dtype=dtype)
    return x, torch.randn(2 * f, k, device=device, dtype=dtype) / k**0.5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,f", SHAPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_swiglu_matches_reference(device, dtype, rows, k, f, cfg):
    if rows == 1000 and cfg is not None and cfg.block_m == 16 and device.type == "cpu":
        pytest.skip("1000 rows in 16x16 tiles are slow in the interpreter; smaller rows cover those tiles")
    float16_here(device, dtype, cfg is None)  # float16 in the default tiles at every shape, on CPU
    x, gate_up = _inputs(device, dtype, rows, k, f)
    y = swiglu(x, gate_up, config=cfg)
    assert y.shape == (rows, f) and y.dtype == dtype
    assert_close("linear", y, reference.swiglu(*f64(x, gate_up)), dtype)


def test_swiglu_is_llamas_mlp_before_its_down_projection(device):
    """act_fn(gate_proj(x)) * up_proj(x) of transformers' LlamaMLP, in float32."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    mlp = LlamaMLP(LlamaConfig(hidden_size=96, intermediate_size=200, hidden_act="silu")).eval()
    x = torch.randn(2, 9, 96)
    with torch.no_grad():
        expected = mlp.act_fn(mlp.gate_proj(x)) * mlp.up_proj(x)
    gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
    assert_close("linear", swiglu(x.to(device), gate_up.to(device)), expected, torch.float32)


def test_swiglu_says_what_is_wrong(device):
    x = torch.randn(4, 96, device=device)
    with pytest.raises(ValueError, match=r"swiglu: gate_up must be \(2F, 96\)"):
        swiglu(x, torch.randn(7, 96, device=device))
    with pytest.raises(ValueError, match=r"swiglu: gate_up must be \(2F, 96\)"):
        swiglu(x, torch.randn(8, 95, device=device))
    with pytest.raises(ValueError, match="swiglu: gate_up is torch.float16 but x is torch.float32"):
        swiglu(x, torch.randn(8, 96, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="swiglu: split_k=2 is not supported"):
        swiglu(x, torch.randn(8, 96, device=device), config=TileConfig(split_k=2))


def test_swiglu_traffic_reads_x_once_for_both_projections():
    """Against a gate and an up linear apart: the same weight bytes, x requested half as often, and no
    (M, 2F) pair of activations written and read back."""
    rows, k, f, item = 1024, 576, 1536, 2
    cfg = TileConfig(block_m=64, block_n=64, block_k=64, group_m=8, split_k=1, num_warps=4, num_stages=3)
    t = swiglu_mod.traffic(rows, f, k, item, config=cfg, dtype=torch.float16, device="cpu")
    tiles_m, tiles_n = rows // 64, f // 64
    assert t.bytes_read == tiles_m * tiles_n * 64 * k * item + tiles_m * 2 * f * k * item
    assert t.bytes_written == t.hbm_written == rows * f * item
    assert t.hbm_read == (rows * k + 2 * f * k) * item
