"""kernels.ops.decode_layer: one GPT-2 block in one launch, against PyTorch and against the decode rung's launches."""

import pytest
import torch

from kernels import arrival, decode_attention, decode_layer, decode_linear, reference
from tests.tolerances import DTYPES, assert_close

# (lengths before the step, T_max, heads, head_dim): one sequence and several, a new sequence (length 0),
# a cache filled to its last slot, widths 64 and 48 (not a power of two).
CASES = [([5], 9, 4, 16), ([0, 7, 16], 17, 3, 16), ([3, 1], 6, 2, 32)]
# In these an attention split is one key tile held whole (loaded around the stage barrier) on CPU; a cache longer
# than one key tile (128 keys of 64 dims in fp32 there) splits into a chunk of two, which loops over its keys after
# the barrier: a sequence of 130 keys runs both steps of the loop, one of none its first step only.
LOOPED = [([129, 0], 130, 2, 64)]


def _block(device, dtype, batch, width):
    def t(*shape, scale=1.0):
        return (torch.randn(*shape, device=device) * scale).to(dtype)

    ln = lambda: (1 + t(width, scale=0.1), t(width, scale=0.1))
    proj = lambda n, k: (t(n, k, scale=k**-0.5), t(n, scale=0.1))
    x = t(batch, 1, width)
    return x, ln(), proj(3 * width, width), proj(width, width), ln(), proj(4 * width, width), proj(width, 4 * width)


def _caches(device, dtype, batch, heads, t_max, head_dim, lengths):
    caches = torch.randn(2, batch, heads, t_max, head_dim, device=device).to(dtype)
    lens = torch.tensor(lengths, device=device, dtype=torch.int32)
    return caches, lens


def _five_launches(x, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj, k_cache, v_cache, lens, eps):
    """The decode rung's block (explorer.model.gpt.Block.decode_fused), kernel by kernel."""
    batch, _, width = x.shape
    heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    qkv = decode_linear(x, *c_attn, norm=(*ln_1, eps), kv=(k_cache, v_cache, lens))
    q = qkv[..., :width].view(batch, 1, heads, head_dim).transpose(1, 2)
    o = decode_attention(q, k_cache, v_cache, lens + 1, one_launch=True).transpose(1, 2).reshape(batch, 1, width)
    x1 = decode_linear(o, *c_proj, residual=x)
    h = decode_linear(x1, *c_fc, activation="gelu", norm=(*ln_2, eps))
    return decode_linear(h, *mlp_proj, residual=x1)


def _reference(x, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj, k_cache, v_cache, lens, eps):
    """The same block in float64 PyTorch, writing the new K and V rows into the (float64) caches given."""
    batch, _, width = x.shape
    heads, head_dim = k_cache.shape[1], k_cache.shape[3]
    qkv = reference.linear(reference.layer_norm(x, *ln_1, eps), *c_attn)
    q, k, v = (t.view(batch, heads, 1, head_dim) for t in qkv.split(width, dim=-1))
    reference.kv_write(k, v, k_cache, v_cache, lens)
    o = reference.decode_attention(q, k_cache, v_cache, lens + 1).reshape(batch, 1, width)
    x1 = reference.linear(o, *c_proj, residual=x)
    h = reference.linear(reference.layer_norm(x1, *ln_2, eps), *c_fc, activation="gelu")
    return reference.linear(h, *mlp_proj, residual=x1)


def _f64(block):
    return [tuple(t.double().cpu() for t in p) if isinstance(p, tuple) else p.double().cpu() for p in block]


