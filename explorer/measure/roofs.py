"""The roofline's numbers that every chart and lesson shares, without torch: what a peak rate is the peak of,
and the ridge."""

# What a matrix product's peak rate is the peak of, by its dtype: bf16 and fp16 products run on the tensor cores;
# fp32 ones on the CUDA cores, since PyTorch leaves TF32 off for them (torch.backends.cuda.matmul.allow_tf32).
ROOFS = {
    "bfloat16": "bf16 on tensor cores",
    "float16": "fp16 on tensor cores",
    "float32": "fp32 on CUDA cores, no tensor cores",
}


def ridge(tflops: float, bandwidth_gbs: float) -> float:
    """The roofline's ridge in FLOP per byte: the arithmetic intensity from which a kernel at the peak rate
    `tflops` is no longer held back by `bandwidth_gbs`. The one place it is computed (roofline, lessons)."""
    return tflops * 1e3 / bandwidth_gbs
