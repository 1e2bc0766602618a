"""The Triton Decoder Explorer: a GPT-2 decoder on our own kernels, and what it measures about it.

Layers, each importing only the ones below it: app (the Gradio app) -> measure (recording, timing,
traffic, metrics, sweeps) -> model (the decoder, its cache, generate, CUDA graphs) -> kernels/.
Importing any of them launches nothing and initialises no GPU.
"""

from .model import generate, load_model

__all__ = ["generate", "load_model"]
