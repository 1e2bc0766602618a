"""The decoder and nothing about measuring it: GPT and Llama, the KV cache, weights, backend dispatch,
generate() (one Step per token) and CUDA-graph decode. Operations carry GPT-2's names (a Llama's parts that do
the same job take the same names), which an observer sees."""

from .generate import Step, generate
from .gpt import GPT, GPTConfig
from .llama import Llama, LlamaConfig
from .ops import FUSIONS, Op, Ops, Tiles
from .weights import load_model

__all__ = [
    "FUSIONS",
    "GPT",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "Op",
    "Ops",
    "Step",
    "Tiles",
    "generate",
    "load_model",
]
