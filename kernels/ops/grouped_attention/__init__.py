"""Grouped-query flash attention for the prefill, each program a key-value head's group of query heads
(kernel.py)."""

from .kernel import grouped_attention, tiles, traffic

__all__ = ["grouped_attention", "tiles", "traffic"]