@pytest.mark.parametrize("lengths,t_max,heads,head_dim", CASES + LOOPED)
def test_a_block_in_one_launch_matches_float64_pytorch(device, lengths, t_max, heads, head_dim):
    batch, width = len(lengths), heads * head_dim
    block = _block(device, torch.float32, batch, width)
    caches, lens = _caches(device, torch.float32, batch, heads, t_max, head_dim, lengths)
    expected_caches = caches.double().cpu()
    want = _reference(*_f64(block), expected_caches[0], expected_caches[1], lens.cpu().long(), 1e-5)

    got = decode_layer(*block, (caches[0], caches[1], lens, lens + 1), eps=1e-5)

    # Five stages, each an fp32 sum in another order than the reference's: the looser linear tolerance.
    assert_close("linear", got, want, torch.float32)
    assert_close("linear", caches, expected_caches, torch.float32)
    assert (arrival.stage_counters(device, 5) == 0).all() and (arrival.counters(device, 1) == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths,t_max,heads,head_dim", CASES)
def test_a_block_in_one_launch_matches_the_decode_rungs_five(device, dtype, lengths, t_max, heads, head_dim):
    batch, width = len(lengths), heads * head_dim
    block = _block(device, dtype, batch, width)
    caches, lens = _caches(device, dtype, batch, heads, t_max, head_dim, lengths)
    theirs = caches.clone()
    want = _five_launches(*block, theirs[0], theirs[1], lens, 1e-5)

    got = decode_layer(*block, (caches[0], caches[1], lens, lens + 1), eps=1e-5)
    again = decode_layer(*block, (caches.clone()[0], caches.clone()[1], lens, lens + 1), eps=1e-5)

    # The same arithmetic at other tiles: the fp32 sums in another order, each stage rounding as the
    # five launches round (attention's tolerance: its probabilities are rounded as well).
    assert_close("attention", got, want, dtype)
    assert_close("attention", caches, theirs, dtype)
    assert torch.equal(got, again)  # a second launch finds its counters at zero and repeats bit for bit


def test_bad_blocks_are_refused_with_the_reason(device):
    lengths, t_max, heads, head_dim = [2], 5, 2, 16
    block = list(_block(device, torch.float32, 1, heads * head_dim))
    caches, lens = _caches(device, torch.float32, 1, heads, t_max, head_dim, lengths)
    kv = (caches[0], caches[1], lens, lens + 1)
    w, b = block[5]
    block[5] = (w[:-1], b[:-1])  # c_fc one column short
    with pytest.raises(ValueError, match=r"mlp.c_fc must have weight \(128, 32\)"):
        decode_layer(*block, kv)
    block = list(_block(device, torch.float32, 17, heads * head_dim))
    caches, lens = _caches(device, torch.float32, 17, heads, t_max, head_dim, [0] * 17)
    with pytest.raises(ValueError, match="at most 16 sequences per launch, got 17"):
        decode_layer(*block, (caches[0], caches[1], lens, lens + 1))


@pytest.mark.parametrize("sms", [132, 108, 40])
@pytest.mark.parametrize("rows,width,heads,max_len", [(1, 768, 12, 1001), (16, 768, 12, 64), (4, 1024, 16, 2048)])
def test_a_gpu_launch_fits_one_program_per_sm_with_about_one_item_each(sms, rows, width, heads, max_len):
    from kernels.config import DeviceLimits
    from kernels.ops.decode_layer.kernel import ELEMENTS, plan

    limits = DeviceLimits("GPU", 232448, sms, (9, 0), True)
    p = plan(rows, width, heads, max_len, torch.bfloat16, limits)
    assert 1 <= p["programs"] <= sms  # every program resident at once: the stages wait for each other
    shapes = {
        "BN_A": (3 * width, width),
        "BN_O": (width, width),
        "BN_F": (4 * width, width),
        "BN_P": (width, 4 * width),
    }
    for name, (out_f, in_f) in shapes.items():
        block_n = p["tiles"][name]
        assert block_n * in_f <= ELEMENTS or block_n == 8  # a tile's weights fit registers
        assert (
            -(-out_f // block_n) <= p["programs"] or block_n * 2 * in_f > ELEMENTS
        )  # one item each, or as wide as fits
    assert rows * heads * p["splits"] <= max(p["programs"], rows * heads)
    # An attention split is one key tile, held whole (its old rows loaded before the stage barrier), where
    # that tile fits the program's registers: 128 keys of 64 dims in 8 warps.
    c = p["constexprs"]
    held = p["chunk"] <= c["BLOCK_N"] and c["BLOCK_N"] * c["BLOCK_D"] <= 1024 * 8
    assert c["ATT_PREFETCH"] == held
    if max_len <= 128 * p["splits"] and width // heads == 64:
        assert c["ATT_PREFETCH"]


def test_stamps_are_refused_off_the_gpu_and_in_the_wrong_shape(device):
    lengths, t_max, heads, head_dim = [2], 5, 2, 16
    block = _block(device, torch.float32, 1, heads * head_dim)
    caches, lens = _caches(device, torch.float32, 1, heads, t_max, head_dim, lengths)
    kv = (caches[0], caches[1], lens, lens + 1)
    with pytest.raises(ValueError, match=r"stamps must be an int64 \(\d+, 8\) tensor on the GPU"):
        decode_layer(*block, kv, stamps=torch.zeros(1, 7, dtype=torch.int64, device=device))


def test_the_cases_cover_both_forms_of_attention_item_in_the_interpreter(device):
    from kernels.ops.decode_layer.kernel import plan

    if device.type == "cuda":
        pytest.skip("CPU behaviour")
    held = lambda lengths, t_max, heads, head_dim: plan(
        len(lengths), heads * head_dim, heads, t_max, torch.float32, device
    )["constexprs"]["ATT_PREFETCH"]
    assert all(held(*case) for case in CASES) and not any(held(*case) for case in LOOPED)


def test_the_interpreter_runs_one_program(device):
    from kernels.ops.decode_layer.kernel import plan

    if device.type == "cuda":
        pytest.skip("CPU behaviour")
    assert plan(3, 64, 4, 9, torch.float32, device)["programs"] == 1  # programs run one after another there


def test_a_variant_holds_within_its_block_and_the_defaults_come_back():
    """experiments/one_launch_sweep.py compares launches through kernels.ops.decode_layer.kernel.varied, not by
    writing the module's settings: narrower column tiles (two items a program), 64-key attention tiles, no PDL."""
    from kernels.config import DeviceLimits
    from kernels.ops.decode_layer.kernel import Variant, plan, varied

    limits = DeviceLimits("GPU", 232448, 132, (9, 0), True)
    before = plan(1, 768, 12, 1024, torch.bfloat16, limits)
    with varied(Variant(pdl=False, attention_tile=64, items_per_program=2)):
        inside = plan(1, 768, 12, 1024, torch.bfloat16, limits)
    assert plan(1, 768, 12, 1024, torch.bfloat16, limits) == before
    assert inside["attention"].block_n == 64 < before["attention"].block_n
    assert all(inside["tiles"][k] <= before["tiles"][k] for k in before["tiles"]) and inside["tiles"] != before["tiles"]
    assert not inside["constexprs"]["PDL"]
