"""RMSNorm (the Llama family's normalisation) against PyTorch in float64, alone and with the residual add fused."""

import pytest
import torch

from kernels import TileConfig, reference, rms_norm
from kernels.ops.layer_norm import traffic
from kernels.ops.rms_norm import kernel as rms
from tests.tolerances import DTYPES, assert_close, f64, in_turn_here

# (rows, width): sequence lengths 1, 17, 127, 1000 across SmolLM2's width (576, not a power of two) and others.
SHAPES = [(1, 576), (17, 96), (127, 200), (1000, 576), (5, 1)]
CONFIGS = [None, TileConfig(block_m=1, num_warps=1), TileConfig(block_m=16, num_warps=2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", SHAPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(device, dtype, rows, width, cfg, with_residual):
    if rows == 1000 and cfg is not None and cfg.block_m == 1 and device.type == "cpu":
        pytest.skip("1000 programs of one row are slow in the interpreter; the default tiles cover 1000 rows")
    # with and without the residual in turn over the shapes: every config meets both
    in_turn_here(device, SHAPES.index((rows, width)) + CONFIGS.index(cfg), int(with_residual), 2)
    x = torch.randn(rows, width, device=device, dtype=dtype) * 3 + 1
    w = torch.randn(width, device=device, dtype=dtype)
    if not with_residual:
        y = rms_norm(x, w, 1e-5, config=cfg)
        assert_close("rms_norm", y, reference.rms_norm(*f64(x, w), 1e-5), dtype)
        return
    r = torch.randn_like(x)
    y, s = rms_norm(x, w, 1e-5, residual=r, config=cfg)
    # The sum is rounded to the input dtype before it is normalised, as torch's separate add does.
    s_ref = (x + r).cpu().double()
    assert_close("rms_norm", s, s_ref, dtype)
    assert_close("rms_norm", y, reference.rms_norm(s_ref, *f64(w), 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_batched_and_strided_rows(device, dtype):
    big = torch.randn(2, 17, 300, device=device, dtype=dtype)
    x = big[..., :200]  # rows 300 apart
    w = torch.randn(200, device=device, dtype=dtype)
    y = rms_norm(x, w, 1e-6)
    assert y.shape == x.shape
    assert_close("rms_norm", y, reference.rms_norm(*f64(x, w), 1e-6), dtype)


def test_rms_norm_is_llamas(device):
    """The same numbers as transformers' LlamaRMSNorm (weights and inputs in float32)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(96, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96))
    x = torch.randn(17, 96)
    with torch.no_grad():
        expected = norm(x)
    assert_close("rms_norm", rms_norm(x.to(device), norm.weight.detach().to(device), 1e-5), expected, torch.float32)


def test_rms_norm_says_what_is_wrong(device):
    x = torch.randn(4, 96, device=device)
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \(96,\)"):
        rms_norm(x, torch.ones(95, device=device))
    with pytest.raises(ValueError, match="rms_norm: residual"):
        rms_norm(x, torch.ones(96, device=device), residual=torch.randn(4, 95, device=device))
    with pytest.raises(ValueError, match="rms_norm: block_n=16 is smaller than the row width 96"):
        rms_norm(x, torch.ones(96, device=device), config=TileConfig(block_n=16))
    with pytest.raises(ValueError, match="rms_norm: block_m"):
        rms_norm(x, torch.ones(96, device=device), config=TileConfig(block_m=3))


def test_rms_norm_traffic_is_layer_norms_without_the_bias():
    rows, width, item = 4096, 576, 2
    with_bias, without = traffic(rows, width, item, residual=True), rms.traffic(rows, width, item, residual=True)
    programs = -(-rows // rms.resolve_config(None, rows, width, "cpu", "rms_norm").block_m)
    assert with_bias.bytes_read - without.bytes_read == programs * width * item  # each program's bias load
    assert with_bias.hbm_read - without.hbm_read == width * item  # the bias, once
    assert without.bytes_written == with_bias.bytes_written == 2 * rows * width * item
