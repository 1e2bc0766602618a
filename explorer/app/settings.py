"""Every value a visitor, an API client or the command line sets, declared once.

Each Field is one control: its name (the API parameter and the CLI flag), its label, its kind with its
bounds or choices, and its default. ui.py makes the controls from this table and names the endpoints'
parameters after it, `parse` checks what was sent before any work (validate.py says what is wrong with a
value), and explorer.cli makes its flags from it. Choices and defaults that depend on the device or the
operator (the models offered, the dtypes this device runs) are given by the caller as `dynamic`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kernels.config import TileConfig

from ..model.ops import DEFAULT_FUSION, FUSIONS, Tiles
from ..model.sampling import SUGGESTED
from ..model.weights import DEFAULT_MODEL
from . import validate
from .errors import UserError

MAX_NEW_TOKENS = 2048
MAX_BATCH = 16
MAX_COMPARE_LENGTHS = 6
EXAMPLES = ["def fibonacci(n):", "class Config:", "import os\nimport sys\n\n\ndef main(", '"""Return the number of']


@dataclass(frozen=True)
class Field:
    name: str  # API parameter, RunSettings attribute, CLI flag (--new-tokens)
    label: str  # what the page shows and what a refusal names
    kind: str  # "whole" | "number" | "flag" | "choice" | "text" | "lengths" | "shape"
    default: object = None  # a value, or a function of the device type ("cuda" | "cpu")
    lo: float = 0
    hi: float = 0
    choices: tuple = ()  # fixed choices; dynamic ones (model, dtype) come from the caller
    widget: str = ""  # how the page shows it: dropdown, radio, slider, number, checkbox, textbox
    info: str = ""
    step: float = 1

    def check(self, value, choices=None):
        """The value typed, or UserError naming this field, the value and what is allowed."""
        name = self.label
        if self.kind == "whole":
            return validate.whole(name, value, int(self.lo), int(self.hi))
        if self.kind == "number":
            return validate.number(name, value, self.lo, self.hi)
        if self.kind == "flag":
            return validate.flag(name, value)
        if self.kind == "choice":
            return validate.choice(name, value, self.choice_values(choices))
        if self.kind == "lengths":
            return validate.lengths(name, validate.text(name, value), int(self.lo), int(self.hi), MAX_COMPARE_LENGTHS)
        return validate.text(name, value, int(self.hi) or validate.MAX_TEXT_CHARS)

    def choice_values(self, choices=None) -> list:
        pairs = choices if choices is not None else self.choices
        return [c[1] if isinstance(c, tuple) else c for c in pairs]

    def default_for(self, device_type: str):
        return self.default(device_type) if callable(self.default) else self.default


# A tile sweep's default shape per kernel: real sizes on a GPU, small ones for the interpreter, where every
# program runs in Python.
SWEEP_SHAPES = {
    "cuda": {
        "attention": dict(B=1, H=12, T=1024, D=64),
        "decode_attention": dict(B=1, H=12, T=8192, D=64),
        "linear": dict(M=1024, K=768, N=3072),
        "layer_norm": dict(M=4096, C=768),
        "rms_norm": dict(M=4096, C=576),
        "swiglu": dict(M=1024, K=576, F=1536),
        "grouped_decode_attention": dict(B=1, H=9, KV=3, T=8192, D=64),
    },
    "cpu": {
        "attention": dict(B=1, H=2, T=128, D=64),
        "decode_attention": dict(B=1, H=2, T=512, D=64),
        "linear": dict(M=64, K=256, N=512),
        "layer_norm": dict(M=256, C=256),
        "rms_norm": dict(M=256, C=192),
        "swiglu": dict(M=64, K=192, F=512),
        "grouped_decode_attention": dict(B=1, H=6, KV=2, T=512, D=32),
    },
}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def shape_text(kernel: str, device_type: str) -> str:
    return ",".join(f"{k}={v}" for k, v in SWEEP_SHAPES[device_type][kernel].items())


def _tokens_default(device_type: str) -> int:
    """Generate's new tokens: on CPU, where the interpreter takes a good part of a second a token, a run
    that ends within a few seconds."""
    return 64 if device_type == "cuda" else 10


