"""Load a GPT-2- or Llama-family checkpoint (hub name or local folder) into our decoder, with its tokenizer.

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
from .llama import Llama, LlamaConfig

ASSETS = Path(__file__).resolve().parents[2] / "assets"
BUNDLED = ASSETS / "tiny-gpt2"
DEFAULT_MODEL = "bundled"
BUNDLED_LLAMA = "bundled-llama"  # the Llama-family one, trained by the same script on the same tokenizer
HUB_MODELS = ("distilgpt2", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "HuggingFaceTB/SmolLM2-135M")


def resolve_name(name_or_path: str | None) -> str:
    """'bundled' (or nothing) and 'bundled-llama' are the checkpoints in assets/; anything else is a folder or a
    hub name."""
    if name_or_path in (None, "", DEFAULT_MODEL):
        return str(BUNDLED)
    if name_or_path == BUNDLED_LLAMA:
        return str(ASSETS / "tiny-llama")
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


def config_from_hf(hf) -> GPTConfig | LlamaConfig:
    kind = getattr(hf, "model_type", None)
    if kind == "llama":
        return llama_config(hf)
    if kind != "gpt2":
        raise ValueError(f"model_type {kind!r} is not one this explorer runs (allowed: 'gpt2', 'llama')")
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


def llama_config(hf) -> LlamaConfig:
    """A Llama checkpoint's config, refusing what the kernels do not run (biases, scaled rotary, SiLU-free MLPs,
    heads that are not the width's even split)."""
    rope = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    theta = rope.get("rope_theta", getattr(hf, "rope_theta", 10000.0))
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    refusals = [
        (getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False), "biases in its projections"),
        (rope.get("rope_type", "default") != "default", f"rotary scaling {rope.get('rope_type')!r}"),
        (hf.hidden_act != "silu", f"activation {hf.hidden_act!r} (the SwiGLU kernel gates with SiLU)"),
        (head_dim * hf.num_attention_heads != hf.hidden_size, "heads that do not split hidden_size evenly"),
    ]
    for refused, what in refusals:
        if refused:
            raise ValueError(f"this Llama-family checkpoint has {what}, which the explorer's kernels do not run")
    eos = hf.eos_token_id[0] if isinstance(hf.eos_token_id, list) else hf.eos_token_id
    return LlamaConfig(
        vocab_size=hf.vocab_size,
        n_positions=hf.max_position_embeddings,
        n_embd=hf.hidden_size,
        n_layer=hf.num_hidden_layers,
        n_head=hf.num_attention_heads,
        n_kv_head=hf.num_key_value_heads or hf.num_attention_heads,
        ffn=hf.intermediate_size,
        rms_norm_eps=hf.rms_norm_eps,
        rope_theta=float(theta),
        tie_word_embeddings=bool(hf.tie_word_embeddings),
        eos_token_id=eos,
    )


# Our Llama's parameters -> the checkpoint's tensors that make them (several are stacked into one).
LLAMA_KEYS = {
    "transformer.wte.weight": ("model.embed_tokens.weight",),
    "transformer.ln_f.weight": ("model.norm.weight",),
    "lm_head.weight": ("lm_head.weight",),
    "ln_1.weight": ("input_layernorm.weight",),
    "attn.c_attn.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attn.c_proj.weight": ("self_attn.o_proj.weight",),
    "ln_2.weight": ("post_attention_layernorm.weight",),
    "mlp.c_fc.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.c_proj.weight": ("mlp.down_proj.weight",),
}


def _llama_sources(key: str) -> tuple[str, ...]:
    if key in LLAMA_KEYS:
        return LLAMA_KEYS[key]
    _, _, layer, rest = key.split(".", 3)  # transformer.h.N.rest
    return tuple(f"model.layers.{layer}.{name}" for name in LLAMA_KEYS[rest])


def from_hf_state_dict(cfg: GPTConfig | LlamaConfig, state: dict, *, device, dtype) -> GPT:
    """Key-for-key copy; GPT-2's Conv1D stores (in, out), so those weights are transposed. A Llama's q, k and v
    projections are stacked into c_attn, its gate and up projections into c_fc."""
    llama = isinstance(cfg, LlamaConfig)
    model = Llama(cfg) if llama else GPT(cfg)
    for key, target in model.state_dict().items():
        names = _llama_sources(key) if llama else (key,)
        missing = [name for name in names if name not in state]
        if missing:
            raise ValueError(f"checkpoint has no tensor {missing[0]!r}")
        src = torch.cat([state[name] for name in names]) if len(names) > 1 else state[names[0]]
        if not llama and key.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            src = src.t()
        if tuple(src.shape) != tuple(target.shape):
            raise ValueError(f"{key}: checkpoint shape {tuple(src.shape)} does not match {tuple(target.shape)}")
        target.copy_(src)
    return model.to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=2)  # each model holds its weights in memory: keep few
def _load(name: str, device: str, dtype: torch.dtype):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    kwargs = _pretrained_kwargs(name)
    try:
        cfg = config_from_hf(AutoConfig.from_pretrained(name, **kwargs))
        hf = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    except OSError as e:
        raise ValueError(f"could not load model {name!r}: {str(e).splitlines()[0]}") from None
    model = from_hf_state_dict(cfg, hf.state_dict(), device=device, dtype=dtype)
    return model, tokenizer


def load_model(name_or_path=None, *, device="cpu", dtype=torch.float32, backend="triton"):
    """-> (model, tokenizer). name_or_path: 'bundled', a hub name such as 'gpt2' or 'HuggingFaceTB/SmolLM2-135M',
    or a local folder holding a GPT-2- or Llama-family checkpoint."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    model, tokenizer = _load(resolve_name(name_or_path), str(device), dtype)
    return model.with_backend(backend), tokenizer
