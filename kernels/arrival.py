"""Arrival counters: how the programs of one launch agree which of them finishes a shared job.

A split-K launch divides one output tile's reduction among several programs. Instead of a second
kernel that adds their partial results, each program stores its partial, then increments the tile's
counter; the program that sees the count reach the number of splits is the last to arrive. It reads
every partial in split order (so the sum is the same whatever order the programs ran in), applies
the epilogue, stores the result and sets the counter back to 0 for the next launch.

The counters are one zeroed int32 buffer per device, allocated once (outside any CUDA graph capture:
the decoder runs every step eagerly before capturing it) and shared by every launch that uses them.
That is safe because launches on one stream run one after another and each leaves its slots at 0.
"""

from __future__ import annotations

import torch

SLOTS = 1 << 16  # more than any launch needs: one per output tile or (sequence, head)

_buffers: dict[torch.device, torch.Tensor] = {}


def counters(device: torch.device, needed: int) -> torch.Tensor:
    """The device's zeroed arrival counters (at least `needed` of them)."""
    return _zeroed(_buffers, device, needed, SLOTS, "arrival")


STAGE_SLOTS = 64
_stages: dict[torch.device, torch.Tensor] = {}


def stage_counters(device: torch.device, stages: int) -> torch.Tensor:
    """The device's zeroed stage counters (kernels.barrier), apart from the arrival counters: a launch that
    waits at stage counters may also use arrival counters (decode attention's, inside kernels.ops.decode_layer)."""
    return _zeroed(_stages, device, stages, STAGE_SLOTS, "stage")


def _zeroed(buffers: dict, device, needed: int, slots: int, kind: str) -> torch.Tensor:
    """buffers' zeroed int32 buffer of `slots` counters for device, made on first use."""
    if needed > slots:
        raise ValueError(f"a launch needs {needed} {kind} counters, more than the {slots} kept per device")
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # "cuda" and "cuda:0" are one GPU, with one buffer
        device = torch.device("cuda", torch.cuda.current_device())
    buf = buffers.get(device)
    if buf is None:
        # A plain tensor even when first asked for inside inference mode (a model's decode is): the host zeroes
        # it outside (decode_step.check, a test), which an inference tensor refuses.
        with torch.inference_mode(False):
            buf = buffers[device] = torch.zeros(slots, dtype=torch.int32, device=device)
    return buf


TASK_SLOTS = 1024  # a decode step's stage counters: 2 + 4 per layer (kernels.ops.decode_step)
HEAD_SLOTS = 1 << 14  # and one per (layer, head)
_tasks: dict[torch.device, torch.Tensor] = {}
_heads: dict[torch.device, torch.Tensor] = {}


def task_counters(device: torch.device, needed: int) -> torch.Tensor:
    """The device's zeroed counters of the one-launch decode step's operations, apart from the others."""
    return _zeroed(_tasks, device, needed, TASK_SLOTS, "task")


def head_counters(device: torch.device, needed: int) -> torch.Tensor:
    """The device's zeroed counters of the one-launch decode step's (layer, head) pairs."""
    return _zeroed(_heads, device, needed, HEAD_SLOTS, "head")


_statuses: dict[torch.device, torch.Tensor] = {}


def status_word(device: torch.device) -> torch.Tensor:
    """The device's status word (one int32, 0 while nothing went wrong) that a launch's bounded waits report to
    (kernels.barrier.wait_count), apart from every counter."""
    return _zeroed(_statuses, device, 1, 1, "status")
