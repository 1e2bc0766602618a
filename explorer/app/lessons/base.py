"""What every lesson is made of, and what the lessons share.

A lesson is a definition (Lesson): the settings of its job for the device at hand ("cpu": tiny, for the
Triton interpreter; "gpu": real sizes), a `measure` that runs the job and returns the tables its chart
is drawn from and the facts its explanation quotes, an `explain` that formats those facts, and a
`figure` drawn from those tables. The same explain and figure serve a run made just now and a run
recorded on a GPU (recorded.py), so every number shown comes from a run, never from the text.
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd
import plotly.graph_objects as go
import torch

from ...measure import metrics, roofs
from ...measure.clock import timed
from ...model.gpt import GPT, GPTConfig
from ...model.weights import load_model
from .. import estimate, models, units

# The models a lesson may run: the bundled one, or random weights of GPT-2 small's shape (built here,
# nothing downloaded), whose decode steps move as many bytes as GPT-2's do.
GPT2_SHAPE = "gpt2-shape"
# The blocks lesson's pair of random models (lessons.blocks), GPT-2's block and a Llama one at one shape.
BLOCKS_CPU, BLOCKS_GPU = "blocks-cpu", "blocks-gpu"
MODEL_LABELS = {
    "bundled": "the bundled tiny GPT-2",
    GPT2_SHAPE: "random weights of GPT-2 small's shape",
    BLOCKS_CPU: "GPT-2's block and a Llama block, random weights, 2 layers of 192",
    BLOCKS_GPU: "GPT-2's block and a Llama block, random weights of GPT-2 small's shape",
}


@dataclass
class Result:
    """One run of a lesson's job: its settings, the facts its explanation quotes, its tables."""

    lesson: str
    settings: dict
    facts: dict
    tables: dict[str, pd.DataFrame]
    device: str  # what it ran on, as a person names it: "NVIDIA H200", "CPU"
    seconds: float  # the job's wall time, warm-up included
    source: str = "measured just now"  # or "recorded on NVIDIA H200, 2026-11-30"
    first_s: float | None = None  # a recording's: the lesson's first run in a warmed-up worker, compiling
    kernels: tuple[str, ...] = ()  # a recording's: the kernel specializations that first run compiled
    rebuilt_s: float | None = None  # a recording's: a run with every kernel compiled but its models built anew
    compile_s: dict[str, float] = field(default_factory=dict)  # a recording's: each of those kernels' compilation


@dataclass(frozen=True)
class Lesson:
    name: str  # in URLs (?lesson=kv-cache) and the API
    title: str
    summary: str  # one line: what it shows
    settings: Callable[[str], dict]  # "cpu" | "gpu" -> the job's settings
    measure: Callable[[dict], tuple[dict, dict]]  # settings -> (facts, tables)
    explain: Callable[[Result], str]  # markdown quoting the facts
    figure: Callable[[Result], go.Figure]
    try_next: str
    estimate: Callable[[dict], float]  # settings -> seconds, before it runs
    controls: Callable[[dict], dict] = field(default=lambda s: {})  # settings -> the app's control values


def size() -> str:
    """The job size for the device at hand."""
    return "gpu" if models.device().type == "cuda" else "cpu"


def device_name() -> str:
    return torch.cuda.get_device_name() if size() == "gpu" else "CPU"


def run(lesson: Lesson, settings: dict) -> Result:
    t0 = time.perf_counter()
    with _one_thread_on_cpu():
        facts, tables = lesson.measure(settings)
    return Result(lesson.name, settings, facts, tables, device_name(), time.perf_counter() - t0)


@contextlib.contextmanager
def _one_thread_on_cpu():
    """On CPU, PyTorch runs a lesson's job on one thread: a model this small gains nothing from more, and
    threads that spin waiting for each other on a busy machine turn a 2 ms step into hundreds."""
    if size() != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --- models and generations -------------------------------------------------------------------------


def model(settings: dict):
    """The lesson's model on this device, with its backend."""
    dtype = models.DTYPES[settings["dtype"]]
    if settings["model"] == GPT2_SHAPE:
        return _gpt2_shape(str(models.device()), dtype).with_backend(settings["backend"])
    return load_model(settings["model"], device=models.device(), dtype=dtype, backend=settings["backend"])[0]


