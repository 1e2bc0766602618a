"""The device at hand, the dtypes it runs, and which models a visitor may pick (the operator's policy).

Nothing here touches CUDA beyond torch.cuda.is_available() unless asked: on ZeroGPU the GPU exists only
inside a GPU event, and the server builds the page outside one.
"""

from __future__ import annotations

import torch

from kernels.config import supported_dtypes

from ..model.weights import BUNDLED_LLAMA, DEFAULT_MODEL, model_status, resolve_name
from .errors import UserError
from .zerogpu import zero_gpu

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Parameters of the hub models, to refuse one that would not fit the device before fetching it.
HUB_PARAMS = {"distilgpt2": 82e6, "gpt2": 124e6, "gpt2-medium": 355e6, "gpt2-large": 774e6, "gpt2-xl": 1.56e9}
HUB_PARAMS["HuggingFaceTB/SmolLM2-135M"] = 135e6
# Each hub model's family and shape (layers x width; query over key/value heads where they differ), for the picker:
# read from a table rather than the Hub, which the page must not wait for.
HUB_SHAPES = {
    "distilgpt2": "GPT-2 · 6 × 768",
    "gpt2": "GPT-2 · 12 × 768",
    "gpt2-medium": "GPT-2 · 24 × 1024",
    "gpt2-large": "GPT-2 · 36 × 1280",
    "gpt2-xl": "GPT-2 · 48 × 1600",
    "HuggingFaceTB/SmolLM2-135M": "Llama · 30 × 576, 9/3 heads",
}
BUNDLED_LABEL = "bundled GPT-2 · 6 × 256 (offline)"  # short: the picker is a narrow column
BUNDLED_LLAMA_LABEL = "bundled Llama · 6 × 192, 6/2 heads (offline)"
DEFAULT_OFFERED = ("distilgpt2", "gpt2", "HuggingFaceTB/SmolLM2-135M")


def folder_config(name: str) -> dict:
    """The config.json of a model in a folder (no weights read); {} where there is none to read."""
    import json
    from pathlib import Path

    try:
        cfg = json.loads((Path(resolve_name(name)) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def shape_of(name: str) -> str:
    """A model's family and shape as the picker shows it: from the table for hub names, from the config.json of a
    folder (no weights read), or "" where neither says."""
    if name in HUB_SHAPES:
        return HUB_SHAPES[name]
    cfg = folder_config(name)
    if cfg.get("model_type") == "gpt2":
        return f"GPT-2 · {cfg['n_layer']} × {cfg['n_embd']}"
    if cfg.get("model_type") == "llama":
        heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
        return f"Llama · {cfg['num_hidden_layers']} × {cfg['hidden_size']}" + (
            f", {heads}/{kv} heads" if kv != heads else ""
        )
    return ""


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def on_gpu() -> bool:
    return device().type == "cuda"


def dtype_choices() -> list[str]:
    if zero_gpu():  # H200 slices, whose properties must not be read outside a GPU event
        return ["bfloat16", "float16", "float32"]
    names = {v: k for k, v in DTYPES.items()}
    return [names[d] for d in supported_dtypes(device())]


def default_dtype() -> str:
    return "bfloat16" if "bfloat16" in dtype_choices() else "float32"


def dtype_of(name: str) -> torch.dtype:
    return DTYPES[name or default_dtype()]


class Policy:
    """The operator's choices (app.py's --model, --models and --allow-downloads): which model the picker
    starts on, which others visitors may pick, and whether picking one may download it."""

    def __init__(self, default: str = DEFAULT_MODEL, models=DEFAULT_OFFERED, downloads: bool = False):
        self.default = default or DEFAULT_MODEL
        self.models = tuple(m for m in models if m)
        self.downloads = bool(downloads)

    def choices(self, status=model_status) -> list[tuple[str, str]]:
        """(label, value) pairs of the models offered, each with its family and shape; one that cannot load here
        says why."""
        out = [(BUNDLED_LABEL, DEFAULT_MODEL), (BUNDLED_LLAMA_LABEL, BUNDLED_LLAMA)]
        bundled = (DEFAULT_MODEL, BUNDLED_LLAMA)
        for name in (n for n in dict.fromkeys([self.default, *self.models]) if n not in bundled):
            ok, why = status(name)
            if ok and why and not self.downloads:  # on the Hub only, and this server does not download
                ok, why = False, "not on this server, and downloads are off"
            label = f"{name.rsplit('/', 1)[-1]} · {shape}" if (shape := shape_of(name)) else name
            out.append((label if ok else f"{label} (unavailable: {why})", name))
        return out

    def check(self, name: str, status=model_status) -> None:
        """Refuse a model this server may not fetch, before anything loads it."""
        ok, why = status(name)
        if not ok or (why and not self.downloads):
            reason = why if not ok else "it is not on this server and the operator has not allowed downloads"
            raise UserError(f"Model {name!r} cannot be used here: {reason}. Pick a bundled model.")


def free_memory_bytes() -> int:
    """What a run may still allocate on the device at hand: the GPU's free memory, or on CPU the memory
    the operating system reports available."""
    if device().type == "cuda":
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def check_fits(name: str) -> None:
    """Refuse a hub model that would not fit the GPU's free memory, before loading it."""
    params = HUB_PARAMS.get(name)
    if params is not None and device().type == "cuda":
        need = params * 4 * 2  # loaded in fp32, then converted: twice the fp32 weights at the peak
        free = free_memory_bytes()
        if need > free:
            raise UserError(
                f"Model {name!r} needs about {need / 2**30:.1f} GB to load; the GPU has "
                f"{free / 2**30:.1f} GB free. Pick a smaller model."
            )


def check_memory(model, batch: int, positions: int, cache: bool, free: int | None = None) -> None:
    """Refuse a run whose KV cache and largest activations (modeled) would not fit in half of the free
    memory, before it allocates anything."""
    from ..measure.metrics import kv_bytes_per_token

    cfg, item = model.config, model.dtype.itemsize
    kv = kv_bytes_per_token(cfg.n_layer, cfg.n_kv_head, cfg.head_dim, item) * batch * positions if cache else 0
    # A forward over the whole sequence holds a few (B, T, 4C) activations and the (B, vocab) logits in fp32.
    activations = 4 * batch * positions * 4 * cfg.n_embd * item + batch * cfg.vocab_size * 4
    need, free = kv + activations, free_memory_bytes() if free is None else free
    if need > free // 2:
        raise UserError(
            f"This run needs about {need / 2**30:.2f} GB (KV cache and activations) and the device has "
            f"{free / 2**30:.2f} GB free; lower the batch, the new tokens or the prompt length."
        )


def prompt_ids(tok, prompt: str, prompt_tokens: int, n_positions: int) -> list[int]:
    """The prompt's ids: as written, or repeated or cut to exactly `prompt_tokens`."""
    ids = tok.encode(prompt)
    if prompt_tokens:
        if prompt_tokens >= n_positions:
            raise UserError(f"Prompt length {prompt_tokens} leaves no room: the model has {n_positions} positions.")
        ids = (ids * (prompt_tokens // len(ids) + 1))[-prompt_tokens:]  # repeat, keep the last N
    if len(ids) >= n_positions:
        raise UserError(f"The prompt is {len(ids)} tokens; the model has {n_positions} positions.")
    return ids
