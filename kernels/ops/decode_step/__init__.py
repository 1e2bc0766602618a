"""A whole decode step in one launch: the megakernel rung's kernel, its plan and its host-side check."""

from .kernel import LIMIT, NAME, WARPS, Step, check, counts, decode_step, fits, head_needs, layer_offsets, plan

__all__ = [
    "LIMIT",
    "NAME",
    "WARPS",
    "Step",
    "check",
    "counts",
    "decode_step",
    "fits",
    "head_needs",
    "layer_offsets",
    "plan",
]