@functools.lru_cache(maxsize=1)
def _gpt2_shape(device: str, dtype: torch.dtype) -> GPT:
    """GPT-2 small's shape (12 layers, width 768, 50257 tokens) with GPT-2's initialisation: weights
    N(0, 0.02), LayerNorms at one and zero."""
    cfg = GPTConfig(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12)
    return randomised(GPT(cfg).to(device=device, dtype=dtype), torch.Generator(device=device).manual_seed(0))


def randomised(model, gen: torch.Generator):
    """model with GPT-2's initialisation, drawn from gen: matrices N(0, 0.02), biases zero, the norms' weights
    left at one (LayerNorm's and RMSNorm's alike)."""
    for name, p in model.named_parameters():
        if p.dim() == 2:
            p.copy_(torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32).mul_(0.02))
        elif not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
            p.zero_()
    return model


def prompt(model, tokens: int, seed: int = 0) -> list[int]:
    """A prompt of exactly `tokens` random token ids (seeded: the same for every run of a lesson)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (tokens,), generator=gen).tolist()


def generation(model, settings: dict, **overrides) -> list:
    """The Steps of one generation with the lesson's settings, run to its full length (no end-of-text).
    On a GPU it warms up first, so that Triton's compilation is not in the times; the interpreter has
    nothing to compile."""
    s = {**settings, **overrides}
    return list(
        timed(
            model,
            prompt(model, s["prompt_tokens"]),
            max_new_tokens=s["new_tokens"],
            cache=s.get("cache", True),
            graph=s.get("graph", False),
            eos_token_id=-1,
            warmup=size() == "gpu",
        )
    )


def generation_estimate(s: dict, runs=(True,), profiled: int = 0) -> float:
    """Seconds for the lesson's generations, one per cache setting in `runs`."""
    units = sum(
        estimate.layer_steps(
            s["model"], s["prompt_tokens"], s["new_tokens"], cache, profiled=profiled, device=models.device().type
        )
        for cache in runs
    )
    return estimate.seconds(models.device().type, s["backend"], units)


def model_controls(s: dict) -> dict:
    """The Generate tab's backend, dtype and model set to the lesson's. A model built here (GPT-2 small's shape) is
    not among the app's models: the picker stays as it is."""
    return dict(backend=s["backend"], dtype=s["dtype"]) | ({} if s["model"] == GPT2_SHAPE else {"model": s["model"]})


def generate_controls(s: dict) -> dict:
    """The Generate tab's controls set to the lesson's job, to run it again by hand and change one thing."""
    out = dict(prompt_tokens=s["prompt_tokens"], new_tokens=s["new_tokens"], cache=s.get("cache", True))
    return out | model_controls(s) | dict(cuda_graph=bool(s.get("graph")))


def peaks():
    """The GPU's measured ceilings (None on CPU)."""
    return metrics.device_peaks(str(models.device()), models.DTYPES[models.default_dtype()])


