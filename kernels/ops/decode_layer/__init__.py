"""A whole GPT-2 block for a decode step in one launch: the persistent rung of the fusion ladder (kernel.py)."""

from .kernel import CPU_ELEMENTS, ELEMENTS, STAGES, WARPS, column_tile, decode_layer, plan, programs, traffic

__all__ = ["CPU_ELEMENTS", "ELEMENTS", "STAGES", "WARPS", "column_tile", "decode_layer", "plan", "programs", "traffic"]
