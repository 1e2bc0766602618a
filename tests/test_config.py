import pytest
import torch
from triton.runtime.errors import OutOfResources

from kernels import TileConfig, attention, decode_attention, layer_norm, linear
from kernels.config import CPU_SHARED_MEMORY, GPUS, device_limits, explain_resources, supported_dtypes


def test_config_fields_merge_over_defaults():
    cfg = TileConfig(block_m=32).merged(TileConfig(block_m=128, block_n=64, num_warps=4))
    assert cfg == TileConfig(block_m=32, block_n=64, num_warps=4)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda x, w: attention(x, x, x, config=TileConfig(block_m=48)),
            r"attention: block_m=48 is not allowed \(powers of two from 16 to 256",
        ),
        (lambda x, w: attention(x, x, x, config=TileConfig(block_n=8)), r"attention: block_n=8 is not allowed"),
        (
            lambda x, w: attention(x, x, x, config=TileConfig(num_stages=0)),
            r"num_stages=0 is outside the allowed range 1..8",
        ),
        (lambda x, w: attention(x, x, x, config=TileConfig(num_warps=3)), r"num_warps=3 is not allowed"),
        (
            lambda x, w: attention(x, x, x, config="fast"),
            r"config must be None, a TileConfig or 'autotune', got 'fast'",
        ),
        (lambda x, w: linear(x[0, 0], w, config=TileConfig(block_k=512)), r"linear: block_k=512 is not allowed"),
        (lambda x, w: linear(x[0, 0], w, config=TileConfig(group_m=2.5)), r"linear: group_m=2.5 must be an integer"),
        (
            lambda x, w: layer_norm(x, w[0], w[0], config=TileConfig(block_n=32)),
            r"block_n=32 is smaller than the row width 64",
        ),
        (lambda x, w: layer_norm(x, w[0], w[0], config=TileConfig(block_m=64, block_n=2048)), r"65536"),
    ],
)
def test_impossible_configs_raise_before_launch(device, call, message):
    x = torch.randn(1, 2, 32, 64, device=device)
    w = torch.randn(16, 64, device=device)
    with pytest.raises(ValueError, match=message):
        call(x, w)


def test_shared_memory_limit_names_the_device_and_bytes(device):
    x = torch.randn(1, 2, 32, 64, device=device, dtype=torch.float16)
    cfg = TileConfig(block_m=256, block_n=256, num_stages=8)
    limit = device_limits(device).shared_memory
    with pytest.raises(ValueError, match=rf"needs about \d+ bytes of shared memory .* more than the {limit} bytes"):
        attention(x, x, x, config=cfg)
    with pytest.raises(ValueError, match="shared memory"):
        decode_attention(
            x[:, :, :1], x, x, torch.tensor([32], device=device), config=TileConfig(block_n=1024, num_stages=8)
        )
    with pytest.raises(ValueError, match="shared memory"):
        linear(x[0, 0], x[0, 0], config=TileConfig(block_m=256, block_n=256, block_k=256, num_stages=8))


def test_cpu_limits_are_the_documented_default():
    limits = device_limits("cpu")
    assert limits.shared_memory == CPU_SHARED_MEMORY == 101376
    assert supported_dtypes("cpu") == [torch.float32, torch.float16]


def test_bf16_is_refused_where_not_supported():
    if torch.bfloat16 in supported_dtypes("cpu"):
        pytest.fail("the interpreter must not offer bf16")
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"dtype torch.bfloat16 is not supported on cpu \(allowed: float32, float16\)"):
        layer_norm(x, x[0], x[0])


def test_out_of_resources_becomes_value_error():
    cfg = TileConfig(block_m=256)
    with pytest.raises(
        ValueError,
        match=r"attention: TileConfig\(block_m=256\) needs 300000 of shared memory but the device allows 232448",
    ):
        with explain_resources("attention", cfg):
            raise OutOfResources(300000, 232448, "shared memory")


def test_autotune_on_cpu_uses_defaults(device):
    if device.type != "cpu":
        pytest.skip("CPU behaviour")
    x = torch.randn(3, 64)
    w, b = torch.randn(64), torch.randn(64)
    torch.testing.assert_close(layer_norm(x, w, b, config="autotune"), layer_norm(x, w, b))


@pytest.mark.gpu
def test_autotune_picks_a_working_config(device):
    from kernels import reference

    q = torch.randn(1, 2, 100, 64, device=device, dtype=torch.float16)
    o = attention(q, q, q, config="autotune")
    torch.testing.assert_close(o, reference.attention(q, q, q), atol=4e-3, rtol=4e-3)
    x = torch.randn(2, 768, device=device, dtype=torch.float16)
    w = torch.randn(3072, 768, device=device, dtype=torch.float16) / 30
    torch.testing.assert_close(linear(x, w, config="autotune"), reference.linear(x, w), atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("gpu", list(GPUS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_default_tiles_are_valid_on_every_space_gpu(gpu, dtype):
    """The defaults a GPU picks pass the same validation a user's choice does, for GPT-2 shapes from
    one decode row to long prompts (resolved with that GPU's limits, no GPU needed)."""
    from kernels.ops.attention.kernel import resolve_config
    from kernels.ops.decode_attention.kernel import resolve_decode_config
    from kernels.ops.layer_norm.kernel import resolve_config as ln_resolve
    from kernels.ops.linear.kernel import resolve_config as lin_resolve

    limits = GPUS[gpu]
    for rows in (1, 5, 16, 17, 1000, 8192):
        for out_f, in_f in ((2304, 768), (3072, 768), (768, 3072), (50257, 768), (96, 200)):
            lin_resolve(None, rows, out_f, in_f, dtype, limits)
        ln_resolve(None, rows, 768, limits)
    for tq in (1, 17, 1000, 4096):
        for head_dim in (64, 40, 128):
            resolve_config(None, tq, head_dim, dtype, limits)
    for batch_heads, max_len in ((12, 1024), (96, 8192), (1, 17), (400, 64)):
        resolve_decode_config(None, batch_heads, max_len, 64, dtype, limits)


@pytest.mark.parametrize("poison", [False, True])
def test_new_outputs_are_contiguous_on_their_model_tensors_device(device, poison):
    import kernels.config

    like = torch.randn(3, 5, 7, device=device, dtype=torch.float16).transpose(0, 2)  # not contiguous
    with kernels.config.poisoned_outputs(poison):
        made = (
            (kernels.config.new_output(like), (7, 5, 3), torch.float16),
            (kernels.config.new_output(like, dtype=torch.float32), (7, 5, 3), torch.float32),
            (kernels.config.new_output(like, (2, 9)), (2, 9), torch.float16),
            (kernels.config.new_output(like, (4,), torch.float32), (4,), torch.float32),
        )
    for out, shape, dtype in made:
        assert out.shape == shape and out.dtype == dtype and out.device == like.device and out.is_contiguous()
        assert not poison or out.isnan().all()  # unpoisoned memory may hold anything, NaN included
