"""The GPU the traffic walks model: an H200's limits, its L2 as the models take it, and its dtype."""

import torch

from kernels.config import DeviceLimits

H200 = DeviceLimits("NVIDIA H200", 232448, 132, (9, 0), True, l2_bytes=50 * 1024 * 1024)
BF16 = torch.bfloat16
