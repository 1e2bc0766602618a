"""The decoder and nothing about measuring it: GPT, the KV cache, weights, backend dispatch, generate()
(one Step per token) and CUDA-graph decode. Operations carry GPT-2's names, which an observer sees."""

from .generate import Step, generate
from .gpt import GPT, GPTConfig
from .ops import FUSIONS, Op, Ops, Tiles
from .weights import load_model

__all__ = ["FUSIONS", "GPT", "GPTConfig", "Op", "Ops", "Step", "Tiles", "generate", "load_model"]
