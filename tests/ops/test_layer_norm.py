import pytest
import torch

import kernels.ops.layer_norm.kernel as layer_norm_mod
from kernels import TileConfig, layer_norm, reference
from tests.ops.limits import H200
from tests.tolerances import DTYPES, assert_close, f64, in_turn_here

# (rows, width): sequence lengths 1, 17, 127, 1000 across GPT-2's width and two that are not powers of two.
SHAPES = [(1, 768), (17, 96), (127, 200), (1000, 768), (5, 1)]
CONFIGS = [None, TileConfig(block_m=1, num_warps=1), TileConfig(block_m=16, num_warps=2), "wide"]


def _config(cfg, width):
    if cfg == "wide":  # a block wider than the row: most lanes masked
        return TileConfig(block_m=2, block_n=4 * max(16, 1 << (width - 1).bit_length()))
    return cfg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,width", SHAPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("with_residual", [False, True])
def test_layer_norm_matches_reference(device, dtype, rows, width, cfg, with_residual):
    if rows == 1000 and (cfg == "wide" or getattr(cfg, "block_m", None) == 1) and device.type == "cpu":
        pytest.skip(
            "1000 rows in one- and two-row programs are slow in the interpreter; smaller rows cover those tiles"
        )
    # with and without the residual in turn over the shapes: every config meets both
    in_turn_here(device, SHAPES.index((rows, width)) + CONFIGS.index(cfg), int(with_residual), 2)
    x = torch.randn(rows, width, device=device, dtype=dtype) * 3 + 1
    w = torch.randn(width, device=device, dtype=dtype)
    b = torch.randn(width, device=device, dtype=dtype)
    config = _config(cfg, width)
    if not with_residual:
        y = layer_norm(x, w, b, 1e-5, config=config)
        assert_close("layer_norm", y, reference.layer_norm(*f64(x, w, b), 1e-5), dtype)
        return
    r = torch.randn_like(x)
    y, s = layer_norm(x, w, b, 1e-5, residual=r, config=config)
    # The sum is rounded to the input dtype before it is normalised, as torch's separate add does.
    s_ref = (x + r).cpu().double()
    assert_close("layer_norm", s, s_ref, dtype)
    assert_close("layer_norm", y, reference.layer_norm(s_ref, *f64(w, b), 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_batched_and_strided_rows(device, dtype):
    big = torch.randn(2, 17, 300, device=device, dtype=dtype)
    x = big[..., :200]  # rows 300 apart: the kernel must use the row stride
    w, b = torch.randn(200, device=device, dtype=dtype), torch.randn(200, device=device, dtype=dtype)
    y = layer_norm(x, w, b, 1e-6)
    assert y.shape == x.shape
    assert_close("layer_norm", y, reference.layer_norm(*f64(x, w, b), 1e-6), dtype)


def test_layer_norm_rejects_mismatched_weight(device):
    x = torch.randn(4, 96, device=device)
    with pytest.raises(ValueError, match=r"weight and bias must have shape \(96,\)"):
        layer_norm(x, torch.ones(95, device=device), torch.zeros(96, device=device))


# --- Requests between L2 and the SMs, against a walk over the kernel's program grid.


def test_layer_norm_requests_weight_and_bias_in_every_program_and_reads_them_from_hbm_once():
    t = layer_norm_mod.traffic(4096, 768, 2, residual=True, device=H200)
    rows, wb = 2 * 4096 * 768 * 2, 2 * 768 * 2
    programs = -(-4096 // layer_norm_mod.resolve_config(None, 4096, 768, H200).block_m)
    assert t.bytes_read == rows + programs * wb  # ncu on an H200: 15.73 MB through L1
    assert abs(t.bytes_read / 15.73e6 - 1) < 0.15
    assert t.hbm_read == rows + wb
