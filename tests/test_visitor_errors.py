"""What a visitor sees when something goes wrong off the default path: tiles that cannot fit refused in the page's
words with the largest value that fits, a failed run said in the status line over the last good run's panels, the
table a job just made offered first for export, the CUDA graph box on a CPU."""

import pytest
import torch

from explorer.app import jobs, settings
from explorer.app.errors import UserError
from kernels import TileConfig
from kernels.config import CPU_SHARED_MEMORY

NEVER = jobs.Control(lambda: False, float("inf"))
ITEMSIZE = {"float32": 4, "float16": 2}


def largest_fitting(choices, need) -> int:
    """The reference: the largest choice whose shared memory `need(choice)` fits the interpreter's limit."""
    return max(c for c in choices if need(c) <= CPU_SHARED_MEMORY)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's documented shared memory")
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_decode_tiles_that_cannot_fit_name_the_controls_and_the_largest_value_that_fits(dtype):
    # The decode-shaped matmul's K loop holds one 16-row x tile and one block_k x block_n weight tile (one stage on
    # CPU): (16 + block_n) * block_k elements.
    size = ITEMSIZE[dtype]
    choices = settings.TILE_CHOICES["linear_decode"]
    block_k = largest_fitting(choices["block_k"], lambda k: (16 + 256) * k * size)
    block_n = largest_fitting(choices["block_n"], lambda n: (16 + n) * 256 * size)
    tiles = settings.Tiles(linear_decode=TileConfig(block_n=256, block_k=256))
    s = settings.RunSettings(new_tokens=2, dtype=dtype, tiles=tiles)
    with pytest.raises(UserError) as refused:
        list(jobs.JOBS["generate"]({"settings": s}, NEVER))
    message = str(refused.value)
    assert message.startswith("Tiles, linear decode: block_n 256 and block_k 256 need about ")
    assert f"{(16 + 256) * 256 * size // 1024} KiB of shared memory" in message
    assert f"The largest block_n that fits with block_k 256 is {block_n}" in message
    assert f"the largest block_k that fits with block_n 256 is {block_k}" in message
    assert "TileConfig" not in message and "linear:" not in message, "the kernel's own names are not the page's"
    # The values it names do run.
    for fits in (TileConfig(block_n=256, block_k=block_k), TileConfig(block_n=block_n, block_k=256)):
        s = settings.RunSettings(new_tokens=1, dtype=dtype, tiles=settings.Tiles(linear_decode=fits))
        assert list(jobs.JOBS["generate"]({"settings": s}, NEVER))[-1]["state"]["steps"] is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's documented shared memory")
def test_attention_tiles_that_cannot_fit_name_one_field_when_one_was_chosen():
    # Decode attention holds block_n keys and values of head_dim (the bundled model's 64) in fp32, and a 16-row tile
    # of probabilities on its way to the product with V.
    head_dim = 64
    need = lambda n: (2 * n * head_dim + 16 * n) * 4  # noqa: E731
    block_n = largest_fitting(settings.TILE_CHOICES["decode_attention"]["block_n"], need)
    tiles = settings.Tiles(decode_attention=TileConfig(block_n=256))
    s = settings.RunSettings(new_tokens=2, dtype="float32", tiles=tiles)
    refusal = rf"^Tiles, decode attention: block_n 256 needs about {need(256) // 1024} KiB .* fits is {block_n}, or"
    with pytest.raises(UserError, match=refusal):
        list(jobs.JOBS["generate"]({"settings": s}, NEVER))
