"""Load any GPT-2-family checkpoint (hub name or local folder) into our decoder, with its tokenizer.

The bundled default model in assets/ goes through exactly the same path as any other checkpoint.
Each (checkpoint, dtype, device) is loaded once per process and shared; the backend is a light
per-caller view of the same weights.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import torch

from .gpt import GPT, GPTConfig

BUNDLED = Path(__file__).resolve().parents[2] / "assets" / "tiny-gpt2"
DEFAULT_MODEL = "bundled"
HUB_MODELS = ("distilgpt2", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")


def resolve_name(name_or_path: str | None) -> str:
    """'bundled' (or nothing) is the checkpoint in assets/; anything else is a folder or a hub name."""
    if name_or_path in (None, "", DEFAULT_MODEL):
        return str(BUNDLED)
    return str(name_or_path)


def _hub_reachable(timeout: float = 3.0) -> bool:
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _in_hf_cache(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


@functools.cache
def _hub_reachable_once() -> bool:
    return _hub_reachable()


def model_status(name: str) -> tuple[bool, str]:
    """Whether `name` can load here, and if not, why (for the model picker)."""
    path = resolve_name(name)
    if Path(path).is_dir() or _in_hf_cache(path):
        return True, ""
    if _hub_reachable_once():
        return True, "downloads on first use"
    return False, "not in the local cache and the Hugging Face Hub is unreachable"


def _pretrained_kwargs(name: str) -> dict:
    """Local folders and files already in the Hugging Face cache load offline; other names need the Hub,
    checked first with a short timeout so an offline machine answers at once instead of retrying."""
    if Path(name).is_dir():
        return {}
    if _in_hf_cache(name):
        return {"local_files_only": True}
    if not _hub_reachable():
        raise ValueError(
            f"model {name!r} is not a local folder and is not in the Hugging Face cache, and the Hub cannot be "
            f"reached from this machine; use {DEFAULT_MODEL!r} (the bundled model) or a checkpoint folder"
        )
    return {}


def config_from_hf(hf) -> GPTConfig:
    if getattr(hf, "model_type", None) != "gpt2":
        raise ValueError(f"model_type {getattr(hf, 'model_type', None)!r} is not GPT-2-family (need 'gpt2')")
    if hf.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"activation {hf.activation_function!r} is not GPT-2's tanh GELU, which the kernels fuse")
    return GPTConfig(
        vocab_size=hf.vocab_size,
        n_positions=hf.n_positions,
        n_embd=hf.n_embd,
        n_layer=hf.n_layer,
        n_head=hf.n_head,
        layer_norm_epsilon=hf.layer_norm_epsilon,
        eos_token_id=hf.eos_token_id,
    )


def from_hf_state_dict(cfg: GPTConfig, state: dict, *, device, dtype) -> GPT:
    """Key-for-key copy; GPT-2's Conv1D stores (in, out), so those weights are transposed."""
    model = GPT(cfg)
    ours = model.state_dict()
    for key, target in ours.items():
        src = state.get(key)
        if src is None:
            raise ValueError(f"checkpoint has no tensor {key!r}")
        if key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            src = src.t()
        if tuple(src.shape) != tuple(target.shape):
            raise ValueError(f"{key}: checkpoint shape {tuple(src.shape)} does not match {tuple(target.shape)}")
        target.copy_(src)
    return model.to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=2)  # each GPT-2-sized model holds its weights in memory: keep few
def _load(name: str, device: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoTokenizer, GPT2LMHeadModel

    kwargs = _pretrained_kwargs(name)
    try:
        cfg = config_from_hf(AutoConfig.from_pretrained(name, **kwargs))
        hf = GPT2LMHeadModel.from_pretrained(name, dtype=torch.float32, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    except OSError as e:
        raise ValueError(f"could not load model {name!r}: {str(e).splitlines()[0]}") from None
    model = from_hf_state_dict(cfg, hf.state_dict(), device=device, dtype=dtype)
    return model, tokenizer


def load_model(name_or_path=None, *, device="cpu", dtype=torch.float32, backend="triton"):
    """-> (model, tokenizer). name_or_path: 'bundled', a hub name such as 'gpt2', or a local folder."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    model, tokenizer = _load(resolve_name(name_or_path), str(device), dtype)
    return model.with_backend(backend), tokenizer
