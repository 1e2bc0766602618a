"""The unfused rung's separate launches against float64 PyTorch: the residual add, the bias add, the GELU."""

import math

import pytest
import torch
import torch.nn.functional as F

from kernels import TileConfig, elementwise, linear
from kernels.config import SECTOR, new_output
from tests.tolerances import DTYPES, assert_close, f64

# Flat sizes around the spans: one element, short tails (17, 127), several CPU programs at small spans.
SIZES = [1, 17, 127, 1000]
# (rows, width): widths 17 and 768 as in GPT-2, and one row, one column, ragged row counts.
MATRICES = [(1, 17), (17, 768), (127, 17), (3, 1), (5, 770)]
# None: the device's default span; 16 and 64: many programs, spans shorter than a row, tails.
CONFIGS = [None, TileConfig(block_n=16, num_warps=1), TileConfig(block_n=64)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("n", SIZES)
def test_add_and_gelu_match_float64(device, dtype, cfg, n):
    x = torch.randn(n, device=device, dtype=dtype) * 3
    y = torch.randn(n, device=device, dtype=dtype)
    x64, y64 = f64(x, y)
    assert_close("add", elementwise.add(x, y, config=cfg), x64 + y64, dtype)
    assert_close("gelu", elementwise.gelu(x, config=cfg), F.gelu(x64, approximate="tanh"), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("rows,width", MATRICES)
def test_bias_add_broadcasts_over_the_last_dim(device, dtype, cfg, rows, width):
    x = torch.randn(rows, width, device=device, dtype=dtype)
    bias = torch.randn(width, device=device, dtype=dtype)
    out = elementwise.bias_add(x, bias, config=cfg)
    x64, b64 = f64(x, bias)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close("bias_add", out, x64 + b64, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gpt2_shaped_activations_and_strided_inputs(device, dtype):
    """(B, T, C) activations as the decoder makes them; a transposed x is made contiguous, not misread."""
    x = torch.randn(2, 5, 768, device=device, dtype=dtype)
    r = torch.randn(2, 5, 768, device=device, dtype=dtype)
    bias = torch.randn(768, device=device, dtype=dtype)
    x64, r64, b64 = f64(x, r, bias)
    h = elementwise.bias_add(x, bias)
    assert_close("bias_add", h, x64 + b64, dtype)
    assert_close("add", elementwise.add(h, r), f64(h)[0] + r64, dtype)
    strided = x.transpose(0, 1)  # (5, 2, 768), not contiguous
    out = elementwise.gelu(strided)
    assert out.shape == strided.shape and out.is_contiguous()
    assert_close("gelu", out, F.gelu(x64.transpose(0, 1), approximate="tanh"), dtype)
    assert_close("add", elementwise.add(strided, strided), 2 * x64.transpose(0, 1), dtype)


def test_gelu_is_the_formula_of_linears_epilogue(device):
    """The tanh GELU, not the erf one (they differ by up to 5e-4 around |x| = 2), and bit for bit what the
    fused linear applies: through an identity weight, its matmul changes nothing in fp32."""
    x = torch.linspace(-6, 6, 1024, device=device)
    x64 = f64(x)[0]
    tanh_gelu = 0.5 * x64 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    out = elementwise.gelu(x)
    assert_close("gelu", out, tanh_gelu, torch.float32)
    assert (F.gelu(x64) - tanh_gelu).abs().max() > 1e-4
    rows = x.view(16, 64)
    assert torch.equal(out.view(16, 64), linear(rows, torch.eye(64, device=device), activation="gelu"))


def test_empty_tensors_launch_nothing(device):
    empty = torch.empty(0, 768, device=device)
    assert elementwise.add(empty, empty).shape == (0, 768)
    assert elementwise.bias_add(empty, torch.zeros(768, device=device)).shape == (0, 768)
    assert elementwise.gelu(empty).shape == (0, 768)


def test_nan_poisoning_catches_an_element_left_unwritten(device):
    """Outputs start as NaN in the tests: a grid one program short leaves NaN, and the comparison fails."""
    x = torch.randn(100, device=device)
    out = new_output(x)
    elementwise.kernel._gelu_kernel[(3,)](x, out, x.numel(), BLOCK_N=32, Stamps=None)  # 96 of the 100
    assert out[:96].isfinite().all() and out[96:].isnan().all()
    with pytest.raises(AssertionError):
        assert_close("gelu", out, F.gelu(f64(x)[0], approximate="tanh"), torch.float32)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda x: elementwise.add(x, x[:, :16]),
            r"add: x and y must have the same shape, got \(4, 17\) and \(4, 16\)",
        ),
        (lambda x: elementwise.add(x, x.half()), r"add: x and y must share a dtype and a device, got torch.float32"),
        (lambda x: elementwise.bias_add(x, x[0, :16]), r"bias_add: bias must have shape \(17,\), got bias \(16,\)"),
        (lambda x: elementwise.bias_add(x, x[:, :1]), r"bias_add: bias must have shape \(17,\), got bias \(4, 1\)"),
        (lambda x: elementwise.bias_add(x[0, 0], x[0, :1]), r"bias_add: bias must have shape \(C,\) with x at least"),
        (lambda x: elementwise.bias_add(x, x[0].half()), r"bias_add: x and bias must share a dtype"),
        (lambda x: elementwise.gelu(x.double()), r"gelu: dtype torch.float64 is not supported on (cpu|cuda)"),
        (lambda x: elementwise.gelu(x, config=TileConfig(block_n=24)), r"gelu: block_n=24 is not allowed"),
        (lambda x: elementwise.add(x, x, config=TileConfig(num_warps=3)), r"add: num_warps=3 is not allowed"),
        (lambda x: elementwise.gelu(x, config="fast"), r"gelu: config must be None, a TileConfig or 'autotune'"),
    ],
)
def test_bad_inputs_are_refused_with_the_reason(device, call, message):
    with pytest.raises(ValueError, match=message):
        call(torch.randn(4, 17, device=device))


