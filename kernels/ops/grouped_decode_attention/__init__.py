"""Grouped-query decode attention over the KV cache, one program per key-value head's group and split, the
merge by the last split to arrive or a second launch (kernel.py)."""

from .kernel import check_groups, grouped_decode_attention, plan, traffic

__all__ = ["check_groups", "grouped_decode_attention", "plan", "traffic"]
