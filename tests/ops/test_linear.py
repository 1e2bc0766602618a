import pytest
import torch

import kernels.ops.linear.kernel
from kernels import TileConfig, linear, reference
from kernels.config import cdiv
from tests.ops.limits import BF16, H200
from tests.tolerances import DTYPES, assert_close, f64, float16_here, in_turn_here

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
    # each tile config meets every epilogue over the shapes, and every shape runs with every config
    turn = SHAPES.index((rows, k, n)) + CONFIGS.index(cfg)
    in_turn_here(device, turn, EPILOGUES.index(epi), len(EPILOGUES))
    _check(device, dtype, rows, k, n, epi, cfg)


SPLIT_SHAPES = [(1, 200, 96), (3, 768, 200), (16, 96, 768)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", SPLIT_SHAPES)
@pytest.mark.parametrize("epi", EPILOGUES[1:3], ids=["gelu", "residual"])
@pytest.mark.parametrize("cfg", SPLIT_CONFIGS, ids=str)
def test_linear_split_k_decode_path(device, dtype, rows, k, n, epi, cfg):
    # each split meets both epilogues over the shapes
    turn = SPLIT_SHAPES.index((rows, k, n)) + SPLIT_CONFIGS.index(cfg)
    in_turn_here(device, turn, EPILOGUES[1:3].index(epi), 2)
    _check(device, dtype, rows, k, n, epi, cfg)


# The persistent form (tensor descriptors, one program per SM walking the tiles): on Hopper it is the default
# for 16-bit inputs; here it is switched on wherever the layout allows, so the interpreter runs it too. With 4
# programs on CPU and 17..300 rows, each program walks several tiles, edges included.
PERSISTENT_SHAPES = [(17, 768, 96), (127, 200, 264), (300, 96, 200)]
PERSISTENT_CONFIGS = [None, TileConfig(block_m=16, block_n=32, block_k=16, group_m=2, num_stages=2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", PERSISTENT_SHAPES)
@pytest.mark.parametrize("epi", EPILOGUES, ids=lambda e: "-".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("cfg", PERSISTENT_CONFIGS, ids=str)
def test_linear_persistent_form(device, dtype, rows, k, n, epi, cfg):
    # one epilogue per case, in turn over the shapes, configs and dtypes: each config meets three or four of them
    turn = PERSISTENT_SHAPES.index((rows, k, n)) + len(PERSISTENT_SHAPES) * PERSISTENT_CONFIGS.index(cfg)
    turn += (torch.float32, torch.float16, torch.bfloat16).index(dtype)
    in_turn_here(device, turn, EPILOGUES.index(epi), len(EPILOGUES))
    module = kernels.ops.linear.kernel
    with module.forced_form(persistent=True), module.forms_taken() as taken:
        _check(device, dtype, rows, k, n, epi, cfg)
    assert taken == ["persistent"]


def test_linear_persistent_form_falls_back_where_rows_are_not_aligned(device):
    """Rows of 33 halves (66 bytes) cannot be described to TMA: the tile kernel runs instead, correctly."""
    module = kernels.ops.linear.kernel
    with module.forced_form(persistent=True), module.forms_taken() as taken:
        _check(device, torch.float16, 40, 33, 24, EPILOGUES[1], None)
    assert taken == ["tile"]


def test_the_forms_taken_are_recorded_only_inside_the_block(device):
    module = kernels.ops.linear.kernel
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


# --- Requests between L2 and the SMs, against a walk over the kernel's program grid.


def linear_loads(rows, out, inp, item, cfg):
    """Bytes of x, weight and bias each program of the tiled kernel loads, walking its grid."""
    tiles_m, tiles_n = cdiv(rows, cfg.block_m), cdiv(out, cfg.block_n)
    total = 0
    for pid in range(tiles_m * tiles_n):
        group = cfg.group_m * tiles_n
        first_m = (pid // group) * cfg.group_m
        pid_m = first_m + (pid % group) % min(tiles_m - first_m, cfg.group_m)
        pid_n = (pid % group) // min(tiles_m - first_m, cfg.group_m)
        tile_rows = {(pid_m * cfg.block_m + i) % rows for i in range(cfg.block_m)}  # wrapped rows repeat
        tile_cols = {(pid_n * cfg.block_n + j) % out for j in range(cfg.block_n)}
        valid_cols = [c for c in range(pid_n * cfg.block_n, (pid_n + 1) * cfg.block_n) if c < out]
        total += (len(tile_rows) + len(tile_cols)) * inp * item + len(valid_cols) * item  # x, weight, bias
    return total


@pytest.mark.parametrize(
    "rows,out,inp,cfg",
    [
        (100, 300, 70, TileConfig(block_m=32, block_n=64, block_k=32, group_m=2)),
        (1024, 3072, 768, None),
        (20, 96, 64, TileConfig(block_m=64, block_n=32, block_k=32, group_m=8)),
    ],
)
def test_linear_l2_reads_match_a_walk_over_the_grid(rows, out, inp, cfg):
    t = kernels.ops.linear.kernel.traffic(rows, out, inp, 2, activation="gelu", config=cfg, dtype=BF16, device=H200)
    cfg = kernels.ops.linear.kernel.resolve_config(cfg, rows, out, inp, BF16, H200)
    assert t.bytes_read == linear_loads(rows, out, inp, 2, cfg)
    assert t.bytes_written == rows * out * 2


def test_a_row_tile_of_the_users_own_on_decode_rows_takes_the_one_split_path():
    """On a GPU the default for a few rows splits K with all rows in one 16-row tile; a visitor's 32-row tile
    with split_k left unset is not refused for it: the launch takes one split. Asking for both is refused."""
    resolve = kernels.ops.linear.kernel.resolve_config
    assert resolve(None, 3, 3072, 768, BF16, H200).split_k > 1
    mine = resolve(TileConfig(block_m=32, block_n=64, block_k=32), 3, 3072, 768, BF16, H200)
    assert (mine.block_m, mine.block_n, mine.block_k, mine.split_k) == (32, 64, 32, 1)
    with pytest.raises(ValueError, match="block_m must be 16"):
        resolve(TileConfig(block_m=32, split_k=2), 3, 3072, 768, BF16, H200)


def test_linear_split_k_l2_reads_match_a_walk_over_the_grid():
    rows, out, inp, item = 3, 3072, 768, 2
    t = kernels.ops.linear.kernel.traffic(rows, out, inp, item, dtype=BF16, device=H200)
    cfg = kernels.ops.linear.kernel.resolve_config(None, rows, out, inp, BF16, H200)
    assert cfg.split_k > 1
    per_split = cdiv(cdiv(inp, cfg.split_k), cfg.block_k) * cfg.block_k
    loads = partials = 0
    for _pid_n in range(cdiv(out, cfg.block_n)):
        for lo in range(0, inp, per_split):
            width = min(lo + per_split, inp) - lo
            loads += (rows + cfg.block_n) * width * item  # x rows are masked, weight columns wrap
            partials += rows * cfg.block_n * 4
    loads += partials + out * item  # the reduce kernel: every partial, then the bias
    assert t.bytes_read == loads
    assert t.bytes_written == partials + rows * out * item