def test_autotune_takes_the_defaults(device):
    x = torch.randn(33, device=device)
    assert torch.equal(elementwise.gelu(x, config="autotune"), elementwise.gelu(x))


def bias_walk(rows, width, itemsize, block):
    """Bias bytes the programs load, walking the grid: the distinct sectors of each program's columns."""
    n, total = rows * width, 0
    for start in range(0, n, block):
        columns = {i % width for i in range(start, min(start + block, n))}
        total += len({c * itemsize // SECTOR for c in columns})  # an item never straddles two sectors
    return total * SECTOR


@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize(
    "rows,width,block", [(4, 768, 1024), (3, 3072, 1024), (7, 17, 16), (9, 100, 64), (5, 37, 64), (1, 5, 1024)]
)
def test_bias_add_l2_reads_match_a_walk_over_the_grid(rows, width, itemsize, block):
    t = elementwise.traffic_bias_add(rows, width, itemsize, config=TileConfig(block_n=block))
    x = rows * width * itemsize
    assert t.bytes_read == x + bias_walk(rows, width, itemsize, block)
    assert (t.bytes_written, t.hbm_read, t.hbm_written) == (x, x + width * itemsize, x)
    assert t.min_bytes == 2 * x + width * itemsize <= t.bytes


def test_add_and_gelu_move_each_tensor_once():
    add, gelu = elementwise.traffic_add(1000, 2), elementwise.traffic_gelu(1000, 2)
    assert (add.bytes_read, add.bytes_written, add.hbm_bytes, add.min_bytes) == (4000, 2000, 6000, 6000)
    assert (gelu.bytes_read, gelu.bytes_written, gelu.hbm_bytes, gelu.min_bytes) == (2000, 2000, 4000, 4000)
