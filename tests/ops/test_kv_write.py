"""The decode step's cache write against PyTorch's indexed assignment: a copy, so exact."""

import pytest
import torch

import kernels.ops.kv_write.kernel as kv_write_mod
from kernels import kv_write, reference
from kernels.config import SECTOR
from tests.tolerances import DTYPES


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lengths,max_len,heads,head_dim",
    [([0], 1, 1, 1), ([16, 0, 5], 17, 3, 64), ([126, 1], 127, 12, 96), ([999, 500, 0, 17], 1000, 2, 17)],
)
def test_kv_write_stores_each_row_at_its_own_position_and_nothing_else(
    device, dtype, lengths, max_len, heads, head_dim
):
    batch = len(lengths)
    # k and v as the decoder passes them: strided views of one (B, 1, 3, H, D) projection output.
    qkv = torch.randn(batch, 1, 3, heads, head_dim, device=device, dtype=dtype)
    k, v = qkv[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)  # (B, H, 1, D), not contiguous
    caches = torch.randn(2, batch, heads, max_len, head_dim, device=device, dtype=dtype)
    k_cache, v_cache = caches[0], caches[1]
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    lens = torch.tensor(lengths, device=device, dtype=torch.int32)
    reference.kv_write(k, v, expected_k, expected_v, lens)
    kv_write(k, v, k_cache, v_cache, lens)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    for b, n in enumerate(lengths):
        assert torch.equal(k_cache[b, :, n], k[b, :, 0]) and torch.equal(v_cache[b, :, n], v[b, :, 0])


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(k=(2, 3, 2, 8)), "k and v must be \\(B, H, 1, D\\) alike"),
        (dict(k_cache=(2, 4, 10, 8)), "caches must be \\(B=2, H=3, T_max, D=8\\) alike"),
        (dict(k_cache=(2, 3, 10, 4), v_cache=(2, 3, 10, 4)), "cache head dimension 4 does not match k's 8"),
        (dict(lengths=(3,)), "lengths must be a \\(2,\\) int32 or int64 tensor"),
    ],
)
def test_kv_write_refuses_mismatched_shapes_with_the_reason(device, change, message):
    shapes = dict(k=(2, 3, 1, 8), v=(2, 3, 1, 8), k_cache=(2, 3, 10, 8), v_cache=(2, 3, 10, 8), lengths=(2,))
    shapes.update(change)
    if change.get("k"):
        shapes["v"] = change["k"]
    t = {name: torch.zeros(shape, device=device) for name, shape in shapes.items() if name != "lengths"}
    lengths = torch.zeros(shapes["lengths"], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=message):
        kv_write(t["k"], t["v"], t["k_cache"], t["v_cache"], lengths)


@pytest.mark.gpu
def test_kv_write_addresses_caches_past_2_to_the_31_elements():
    # (3, 1, 20M, 64) fp16: sequence 2 starts at element 2.56e9, past what an int32 offset can hold;
    # with 32-bit program ids its rows were written nowhere near their place. 2 x 7.7 GB on the GPU.
    batch, heads, t_max, head_dim = 3, 1, 20_000_000, 64
    device = torch.device("cuda")
    k_cache = torch.zeros(batch, heads, t_max, head_dim, device=device, dtype=torch.float16)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(batch, heads, 1, head_dim, device=device, dtype=torch.float16)
    v = torch.randn_like(k)
    positions = [t_max - 1, t_max - 2, t_max - 3]
    kv_write(k, v, k_cache, v_cache, torch.tensor(positions, device=device, dtype=torch.int32))
    for b, pos in enumerate(positions):
        assert torch.equal(k_cache[b, :, pos], k[b, :, 0]) and torch.equal(v_cache[b, :, pos], v[b, :, 0])
    # Nothing landed anywhere else: the only rows holding a nonzero are the three written ones.
    expected = torch.tensor([[b, 0, pos] for b, pos in enumerate(positions)], device=device)
    for cache in (k_cache, v_cache):
        assert torch.equal(torch.nonzero(cache.any(dim=-1)), expected)


# --- Requests between L2 and the SMs, against a walk over the kernel's program grid.


def test_kv_write_moves_whole_sectors_per_row():
    t = kv_write_mod.traffic(2, 3, 17, 2)  # a 34-byte row spans two sectors
    assert t.bytes_read == 6 * (2 * 64 + SECTOR) and t.bytes_written == 6 * 2 * 64
    assert t.hbm_written == 6 * 2 * 34 and t.min_bytes == 6 * 4 * 34
