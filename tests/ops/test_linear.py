import pytest
import torch

import kernels.matmul.kernel
from kernels import TileConfig, linear, reference
from tests.tolerances import DTYPES, assert_close, f64, float16_here

# (rows, in_features, out_features): decode rows 1 and 5, the 16-row boundary, prefill rows 17, 127, 1000,
# and widths 768, 96, 200 and 264, none a power of two.
SHAPES = [(1, 768, 200), (5, 96, 768), (16, 200, 96), (17, 768, 96), (127, 200, 264), (1000, 96, 200)]
EPILOGUES = [
    dict(bias=True, activation=None, residual=False),
    dict(bias=True, activation="gelu", residual=False),
    dict(bias=True, activation=None, residual=True),
    dict(bias=False, activation="gelu", residual=True),
]
CONFIGS = [
    None,
    # Small tiles: many programs, a K tail (200 % 16 == 8 for K=200), grouped ordering with ragged groups.
    TileConfig(block_m=16, block_n=16, block_k=16, group_m=2, split_k=1, num_warps=1, num_stages=1),
    TileConfig(block_m=64, block_n=32, block_k=64, group_m=4, split_k=1),
]
# The split-K path, for decode shapes only: uneven splits (K=200 in chunks of 64: 64, 64, 64, 8).
SPLIT_CONFIGS = [
    TileConfig(block_m=16, block_n=32, block_k=32, split_k=4),
    TileConfig(block_m=16, block_n=16, block_k=16, split_k=16),
]


def _inputs(device, dtype, rows, k, n, bias, residual):
    x = torch.randn(rows, k, device=device, dtype=dtype)
    w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
    b = torch.randn(n, device=device, dtype=dtype) if bias else None
    r = torch.randn(rows, n, device=device, dtype=dtype) if residual else None
    return x, w, b, r


def _check(device, dtype, rows, k, n, epi, cfg):
    x, w, b, r = _inputs(device, dtype, rows, k, n, epi["bias"], epi["residual"])
    y = linear(x, w, b, activation=epi["activation"], residual=r, config=cfg)
    ref = reference.linear(
        *f64(x, w),
        None if b is None else f64(b)[0],
        activation=epi["activation"],
        residual=None if r is None else f64(r)[0],
    )
    assert y.shape == (rows, n)
    assert_close("linear", y, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", SHAPES)
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "-".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_linear_matches_reference(device, dtype, rows, k, n, epi, cfg):
    if rows == 1000 and cfg is not None and cfg.block_m == 16 and device.type == "cpu":
        pytest.skip("1000 rows in 16x16 tiles take minutes in the interpreter; covered by smaller rows")
    float16_here(device, dtype, rows in (1, 16, 17))  # a decode row, the 16-row boundary, a prefill past it
    _check(device, dtype, rows, k, n, epi, cfg)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", [(1, 200, 96), (3, 768, 200), (16, 96, 768)])
@pytest.mark.parametrize("epi", EPILOGUES[1:3], ids=["gelu", "residual"])
@pytest.mark.parametrize("cfg", SPLIT_CONFIGS, ids=str)
def test_linear_split_k_decode_path(device, dtype, rows, k, n, epi, cfg):
    _check(device, dtype, rows, k, n, epi, cfg)


# The persistent form (tensor descriptors, one program per SM walking the tiles): on Hopper it is the default
# for 16-bit inputs; here it is switched on wherever the layout allows, so the interpreter runs it too. With 4
# programs on CPU and 17..300 rows, each program walks several tiles, edges included.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", [(17, 768, 96), (127, 200, 264), (300, 96, 200)])
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "-".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize(
    "cfg", [None, TileConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_stages=2)], ids=str
)
def test_linear_persistent_form(device, dtype, rows, k, n, epi, cfg):
    module = kernels.matmul.kernel
    with module.forced_form(persistent=True), module.forms_taken() as taken:
        _check(device, dtype, rows, k, n, epi, cfg)
    assert taken == ["persistent"]


def test_linear_persistent_form_falls_back_where_rows_are_not_aligned(device):
    """Rows of 33 halves (66 bytes) cannot be described to TMA: the tile kernel runs instead, correctly."""
    module = kernels.matmul.kernel
    with module.forced_form(persistent=True), module.forms_taken() as taken:
        _check(device, torch.float16, 40, 33, 24, EPILOGUES[1], None)
    assert taken == ["tile"]


def test_the_forms_taken_are_recorded_only_inside_the_block(device):
    module = kernels.matmul.kernel
    x, w = torch.randn(3, 40, device=device), torch.randn(24, 40, device=device)
    with module.forms_taken() as outer:
        with module.forms_taken() as inner:
            linear(x, w)
        linear(x, w)
    linear(x, w)
    assert len(inner) == 1 and len(outer) == 1 and inner[0] in ("tile", "split-k") and module._taken is None


def test_linear_keeps_leading_dims(device):
    x = torch.randn(2, 3, 96, device=device)
    w = torch.randn(40, 96, device=device)
    assert_close("linear", linear(x, w), reference.linear(*f64(x, w)), torch.float32)


def test_linear_rejects_bad_activation_and_split(device):
    x, w = torch.randn(32, 96, device=device), torch.randn(40, 96, device=device)
    with pytest.raises(ValueError, match="activation='relu' is not supported"):
        linear(x, w, activation="relu")
    with pytest.raises(ValueError, match="split_k=4 is only for decode-shaped inputs of at most 16 rows, got 32"):
        linear(x, w, config=TileConfig(block_m=16, split_k=4))