def weights_mb(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / metrics.MB


def ends(values, k: int | None = None) -> tuple[float, float]:
    """Median of the first k and of the last k values (k: an eighth of them, at least one): where a
    curve starts and ends, without one noisy step deciding it."""
    values = list(values)
    k = k or max(1, len(values) // 8)
    return statistics.median(values[:k]), statistics.median(values[-k:])


def speed(before_ms: float, after_ms: float) -> str:
    """'18.9× faster', or 'N× slower' where the second time is the longer."""
    if after_ms <= before_ms:
        return f"{num(before_ms / after_ms)}× faster"
    return f"{num(after_ms / before_ms)}× slower"


def on_what(settings: dict, device: str) -> str:
    """Where and how a run ran, e.g. "CPU, Triton interpreter" or "NVIDIA H200, Triton kernels"."""
    if device != "CPU":
        return f"{device}, Triton kernels" if settings.get("backend", "triton") == "triton" else f"{device}, PyTorch"
    return "CPU, Triton interpreter" if settings.get("backend", "triton") == "triton" else "CPU, PyTorch, one thread"


def timed_alone(r: Result) -> str:
    """How the operations were timed one by one, as a sentence's opening."""
    if r.device == "CPU":
        return "Timed operation by operation"
    return (
        "Timed kernel by kernel with launch overhead kept out (each alone, its start-up and drain counted in full, "
        "where a CUDA graph overlaps them with its neighbours': the sum can exceed a graph's step)"
    )


def clock(r: Result) -> str:
    return "device time" if r.device != "CPU" else "CPU time"


# --- numbers as the explanations write them ----------------------------------------------------------


def roof(facts: dict) -> str:
    """What a lesson's peak rate is the peak of: its dtype, and whether tensor cores count. Lessons recorded
    before the facts named it ran in the GPU's default dtype, bf16."""
    dtype = facts.get("peak_dtype") or "bfloat16"
    return roofs.ROOFS.get(dtype, dtype)


def num(x: float) -> str:
    """Three significant digits, no exponent: 0.0123, 1.23, 12.3, 123, 1,234."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    a = abs(x)
    if a >= 100:
        return f"{x:,.0f}"
    if a == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(a)))
    return f"{x:.{digits}f}"


def ms(x: float) -> str:
    return f"{num(x)} ms"


def duration(us: float) -> str:
    """µs below a millisecond, ms below a second, s above: the charts' and tables' way (units.duration)."""
    return units.duration(us / 1e3)


def mb(x: float) -> str:
    return f"{num(x)} MB"


def pct(x: float) -> str:
    """A share as a percentage: whole percents, and two significant digits below 1% (a share of 0.0003 is
    0.03%, not 0%)."""
    return f"{100 * x:.2g}%" if 0 < x < 0.01 else f"{x:.0%}"


# --- charts readable from the back of a room ---------------------------------------------------------

FONT = 20
LESSON_PX = 620  # a lesson's chart sits beside the GPU recording's, in half the page
LEGEND_ROW_PX = 30


def big(
    fig: go.Figure,
    title: str,
    result: Result,
    x: str = "",
    y: str = "",
    height: int = 520,
    legend: dict | None = None,
) -> go.Figure:
    """Large type, thick lines and the run's source under the title. The legend goes at the foot of the
    figure, which grows by its rows (`height` is the figure's with none), so that it neither covers the
    x axis's title nor takes the plot's height; or where `legend` places it, in the plot."""
    source = f"{result.source}: {on_what(result.settings, result.device)}"
    rows = 0 if legend else _legend_rows(fig)
    below = dict(orientation="h", yref="container", yanchor="bottom", y=0, xanchor="left", x=0)
    fig.update_layout(
        title=dict(text=f"{title}<br><sup>{source}</sup>", x=0.01, font=dict(size=FONT + 6)),
        font=dict(size=FONT),
        height=height + LEGEND_ROW_PX * rows,
        margin=dict(l=80, r=30, t=100, b=70 + LEGEND_ROW_PX * rows),
        legend=dict(font=dict(size=FONT), **(legend or below)),
        uirevision="lesson",
    )
    if x or y:
        fig.update_layout(xaxis_title=x, yaxis_title=y)
    if x == "sequence position":  # whole positions, however few
        xs = [v for t in fig.data if t.x is not None for v in t.x]
        fig.update_xaxes(tickformat="d", dtick=1 if xs and max(xs) - min(xs) <= 12 else None)
    fig.update_traces(selector=dict(type="scatter"), line_width=4, marker_size=12)
    return fig


def _legend_rows(fig: go.Figure) -> int:
    """Rows a legend under the plot takes at LESSON_PX: one if every entry fits in it, else as many as
    columns as wide as the longest entry need (plotly's layout of a horizontal legend)."""
    names = [t.name or "" for t in fig.data if t.showlegend is not False]
    if len(names) < 2 and fig.layout.showlegend is not True:  # plotly shows no legend for one trace
        return 0
    widths = [0.47 * FONT * len(n) + 50 for n in names]  # the text, and the symbol before it
    room = LESSON_PX - 110  # the margins'
    if sum(widths) <= room:
        return 1
    return math.ceil(len(names) / max(1, int(room // max(widths))))


def log_time(r: Result) -> bool:
    """Step times on a GPU span a one-off first step (pinned buffers, the allocator) of hundreds of ms and
    graph replays of a fraction of one: a log axis shows both. The CPU's curves read better on a linear one."""
    return r.device != "CPU"


def time_axis(fig: go.Figure, r: Result) -> None:
    """The y axis of step times, log or linear as log_time() says."""
    if log_time(r):
        fig.update_yaxes(type="log", dtick=1, exponentformat="none")  # labels at 0.1, 1, 10 only, never 1k
    else:
        fig.update_yaxes(rangemode="tozero")
