"""decode_linear, the decode step's linear in one launch, against a float64 reference, against the unfused
launches it replaces (layer_norm, linear, kv_write), and for what it leaves behind: counters at zero and
every cache element but the new rows untouched; its GPT-2 forms, then its Llama forms."""

import pytest
import torch
import torch.nn.functional as F

import kernels
import kernels.ops.decode_linear.kernel as fused
from kernels import TileConfig, arrival, decode_linear, kv_write, layer_norm, linear, reference
from kernels.config import SECTOR, DeviceLimits, cdiv, sectors
from kernels.ops.decode_linear.kernel import traffic
from tests.tolerances import DTYPES, assert_close, f64, float16_here, in_turn_here

# The decoder's uses, by flag combination. The attention's and the MLP's c_proj share one (bias and the
# residual; they differ only in shape, covered by SHAPES), so four entries stand for five layers.
USES = {
    "ln_1-c_attn": dict(norm=True, bias=True, activation=None, residual=False),
    "c_proj": dict(norm=False, bias=True, activation=None, residual=True),
    "ln_2-c_fc-gelu": dict(norm=True, bias=True, activation="gelu", residual=False),
    "ln_f-lm_head": dict(norm=True, bias=False, activation=None, residual=False),
}
# (rows, in_features, out_features): rows 1, 3, 16; widths that are not multiples of a tile; one output
# column, a ragged last column tile, and c_attn's 3 * in.
# (16, 300, 40): the statistics of a whole decode tile of rows, each row 300 wide loaded as 512 (its power of two).
SHAPES = [(1, 17, 1), (3, 64, 17), (16, 96, 100), (3, 88, 264), (16, 17, 51), (16, 300, 40)]
SPLITS = [1, 4]  # no split, and four: with K = 17, 88, 200 or 300 the slices of K come out uneven
FORMS = ["loop", "prefetch"]


def _config(in_features, split_k, form="loop", out_features=1, device=None):
    """Tiles small enough for several column tiles and splits that do not divide K evenly. The K loop: K=17
    in 16-wide steps splits as 16 + 1, K=200 in 32-wide steps as 64 + 64 + 64 + 8, K=96 as three splits of
    four asked. The prefetch form (block_k >= 512): slices of cdiv(K, split_k) rounded up to 16 columns, each
    loaded as a power of two and a tail (K=200 in two: 112 = 64 + 64 masked to 48, and 88), 8-column tiles;
    in the interpreter, outputs wider than 32 take 32-column tiles (still several, the last one ragged: 264
    is 8 x 32 + 8, 40 is 32 + 8), since it runs every program in Python."""
    if form == "prefetch":
        cpu = device is not None and device.type == "cpu"
        return TileConfig(block_n=32 if cpu and out_features > 32 else 8, block_k=512, split_k=split_k)
    return TileConfig(block_n=64, block_k=16 if in_features <= 64 else 32, split_k=split_k)


def _inputs(device, dtype, rows, k, n, use):
    x = torch.randn(rows, k, device=device, dtype=dtype) * 2 + 0.5  # LayerNorm has a mean and a scale to remove
    w = torch.randn(n, k, device=device, dtype=dtype) / k**0.5
    b = torch.randn(n, device=device, dtype=dtype) if use["bias"] else None
    r = torch.randn(rows, n, device=device, dtype=dtype) if use["residual"] else None
    norm = None
    if use["norm"]:
        norm = (torch.randn(k, device=device, dtype=dtype), torch.randn(k, device=device, dtype=dtype), 1e-5)
    return x, w, b, r, norm


def _reference(x, w, b, r, norm, activation, dtype):
    x64 = f64(x)[0]
    if norm is not None:
        # float64 LayerNorm, rounded to the input dtype as the kernel's dot operand is.
        x64 = F.layer_norm(x64, (x.shape[-1],), *f64(norm[0], norm[1]), norm[2]).to(dtype).double()
    return reference.linear(
        x64, *f64(w), None if b is None else f64(b)[0], activation=activation, residual=None if r is None else f64(r)[0]
    )


