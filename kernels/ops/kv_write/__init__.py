"""The decode step's KV-cache write (kernel.py)."""

from .kernel import kv_write, traffic

__all__ = ["kv_write", "traffic"]