def _lengths_default(device_type: str) -> str:
    return "16, 64, 256" if device_type == "cuda" else "8"


FUSION_HELP = (
    "none: every op its own kernel · epilogue: bias, GELU, add in the matmul · decode: LayerNorm and the cache "
    "write fused too, about 5 kernels a layer · overlap: those kernels start early and load their weights (Hopper "
    "GPUs) · persistent: each layer one kernel, its stages waiting at counters on the GPU · megakernel: the whole "
    "step one kernel, each task waiting only for the tiles it reads"
)
GRAPH_INFO = "replay each decode step as one launch (with the KV cache on); off: every kernel launched from Python"

FIELDS: dict[str, Field] = {
    f.name: f
    for f in [
        Field("model", "model", "choice", DEFAULT_MODEL, widget="dropdown"),
        Field("prompt", "prompt", "text", EXAMPLES[0], hi=validate.MAX_PROMPT_CHARS, widget="textbox"),
        Field("prompt_tokens", "prompt length in tokens (0: as written)", "whole", 0, 0, 1000, widget="slider"),
        Field("new_tokens", "new tokens", "whole", _tokens_default, 1, MAX_NEW_TOKENS, widget="slider"),
        Field("batch", "batch (copies of the prompt)", "whole", 1, 1, MAX_BATCH, widget="slider"),
        Field("dtype", "dtype", "choice", "", widget="radio"),
        Field("backend", "backend", "choice", "triton", choices=("triton", "torch"), widget="radio"),
        Field(
            "fusion",
            "fusion (Triton backend)",
            "choice",
            DEFAULT_FUSION,
            choices=FUSIONS,
            widget="radio",
            info=FUSION_HELP,
        ),
        Field("cache", "KV cache", "flag", True, widget="checkbox"),
        Field("cuda_graph", "CUDA graph", "flag", True, widget="checkbox", info=GRAPH_INFO),
        Field(
            "temperature",
            "temperature (0: greedy)",
            "number",
            SUGGESTED["temperature"],
            0,
            2,
            widget="slider",
            step=0.05,
        ),
        Field("top_k", "top-k (0: all)", "whole", SUGGESTED["top_k"], 0, 200, widget="slider"),
        Field("top_p", "top-p (1: all)", "number", SUGGESTED["top_p"], 0.05, 1, widget="slider", step=0.05),
        Field(
            "repetition_penalty",
            "repetition penalty (1: off)",
            "number",
            SUGGESTED["repetition_penalty"],
            1,
            2,
            widget="slider",
            step=0.05,
        ),
        Field("seed", "seed", "whole", 0, 0, validate.MAX_SEED, widget="number"),
        Field("overlay", "overlay previous run", "flag", True, widget="checkbox"),
        Field("lengths", "prompt lengths (tokens)", "lengths", _lengths_default, 1, 1023, widget="textbox"),
        Field("kernel", "kernel", "choice", "attention", choices=tuple(SWEEP_SHAPES["cuda"]), widget="dropdown"),
        Field("value", "show", "choice", "ms", choices=("ms", "gbs", "tflops"), widget="radio"),
    ]
}
RUN = [
    "model",
    "prompt",
    "prompt_tokens",
    "new_tokens",
    "batch",
    "dtype",
    "backend",
    "fusion",
    "cache",
    "cuda_graph",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
]
DYNAMIC = ("model", "dtype")  # fields whose choices depend on the operator or the device

