"""A whole decode step in one launch: the megakernel rung's kernel, its plan and its host-side check."""

from .kernel import LIMIT, NAME, Step, check, decode_step, fits, layer_offsets, shape_of
from .tiles import WARPS, Shape, Variant, counts, head_needs, parts, plan, tasks, traffic, varied

__all__ = [
    "LIMIT",
    "NAME",
    "WARPS",
    "Shape",
    "Step",
    "Variant",
    "check",
    "counts",
    "decode_step",
    "fits",
    "head_needs",
    "layer_offsets",
    "parts",
    "plan",
    "shape_of",
    "tasks",
    "traffic",
    "varied",
]
