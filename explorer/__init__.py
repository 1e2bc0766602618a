"""The Triton Decoder Explorer: a GPT-2 decoder on our own kernels, and what it measures about it.

Layers, each importing only the ones below it: app (the Gradio app) -> measure (recording, timing,
traffic, metrics, sweeps) -> model (the decoder, its cache, generate, CUDA graphs) -> kernels/.
Importing any of them launches nothing and initialises no GPU. `load_model` and `generate` are
imported on first use, so that an entry point (python -m explorer.bench) can still choose Triton's
interpreter before triton is imported.
"""

__all__ = ["generate", "load_model"]


def __getattr__(name: str):
    if name in __all__:
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module 'explorer' has no attribute {name!r}")
