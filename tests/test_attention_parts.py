"""experiments/attention_parts.py times a stripped-down copy of the one-launch decode attention kernel in parts; its
whole form must still be decode attention, or the parts it times are parts of something else."""

import pytest
import torch
import torch.nn.functional as F

from experiments import attention_parts as parts
from tests.tolerances import DTYPES, assert_close


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "keys, tiles",
    [
        (1, dict(chunk=32, tile=32, warps=1)),
        (17, dict(chunk=16, tile=16, warps=1)),  # two splits, the second one key short of full
        (127, dict(chunk=64, tile=32, warps=2, early_v=True)),  # a loop of two tiles per split, V loaded with K
        (300, dict(chunk=128, tile=128, warps=2, load_length=False)),  # the length passed as an argument
    ],
)
def test_whole_form_is_decode_attention(keys, tiles, dtype, device):
    heads, d = 3, 64
    q, k, v = (torch.randn(1, heads, n, d, device=device, dtype=dtype) for n in (1, keys, keys))
    lengths = torch.tensor([keys], device=device, dtype=torch.int32)
    part = torch.full((heads * 64 * (d + 2),), float("nan"), device=device)
    counters = torch.zeros(heads, device=device, dtype=torch.int32)
    out = parts.attend(q, k, v, lengths, part, counters, **tiles)
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert_close("decode_attention", out, expected, dtype)
    assert counters.tolist() == [0] * heads  # the last arrival of each head set its counter back
