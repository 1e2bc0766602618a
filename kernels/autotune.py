"""A small autotuner: time a handful of candidate tiles once per shape, keep the fastest.

Launchers call `pick` when given config="autotune". On a GPU each candidate is timed with the project's
one method (kernels.timing.device_time: CUDA-graph replays, so launch overhead does not rank the tiles).
Given the inputs, pick times every candidate over random copies of them rotated past L2, the regime a
decode step runs in; without them it can only replay the caller's own tensors, and the choice is labelled
so (timing.SAME_INPUTS_REGIME). Candidates the device cannot run are skipped; the winner is cached per
(kernel, shape, dtype, device) for the life of the process. In the CPU interpreter timings say nothing
about a GPU, so the defaults are used instead.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch

from . import timing
from .config import TileConfig


class Choice(NamedTuple):
    config: TileConfig | None  # None: no candidate ran, the launcher's defaults
    timing: timing.Timing | None  # the winner's, with the regime it was timed in


class Tuner:
    """The picks, kept per (kernel, shape, dtype, device) for the life of the tuner, and how it times them:
    `time` is timing.device_time's signature (a test hands in a clock of its own), `l2_bytes` the L2 the
    inputs are rotated past (None: the device's)."""

    def __init__(self, time: Callable[..., timing.Timing] = timing.device_time, l2_bytes: int | None = None):
        self.best: dict[tuple, Choice] = {}
        self.time, self.l2_bytes = time, l2_bytes

    def pick(
        self, kind: str, key: tuple, run: Callable[..., object], device: torch.device, *, inputs: tuple | None = None
    ) -> TileConfig | None:
        """The fastest candidate for `key`, or None (the defaults) on CPU.

        Without `inputs`, run(cfg) is timed on the tensors it closes over. With them, run(cfg, *inputs) is
        timed over random copies of `inputs` (same shapes, strides and dtypes; see timing.random_like) rotated
        past L2, and the caller's tensors are never touched.
        """
        if device.type != "cuda":
            return None
        key = (kind, *key, str(device))
        if key in self.best:
            return self.best[key].config
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            return None  # nothing can be timed inside someone else's capture: the defaults, and nothing cached
        from triton.runtime.errors import OutOfResources

        sets = None
        if inputs is not None:
            sets = timing.rotated_inputs(lambda: timing.random_like(inputs), l2_bytes=self.l2_bytes)
        timed = []
        from .operations import CANDIDATES  # each operation's own (it imports the launchers, which import this)

        for cfg in CANDIDATES[kind]:
            fn = (lambda c=cfg: run(c)) if inputs is None else (lambda *args, c=cfg: run(c, *args))
            try:
                timed.append((self.time(fn, sets, samples=10), cfg))
            except (ValueError, OutOfResources, timing.CaptureError):
                continue  # does not fit this device, or cannot be captured: not a candidate here
        best = min(timed, key=lambda t: t[0].ms, default=None)
        self.best[key] = Choice(best[1], best[0]) if best else Choice(None, None)
        return self.best[key].config

    def choice(self, kind: str, key: tuple, device: torch.device) -> Choice | None:
        """What pick chose for this key, with the winner's timing and regime; None if it was never asked."""
        return self.best.get((kind, *key, str(device)))


TUNER = Tuner()  # the launchers' (config="autotune")


def pick(
    kind: str, key: tuple, run: Callable[..., object], device: torch.device, *, inputs: tuple | None = None
) -> TileConfig | None:
    """TUNER.pick: the process's fastest candidate for `key`, or None (the defaults) on CPU."""
    return TUNER.pick(kind, key, run, device, inputs=inputs)


def choice(kind: str, key: tuple, device: torch.device) -> Choice | None:
    """TUNER.choice: what the process's pick chose for this key; None if it was never asked."""
    return TUNER.choice(kind, key, device)