# The tile choices per kernel (the Tiles field each sets, and its allowed values), one Field each, plus
# an autotune box per kernel: attention_block_m, ..., attention_autotune.
TILE_CHOICES = {
    "attention": {
        "block_m": [16, 32, 64, 128, 256],
        "block_n": [16, 32, 64, 128],
        "num_warps": [2, 4, 8],
        "num_stages": [1, 2, 3, 4],
    },
    "decode_attention": {
        "block_n": [16, 32, 64, 128, 256],
        "split_k": [1, 2, 4, 8, 16, 32, 64],
        "num_warps": [2, 4, 8],
    },
    "layer_norm": {"block_m": [1, 2, 4, 8, 16], "num_warps": [1, 2, 4, 8]},
    "linear": {
        "block_m": [16, 32, 64, 128],
        "block_n": [32, 64, 128, 256],
        "block_k": [16, 32, 64, 128],
        "num_stages": [1, 2, 3, 4],
    },
    "linear_decode": {"block_n": [16, 32, 64, 128, 256], "block_k": [32, 64, 128, 256], "split_k": [1, 2, 4, 8, 16]},
}
TILE_FIELDS: list[Field] = []
for _kernel, _fields in TILE_CHOICES.items():
    for _name, _values in _fields.items():
        TILE_FIELDS.append(
            Field(
                f"{_kernel}_{_name}",
                f"{_kernel} {_name}",
                "choice",
                "default",
                choices=("default", *map(str, _values)),
                widget="dropdown",
            )
        )
    TILE_FIELDS.append(Field(f"{_kernel}_autotune", f"{_kernel} autotune", "flag", False, widget="checkbox"))
FIELDS |= {f.name: f for f in TILE_FIELDS}
TILES = [f.name for f in TILE_FIELDS]


def default_sweep(device_type: str) -> tuple[str, dict]:
    """The tile sweep tab's defaults on this device: its kernel, and that kernel's shape."""
    kernel = FIELDS["kernel"].default_for(device_type)
    return kernel, SWEEP_SHAPES[device_type][kernel]


@dataclass(frozen=True)
class RunSettings:
    """One Generate or Compare job, checked."""

    model: str = DEFAULT_MODEL
    prompt: str = EXAMPLES[0]
    prompt_tokens: int = 0  # 0: the prompt as written; N: repeated or cut to exactly N tokens
    new_tokens: int = 64
    batch: int = 1
    dtype: str = ""  # "" picks the device's default
    backend: str = "triton"
    fusion: str = DEFAULT_FUSION  # a rung of the fusion ladder (the Triton backend's)
    cache: bool = True
    cuda_graph: bool = True  # replay decode steps from a CUDA graph where possible (GPU, cache on)
    # Sampled, as people decode: a small model decoded greedily repeats itself (explorer.model.sampling).
    temperature: float = SUGGESTED["temperature"]
    top_k: int = SUGGESTED["top_k"]
    top_p: float = SUGGESTED["top_p"]
    repetition_penalty: float = SUGGESTED["repetition_penalty"]
    seed: int = 0
    tiles: Tiles = field(default_factory=Tiles)


def check(name: str, value, dynamic: dict | None = None):
    """One field's value, typed (see Field.check); `dynamic` gives the choices of model and dtype."""
    return FIELDS[name].check(value, (dynamic or {}).get(name))


def tiles_from(values: dict) -> Tiles:
    """Tile field values (attention_block_m="64", attention_autotune=False, ...) -> Tiles."""
    chosen = {}
    for kernel, fields_ in TILE_CHOICES.items():
        if check(f"{kernel}_autotune", values.get(f"{kernel}_autotune", False)):
            chosen[kernel] = "autotune"
            continue
        picked = {}
        for name in fields_:
            value = check(f"{kernel}_{name}", values.get(f"{kernel}_{name}", "default"))
            if value != "default":
                picked[name] = int(value)
        chosen[kernel] = TileConfig(**picked) if picked else None
    return Tiles(**chosen)


def parse(values: dict, dynamic: dict) -> RunSettings:
    """The run's fields (RUN and the tiles) as sent -> RunSettings, each checked before any work."""
    typed = {name: check(name, values[name], dynamic) for name in RUN}
    if not typed["prompt"].strip():
        raise UserError("The prompt is empty: type some text to continue.")
    return RunSettings(**typed, tiles=tiles_from(values))


def defaults(device_type: str, dynamic_defaults: dict | None = None) -> dict:
    """Every field's default value on this device (the page's initial controls, the API's defaults)."""
    out = {name: f.default_for(device_type) for name, f in FIELDS.items()}
    return out | (dynamic_defaults or {})


def default_run(device_type: str, dtype: str) -> RunSettings:
    """The default Generate's settings on this device (in `dtype`, the device's default)."""
    d = defaults(device_type, {"dtype": dtype})
    return RunSettings(prompt=d["prompt"], new_tokens=d["new_tokens"], dtype=d["dtype"])