def _unfused(x, w, b, r, norm, activation, cfg):
    """Today's launches: layer_norm, then linear's split-K pair (or its tiled kernel, for one split)."""
    if norm is not None:
        x = layer_norm(x, *norm)
    split = TileConfig(block_m=16, block_n=cfg.block_n, block_k=cfg.block_k, split_k=cfg.split_k)
    return linear(x, w, b, activation=activation, residual=r, config=split)


def _counters_are_zero(device):
    return not arrival.counters(device, 1).any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", SHAPES)
@pytest.mark.parametrize("use", USES.values(), ids=USES.keys())
@pytest.mark.parametrize("split_k", SPLITS)
@pytest.mark.parametrize("form", FORMS)
def test_decode_linear_matches_float64_reference(device, dtype, rows, k, n, use, split_k, form):
    float16_here(device, dtype, (rows, k, n) in ((1, 17, 1), (3, 88, 264), (16, 300, 40)))
    # each use meets every split and form over the shapes, and every shape runs with every use
    turn = SHAPES.index((rows, k, n)) + list(USES.values()).index(use)
    in_turn_here(device, turn, SPLITS.index(split_k) * len(FORMS) + FORMS.index(form), len(SPLITS) * len(FORMS))
    x, w, b, r, norm = _inputs(device, dtype, rows, k, n, use)
    cfg = _config(k, split_k, form, n, device)
    y = decode_linear(x, w, b, activation=use["activation"], residual=r, norm=norm, config=cfg, pdl=True)
    assert y.shape == (rows, n)
    assert_close("linear", y, _reference(x, w, b, r, norm, use["activation"], dtype), dtype)
    assert _counters_are_zero(device)


