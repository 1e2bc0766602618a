"""Rotary position embedding, the Llama family's positions (kernel.py: the standalone kernel, its launcher
and traffic model; rotate.py: the rotation, for kernels that fuse it)."""

from .kernel import rotary, traffic

__all__ = ["rotary", "traffic"]
