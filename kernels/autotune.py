"""A small autotuner: time a handful of candidate tiles once per shape, keep the fastest.

Launchers call `pick` when given config="autotune". On a GPU each candidate runs under
triton.testing.do_bench (median after warm-up) and candidates the device cannot run are skipped; the
winner is cached per (kernel, shape, dtype, device) for the life of the process. In the CPU
interpreter timings say nothing about a GPU, so the defaults are used instead.
"""

from collections.abc import Callable

import torch

from .config import TileConfig

CANDIDATES = {
    "layer_norm": [TileConfig(block_m=m, num_warps=w) for m in (1, 2, 4, 8) for w in (2, 4, 8)],
    "linear": [
        TileConfig(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=s)
        for (m, n, k, w, s) in [
            (128, 128, 64, 8, 3),
            (128, 256, 64, 8, 3),
            (64, 128, 64, 4, 4),
            (128, 64, 64, 4, 4),
            (64, 64, 64, 4, 4),
            (128, 128, 32, 4, 4),
        ]
    ],  # fmt: skip
    "linear_decode": [
        TileConfig(block_m=16, block_n=n, block_k=k, split_k=s, num_warps=4, num_stages=st)
        for n in (32, 64, 128)
        for k in (64, 128)
        for s in (1, 2, 4, 8)
        for st in (3, 4)
    ],  # fmt: skip
    "attention": [
        TileConfig(block_m=m, block_n=n, num_warps=w, num_stages=s)
        for (m, n, w, s) in [(128, 64, 4, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 32, 4, 4)]
    ],
    "decode_attention": [
        TileConfig(block_n=n, split_k=s, num_warps=w, num_stages=2)
        for n in (32, 64, 128)
        for s in (8, 16, 32, 64)
        for w in (2, 4)
    ],  # fmt: skip
}

_best: dict[tuple, TileConfig | None] = {}


def pick(kind: str, key: tuple, run: Callable[[TileConfig], object], device: torch.device) -> TileConfig | None:
    """The fastest candidate for `key`, or None (the defaults) on CPU."""
    if device.type != "cuda":
        return None
    key = (kind, *key, str(device))
    if key not in _best:
        from triton.testing import do_bench

        timings = []
        for cfg in CANDIDATES[kind]:
            try:
                timings.append((do_bench(lambda c=cfg: run(c), warmup=5, rep=25, return_mode="median"), cfg))
            except ValueError:
                continue  # does not fit this device
        _best[key] = min(timings, key=lambda t: t[0])[1] if timings else None
    return _best[key]