UNFUSED_SHAPES = [(3, 200, 100), (16, 17, 51)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,n", UNFUSED_SHAPES)
@pytest.mark.parametrize("use", USES.values(), ids=USES.keys())
@pytest.mark.parametrize("split_k", SPLITS)
@pytest.mark.parametrize("form", FORMS)
def test_decode_linear_equals_the_unfused_launches(device, dtype, rows, k, n, use, split_k, form):
    # both forms of every case; each use meets both splits over the two shapes
    turn = UNFUSED_SHAPES.index((rows, k, n)) + list(USES.values()).index(use)
    in_turn_here(device, turn, SPLITS.index(split_k), len(SPLITS))
    x, w, b, r, norm = _inputs(device, dtype, rows, k, n, use)
    y = decode_linear(
        x, w, b, activation=use["activation"], residual=r, norm=norm, config=_config(k, split_k, form, n, device)
    )
    expected = _unfused(x, w, b, r, norm, use["activation"], _config(k, split_k))
    assert_close("linear", y, expected, dtype)
    if device.type == "cpu" and norm is None and form == "loop":
        # Same tiles, same partials, added in the same split order: the interpreter gives the same bits.
        # (With the norm, the statistics are summed in BLOCK_K chunks instead of one whole-row block, which
        # can move fp32 mean and rstd by an ulp.)
        assert torch.equal(y, expected)


@pytest.mark.parametrize("split_k", [2, 4])
@pytest.mark.parametrize("form", FORMS)
def test_every_launch_leaves_the_counters_at_zero_and_repeats_bit_for_bit(device, split_k, form):
    use = USES["ln_2-c_fc-gelu"]
    x, w, b, r, norm = _inputs(device, torch.float16, 5, 96, 100, use)
    cfg = _config(96, split_k, form, 100, device)
    first = decode_linear(x, w, b, activation="gelu", norm=norm, config=cfg)
    assert _counters_are_zero(device)
    second = decode_linear(x, w, b, activation="gelu", norm=norm, config=cfg)
    assert _counters_are_zero(device)
    assert torch.equal(first, second)


def test_decode_linear_keeps_leading_dims_and_reads_strided_rows(device):
    qkv = torch.randn(4, 1, 3, 96, device=device)
    x = qkv[:, :, 1]  # (4, 1, 96), rows 288 elements apart
    w = torch.randn(40, 96, device=device) / 10
    y = decode_linear(x, w, config=TileConfig(block_n=16, block_k=32, split_k=2))
    assert y.shape == (4, 1, 40)
    assert_close("linear", y, reference.linear(*f64(x, w)), torch.float32)


def test_autotune_without_a_gpu_takes_the_defaults(device):
    if device.type == "cuda":
        pytest.skip("on a GPU autotune times candidates; tested on CPU, where it must not")
    x, w = torch.randn(2, 64, device=device), torch.randn(40, 64, device=device)
    assert fused.tuned_config(x, w) is None
    assert torch.equal(decode_linear(x, w, config="autotune"), decode_linear(x, w))


def test_zero_rows_launch_nothing(device):
    y = decode_linear(torch.randn(0, 64, device=device), torch.randn(10, 64, device=device))
    assert y.shape == (0, 10)


KV_CASES = [
    # (lengths, T_max, heads, head_dim, split_k)
    ([0], 1, 1, 17, 1),
    ([16, 0, 5], 17, 3, 24, 2),
    ([126, 1], 127, 4, 17, 4),
    ([0, 16, 3, 9], 17, 2, 24, 2),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths,t_max,heads,head_dim,split_k", KV_CASES)
@pytest.mark.parametrize("form", FORMS)
def test_kv_rows_land_at_each_sequences_position_and_nothing_else_changes(
    device, dtype, lengths, t_max, heads, head_dim, split_k, form
):
    batch, c = len(lengths), heads * head_dim
    use = USES["ln_1-c_attn"]
    x, w, b, _, norm = _inputs(device, dtype, batch, c, 3 * c, use)
    x = x.view(batch, 1, c)  # as the decoder passes it: one token per sequence
    # One layer's views of a whole-model cache (layers, B, H, T_max, D), as explorer.model.cache keeps them.
    caches = torch.randn(2, 2, batch, heads, t_max, head_dim, device=device, dtype=dtype)
    k_cache, v_cache = caches[0, 1], caches[1, 1]
    before = caches.clone()
    lens = torch.tensor(lengths, device=device, dtype=torch.int64 if batch % 2 else torch.int32)

    cfg = _config(c, split_k, form, 3 * c, device)
    y = decode_linear(x, w, b, norm=norm, kv=(k_cache, v_cache, lens), config=cfg, pdl=True)

    assert_close("linear", y[:, 0], _reference(x[:, 0], w, b, None, norm, None, dtype), dtype)
    k_new = y[:, 0, c : 2 * c].view(batch, heads, head_dim)
    v_new = y[:, 0, 2 * c :].view(batch, heads, head_dim)
    only_the_new_rows_changed(caches, before, k_new, v_new, lengths, device)


def only_the_new_rows_changed(caches, before, k_new, v_new, lengths, device):
    """caches (K/V, layers, B, H, T_max, D) after a launch that wrote layer 1's views: k_new and v_new (B, H, D)
    at each sequence's length, every other element (the other layer's included) as in `before`, and the
    arrival counters back at zero."""
    for i, n in enumerate(lengths):
        assert torch.equal(caches[0, 1, i, :, n], k_new[i]) and torch.equal(caches[1, 1, i, :, n], v_new[i])
        before[0, 1, i, :, n], before[1, 1, i, :, n] = k_new[i], v_new[i]
    assert torch.equal(caches, before)
    assert _counters_are_zero(device)


def test_kv_caches_match_the_unfused_cache_write(device):
    lengths, heads, head_dim, t_max = [3, 0], 2, 24, 5
    batch, c = len(lengths), heads * head_dim
    x, w, b, _, _ = _inputs(device, torch.float16, batch, c, 3 * c, USES["c_proj"])
    lens = torch.tensor(lengths, device=device, dtype=torch.int32)
    caches = torch.randn(2, batch, heads, t_max, head_dim, device=device, dtype=torch.float16)
    expected = caches.clone()
    cfg = _config(c, 2)
    y = decode_linear(x, w, b, kv=(caches[0], caches[1], lens), config=cfg)
    y_unfused = _unfused(x, w, b, None, None, None, cfg)
    _, k, v = y_unfused.view(batch, 1, 3, heads, head_dim).unbind(2)
    kv_write(k.transpose(1, 2), v.transpose(1, 2), expected[0], expected[1], lens)
    assert_close("linear", y, y_unfused, torch.float16)
    if device.type == "cpu":  # the same partials in the same order, as in the test of y above
        assert torch.equal(caches, expected)
    else:
        assert_close("linear", caches, expected, torch.float16)


def _bad(device, **change):
    """Valid ln_1 -> c_attn -> cache arguments for 2 rows of C=32 in 2 heads, with `change` applied."""
    c = 32
    args = dict(
        x=torch.randn(2, c, device=device),
        weight=torch.randn(3 * c, c, device=device),
        bias=torch.randn(3 * c, device=device),
        norm=(torch.ones(c, device=device), torch.zeros(c, device=device), 1e-5),
        kv=(
            torch.zeros(2, 2, 8, 16, device=device),
            torch.zeros(2, 2, 8, 16, device=device),
            torch.zeros(2, dtype=torch.int32, device=device),
        ),
    )
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(x=torch.randn(17, 32)), r"x has 17 rows, more than the 16 one decode launch holds .* use kernels.linear"),
        (dict(x=torch.randn(2, 32, dtype=torch.float64)), r"dtype torch.float64 is not supported on cpu"),
        (dict(weight=torch.randn(96, 31)), r"weight must be \(out, 32\), got \(96, 31\)"),
        (dict(bias=torch.randn(95)), r"bias must be \(96,\), got \(95,\)"),
        (dict(activation="relu"), r"activation='relu' is not supported \(allowed: None, 'gelu', 'swiglu'\)"),
        (dict(residual=torch.randn(2, 95)), r"residual must have shape \(2, 96\), got \(2, 95\)"),
        (dict(norm=(torch.ones(31), torch.zeros(32), 1e-5)), r"norm weight and bias must have shape \(32,\)"),
        (dict(norm=(torch.ones(32), torch.zeros(32))), r"norm must be \(weight, bias, eps\), bias None for RMSNorm"),
        (dict(norm=(torch.ones(32), torch.zeros(32), -1.0)), r"norm eps must be a finite number >= 0, got -1.0"),
        (dict(norm=(torch.ones(32, dtype=torch.float16), torch.zeros(32), 1e-5)), r"norm weight is torch.float16"),
        (
            dict(weight=torch.randn(64, 32), bias=None),
            r"with kv the weight holds q's heads, then K's and V's .* got weight \(64, 32\)",
        ),
        (
            dict(kv=(torch.zeros(2, 2, 8, 16), torch.zeros(2, 2, 9, 16), None)),
            r"caches must be \(B, H_kv, T_max, D\) alike",
        ),
        (
            dict(kv=(torch.zeros(2, 3, 8, 11), torch.zeros(2, 3, 8, 11), None)),
            r"the caches are \(B=2, H_kv, T_max >= 1, D\); got weight \(96, 32\) and caches \(2, 3, 8, 11\)",
        ),
        (dict(kv=(torch.zeros(3, 2, 8, 16), torch.zeros(3, 2, 8, 16), None)), r"caches are \(B=2, H_kv, T_max >= 1"),
        (dict(kv=(torch.zeros(2, 2, 8, 24), torch.zeros(2, 2, 8, 24), None)), r"got weight \(96, 32\) and caches"),
        (dict(rope=1.0), r"rope must be rotary's theta, a finite number above 1, got 1.0"),
        (
            dict(
                kv=(torch.zeros(2, 3, 8, 11), torch.zeros(2, 3, 8, 11), None),
                weight=torch.randn(99, 32),
                bias=None,
                rope=1e4,
            ),
            r"the head size must be even, got 11",
        ),
        (dict(activation="swiglu"), r"activation='swiglu' takes gate_up .* got weight \(96, 32\), a bias, a kv"),
        (
            dict(kv=(torch.zeros(2, 2, 8, 16), torch.zeros(2, 2, 8, 16), torch.zeros(2))),
            r"lengths must be a \(2,\) int32 or int64 tensor on cpu, got \(2,\) torch.float32",
        ),
        (
            dict(kv=(torch.zeros(2, 2, 8, 16), torch.zeros(2, 2, 8, 16), torch.zeros(3, dtype=torch.int32))),
            r"lengths must be a \(2,\) int32 or int64 tensor",
        ),
        (
            dict(kv=(torch.zeros(2, 2, 8, 16, dtype=torch.float16),) * 2 + (torch.zeros(2, dtype=torch.int32),)),
            r"k_cache is torch.float16 on cpu, but x is torch.float32 on cpu; they must match",
        ),
        (dict(config=TileConfig(block_m=32)), r"block_m must be 16 or unset \(got 32\)"),
        (dict(config=TileConfig(split_k=3)), r"decode_linear: split_k=3 is not allowed \(powers of two from 1 to 64"),
        (dict(config=TileConfig(block_n=8192)), r"decode_linear: block_n=8192 is not allowed"),
        (dict(config=TileConfig(block_n=8, block_k=64)), r"block_n=8 needs the prefetch form \(block_k >= 512\)"),
        (dict(config="fast"), r"config must be None, a TileConfig or 'autotune', got 'fast'"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_inputs_are_refused_with_the_reason(change, message):
    device = torch.device("cpu")  # the messages name the device; every refusal happens before a launch
    args = _bad(device, **change)
    kv = args.pop("kv")
    if kv[2] is None:
        kv = (*kv[:2], torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match=message):
        decode_linear(args.pop("x"), args.pop("weight"), kv=kv, **args)


@pytest.mark.parametrize(
    "cfg,message",
    [
        (TileConfig(block_n=256, block_k=256, num_stages=8), r"needs about \d+ bytes of shared memory"),
        (TileConfig(block_k=512, split_k=4), r"slices of 1024; use block_k >= 1024, a larger split_k, or block_k <= 2"),
        # Past a GPU's registers and past what the interpreter holds in one program alike.
        (TileConfig(block_n=512, block_k=4096), r"\(2097152 elements; at most (65536|1048576) fit registers\)"),
    ],
)
def test_tiles_past_the_kernels_limits_are_refused(cfg, message):
    x, w = torch.randn(1, 4096), torch.randn(256, 4096)  # K wide enough for each limit
    with pytest.raises(ValueError, match=message):
        decode_linear(x, w, config=cfg)


H200 = DeviceLimits("NVIDIA H200", 232448, 132, (9, 0), True, l2_bytes=50 * 1024 * 1024)
A10G = DeviceLimits("A10G", 101376, 80, (8, 6), True)


@pytest.mark.parametrize("limits", [H200, A10G], ids=lambda d: d.name)
@pytest.mark.parametrize("out_f,in_f", [(2304, 768), (768, 768), (3072, 768), (768, 3072), (50257, 768)])
def test_gpu_defaults_load_whole_slices_in_narrow_tiles(limits, out_f, in_f):
    cfg = fused.resolve_config(None, 1, out_f, in_f, torch.float16, limits)
    programs = cdiv(out_f, cfg.block_n) * fused.splits_of(cfg, in_f)[1]
    if out_f == 50257:  # the LM head has columns enough for every SM: wide tiles, no split, the K loop
        assert (cfg.block_n, cfg.block_k, cfg.split_k) == (128, 64, 1) and programs >= 2 * limits.num_sms
        assert not fused.prefetches(cfg)
        return
    # The prefetch form, GPT-2's slices unsplit (no arrival), in 8-column tiles: 96 programs or more.
    assert fused.prefetches(cfg) and cfg.block_n == 8 and fused.splits_of(cfg, in_f) == (in_f, 1)
    assert programs >= 96


def test_h200_defaults_are_the_sweeps_winners():
    # benchmarks/RESULTS.md: the fastest tile rule of a GPT-2-small decode step under PDL on an H200.
    winners = {
        (2304, 768): (8, 1024, 1, 8),
        (768, 768): (8, 1024, 1, 8),
        (768, 3072): (8, 4096, 1, 8),
        (50257, 768): (128, 64, 1, 4),
    }
    for (out_f, in_f), tiles in winners.items():
        cfg = fused.resolve_config(None, 1, out_f, in_f, torch.bfloat16, H200)
        assert (cfg.block_n, cfg.block_k, cfg.split_k, cfg.num_warps) == tiles, (out_f, in_f)


def test_cpu_defaults_are_few_large_programs():
    """The interpreter's cost is per program and per operation: one split and, for a single row, the prefetch
    form with the whole output in one program (its values are numpy arrays there, not registers)."""
    cpu = torch.device("cpu")
    resolve = lambda rows, out_f, in_f, dtype: fused.resolve_config(None, rows, out_f, in_f, dtype, cpu)
    for dtype in (torch.float32, torch.float16):
        for out_f, in_f, programs in (
            (768, 256, 1),
            (1024, 256, 1),
            (256, 256, 1),
            (4096, 256, 1),
            (256, 1024, 1),
            (2304, 768, 3),
        ):
            cfg = resolve(1, out_f, in_f, dtype)
            assert fused.prefetches(cfg) and cfg.split_k == 1, (out_f, in_f, cfg)
            # As wide as the interpreter's budget holds the whole K slice: 1024 columns of 768, one tile of 4096 x 256.
            assert cdiv(out_f, cfg.block_n) == programs, (out_f, in_f, cfg)
    # More rows take the K loop in 256-wide tiles, block_k as large as shared memory allows (64 in fp32, 128 in
    # fp16): it multiplies them in one tl.dot where the prefetch form takes them one at a time.
    for rows, out_f, in_f in ((4, 1024, 256), (16, 256, 1024)):
        for dtype, block_k in ((torch.float32, 64), (torch.float16, 128)):
            cfg = resolve(rows, out_f, in_f, dtype)
            assert (cfg.block_n, cfg.block_k, cfg.split_k) == (256, block_k, 1) and not fused.prefetches(cfg)


def _walk(rows, out_f, in_f, item, cfg, *, norm, heads):
    """Bytes each program of the grid loads and stores, walked in Python: (L2 reads, L2 writes)."""
    per_split, splits = fused.splits_of(cfg, in_f)
    reads = writes = 0
    for pid_n in range(cdiv(out_f, cfg.block_n)):
        for lo in range(0, in_f, per_split):
            width = min(lo + per_split, in_f) - lo
            reads += (rows + cfg.block_n) * width * item  # x rows masked, weight columns wrapped
            if norm:
                reads += rows * in_f * item + 2 * width * item  # statistics over whole rows, LN slice
            if splits > 1:
                writes += rows * min(cfg.block_n, out_f - pid_n * cfg.block_n) * 4 + SECTOR  # partial, atomic
                reads += SECTOR  # the atomic's old count
        cols = range(pid_n * cfg.block_n, min((pid_n + 1) * cfg.block_n, out_f))
        reads += splits * rows * len(cols) * 4 if splits > 1 else 0  # the last arriver's partial reads
        reads += len(cols) * item  # bias
        writes += rows * len(cols) * item + (SECTOR if splits > 1 else 0)  # y, the counter's reset
        if heads and cols[-1] >= in_f:
            reads += sectors(rows * 4)  # the positions
    if heads:
        writes += 2 * rows * heads * sectors(in_f // heads * item)
    return reads, writes


@pytest.mark.parametrize(
    "rows,out_f,in_f,cfg,norm,heads",
    [
        (1, 2304, 768, None, True, 12),
        (3, 2304, 768, TileConfig(block_n=128, block_k=64, split_k=4), True, 12),
        (16, 100, 200, TileConfig(block_n=64, block_k=32, split_k=4), False, None),
        (2, 3072, 768, TileConfig(split_k=1), True, None),
        (5, 600, 200, TileConfig(block_n=8, block_k=512, split_k=2), True, None),  # the prefetch form, split
    ],
)
def test_traffic_l2_level_matches_a_walk_over_the_grid(rows, out_f, in_f, cfg, norm, heads):
    t = fused.traffic(rows, out_f, in_f, 2, norm=norm, kv=heads, config=cfg, dtype=torch.bfloat16, device=H200)
    resolved = fused.resolve_config(cfg, rows, out_f, in_f, torch.bfloat16, H200)
    assert (t.bytes_read, t.bytes_written) == _walk(rows, out_f, in_f, 2, resolved, norm=norm, heads=heads)
    assert t.min_bytes <= t.hbm_bytes <= t.bytes


@pytest.mark.parametrize("rows", [1, 16])
def test_one_launch_saves_hbm_bytes_and_pays_for_the_norm_in_l2_reads(rows):
    """ln_1 -> c_attn -> cache write for GPT-2 tokens in split-K tiles on an H200, against layer_norm, linear's
    split-K pair and kv_write. HBM: the normalised rows, the reduce's reads of y and the cache write's reads
    are gone. SM requests: every program re-reads x's full rows for the statistics and every column tile its
    slice of the LN weight and bias, which is what the fused launch adds over the unfused ones, at most."""
    ln, lin, kv = kernels.ops.layer_norm, kernels.ops.linear, kernels.ops.kv_write
    cfg = TileConfig(block_m=16, block_n=32, block_k=128, split_k=2)  # the K loop, split as linear's pair
    args = dict(config=cfg, dtype=torch.bfloat16, device=H200)  # the same tiles for both
    fused_t = fused.traffic(rows, 2304, 768, 2, norm=True, kv=12, **args)
    unfused = (
        ln.traffic(rows, 768, 2, device=H200) + lin.traffic(rows, 2304, 768, 2, **args) + kv.traffic(rows, 12, 64, 2)
    )
    assert fused_t.hbm_bytes < unfused.hbm_bytes and fused_t.min_bytes < unfused.min_bytes
    tiles = cdiv(2304, cfg.block_n)
    programs = tiles * fused.splits_of(cfg, 768)[1]
    norm_reads = programs * rows * 768 * 2 + tiles * 2 * 768 * 2
    atomics = (2 * programs + tiles) * SECTOR  # each program's increment and old count, each tile's reset
    assert unfused.bytes < fused_t.bytes <= unfused.bytes + norm_reads + atomics


def test_a_tile_rule_holds_within_its_block_and_the_default_comes_back():
    """An experiment (overlap_sweep) compares tile rules through ruled_by, not by writing the modules' rules."""
    from kernels.ops.decode_attention import tiles as attn_tiles
    from kernels.ops.decode_linear import tiles as decode_tiles

    cpu = torch.device("cpu")
    before = decode_tiles.resolve_config(None, 1, 96, 64, torch.float32, cpu)
    rule = lambda rows, n, k, dtype, device: TileConfig(
        block_m=16, block_n=32, block_k=64, split_k=1, num_warps=4, num_stages=2
    )
    with decode_tiles.ruled_by(rule):
        assert decode_tiles.resolve_config(None, 1, 96, 64, torch.float32, cpu).block_n == 32 != before.block_n
    assert decode_tiles.resolve_config(None, 1, 96, 64, torch.float32, cpu) == before
    before = attn_tiles.resolve_decode_config(None, 12, 100, 64, torch.float32, cpu)
    with attn_tiles.ruled_by(lambda bh, n, device: TileConfig(block_n=16, split_k=2, num_warps=2, num_stages=1)):
        inside = attn_tiles.launch_plan(None, 12, 100, 64, torch.float32, cpu)[0]
        assert (inside.block_n, inside.split_k) == (16, 2) != (before.block_n, before.split_k)
    assert attn_tiles.resolve_decode_config(None, 12, 100, 64, torch.float32, cpu) == before


# --- The Llama forms (the decode rung of a Llama block): RMSNorm in the prologue, SwiGLU over a gate_up weight in the
# epilogue, and c_attn's epilogue turning q and k by rotary positions before it writes a grouped-query cache.

# (rows, in_features, features): one row, a few, a whole decode tile; widths that are not powers of two, (16, 300, 20)
# the widest.
LLAMA_SHAPES = [(1, 40, 17), (3, 96, 100), (16, 72, 24), (16, 300, 20)]


def _rms(x, weight, eps, dtype):
    """float64 RMSNorm, rounded to the input dtype as the kernel's dot operand is."""
    return reference.rms_norm(*f64(x, weight), eps).to(dtype).double()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,k,features", LLAMA_SHAPES)
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
