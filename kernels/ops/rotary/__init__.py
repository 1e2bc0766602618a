"""Rotary position embedding, the Llama family's positions: the standalone kernel, its launcher and traffic
(kernel.py); the rotation itself is kernels.parts.rotate, for kernels that fuse it."""

from .kernel import rotary, traffic

__all__ = ["rotary", "traffic"]
