"""One table of tolerances for comparing a kernel's output with the float64 PyTorch reference."""

import pytest
import torch

# dtype: (atol, rtol). Each is a few units of the output's last place, since every kernel computes
# in fp32 and rounds once when it stores.
TOLERANCES = {
    # fp32 in, fp32 math: only the summation order differs from the reference (seen: under 1e-6).
    torch.float32: (1e-5, 1e-5),
    # One rounding to fp16 (2^-11 = 4.9e-4 relative) on the output, plus fp16 operands in the dot.
    torch.float16: (2e-3, 2e-3),
    # bf16 keeps 8 mantissa bits: 2^-8 = 3.9e-3 relative per rounding.
    torch.bfloat16: (2e-2, 2e-2),
}

# Loosenings, each with its reason. Key: (kernel, dtype).
LOOSER = {
    # Attention rounds the softmax probabilities to the input dtype before the P @ V product (as
    # every flash kernel does, to use the tensor cores): a second rounding on top of the output's.
    ("attention", torch.float16): (4e-3, 4e-3),
    ("attention", torch.bfloat16): (3e-2, 3e-2),
    # Matmuls on a GPU with fp32 inputs use fp32 FMA in a different order than the CPU reference over
    # K up to 768 terms: error grows like sqrt(K) ulps.
    ("linear", torch.float32): (1e-4, 1e-4),
    # Rotary forms each angle, position x frequency, in fp32 as transformers does: at position 1000 its
    # rounding (half an ulp of 1000, 3e-5 rad) shows in the output, against the float64 reference.
    ("rotary", torch.float32): (2e-4, 2e-4),
}

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


def float16_here(device: torch.device, dtype: torch.dtype, shape_is_marked: bool) -> None:
    """The interpreter's time: on CPU, a test of many shapes runs float16 on the shapes it marks and float32
    on all of them; a GPU runs every dtype on every shape."""
    if device.type == "cpu" and dtype == torch.float16 and not shape_is_marked:
        pytest.skip("float16 in the interpreter on this test's marked shapes only; every shape on a GPU")


def in_turn_here(device: torch.device, turn: int, choice: int, choices: int) -> None:
    """The interpreter's time: on CPU, a test that crosses each case with `choices` options (an epilogue, a split
    and a form, say) runs every case with one of them, the option numbered `turn` modulo `choices` (`turn`
    counts the cases, `choice` numbers this test's option), so that each option still meets many cases and
    every case runs; a GPU runs every case with every option."""
    if device.type == "cpu" and choice != turn % choices:
        pytest.skip("one option of this crossing per case in the interpreter, in turn; every option on a GPU")


def tolerance(kernel: str, dtype: torch.dtype) -> tuple[float, float]:
    return LOOSER.get((kernel, dtype), TOLERANCES[dtype])


def assert_close(kernel: str, actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """Compare on the CPU in float64; NaN anywhere in `actual` (an unwritten element) fails."""
    atol, rtol = tolerance(kernel, dtype)
    torch.testing.assert_close(actual.detach().cpu().double(), expected.detach().cpu().double(), atol=atol, rtol=rtol)


def f64(*tensors):
    """float64 CPU copies for the reference."""
    return [t.detach().cpu().double() if t.is_floating_point() else t.detach().cpu() for t in tensors]
