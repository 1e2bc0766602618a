"""What the app's buttons do, as plain functions: settings in, text / frames / figures out.

ui.py only lays out controls and wires them here. Every problem a visitor can cause (a bad value, an
unavailable model, tiles that do not fit, GPU memory) comes out as a UserError with one clear
message, never a trace, and leaves nothing behind that would stop the next run.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pandas as pd
import torch

from kernels import TileConfig
from kernels.config import supported_dtypes

from ..measure import launches, metrics, sweeps
from ..measure.counters import recorded
from ..measure.ladder import RUNGS, ladder_rows
from ..measure.profile import profile_run
from ..model.generate import generate
from ..model.ops import DEFAULT_FUSION, Tiles
from ..model.weights import DEFAULT_MODEL, load_model, model_status
from . import estimate, gpu, plots
from .errors import UserError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
MAX_NEW_TOKENS = 2048
MAX_BATCH = 16
MAX_COMPARE_LENGTHS = 6
# Seconds one request may keep the GPU (the operator's EXPLORER_JOB_SECONDS): a generation stops
# decoding, a sweep or a compare stops between configs or runs, and says so.
JOB_SECONDS = float(os.environ.get("EXPLORER_JOB_SECONDS", "600"))
CHART_INTERVAL_S = 0.5  # charts refresh at most this often
TEXT_INTERVAL_S = 0.1  # decoding runs at least this long between two text updates: every update costs the
# server tens of ms, during which the generator waits, so on a GPU tokens stream in groups


@dataclass(frozen=True)
class RunSettings:
    model: str = DEFAULT_MODEL
    prompt: str = "def fibonacci(n):"
    prompt_tokens: int = 0  # 0: the prompt as written; N: repeated or cut to exactly N tokens
    new_tokens: int = 64
    batch: int = 1
    dtype: str = ""  # "" picks the device's default
    backend: str = "triton"
    fusion: str = DEFAULT_FUSION  # a rung of the fusion ladder (the Triton backend's)
    cache: bool = True
    cuda_graph: bool = True  # replay decode steps from a CUDA graph where possible (GPU, cache on)
    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0
    tiles: Tiles = field(default_factory=Tiles)


def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


GRAPH_INFO = "replay each decode step as one launch (with the KV cache on); off: every kernel launched from Python"


def default_new_tokens() -> int:
    """What Generate starts with: on CPU, where the interpreter takes about a second a token, a run that
    ends within half a minute."""
    return 64 if device().type == "cuda" else 8


def default_lengths() -> str:
    """Compare's prompt lengths: on CPU one short length (four runs of 8 tokens, about half a minute)."""
    return "16, 64, 256" if device().type == "cuda" else "8"


def graphs_available() -> bool:
    return device().type == "cuda"


def default_dtype() -> str:
    return "bfloat16" if "bfloat16" in dtype_choices() else "float32"


def dtype_choices() -> list[str]:
    if gpu.zero_gpu():  # H200 slices, whose properties must not be read outside a GPU event
        return ["bfloat16", "float16", "float32"]
    names = {v: k for k, v in DTYPES.items()}
    return [names[d] for d in supported_dtypes(device())]


@functools.cache
def header() -> str:
    """What the app runs on, measured once (on ZeroGPU, inside the first run instead)."""
    if gpu.zero_gpu():
        return (
            "**ZeroGPU: a slice of an NVIDIA H200 is attached for each run.** Its copy bandwidth and matmul "
            "rate are measured inside the first run and shown in the summary."
        )
    peaks = metrics.device_peaks(str(device()), DTYPES[default_dtype()])
    if peaks is None:
        return (
            "**No GPU here: the kernels run in Triton's CPU interpreter.** Results are exact; every timing is a "
            "CPU timing and says so."
        )
    return f"**{peaks.label}**"


def peaks():
    return metrics.device_peaks(str(device()), DTYPES[default_dtype()])


# The operator's choices (app.py's --model, --models and --allow-downloads): which model the picker
# starts on, which others visitors may pick, and whether picking one may download it.
_POLICY = {"model": DEFAULT_MODEL, "models": ("distilgpt2", "gpt2"), "downloads": False}
# Parameters of the hub models, to refuse one that would not fit the device before fetching it.
HUB_PARAMS = {"distilgpt2": 82e6, "gpt2": 124e6, "gpt2-medium": 355e6, "gpt2-large": 774e6, "gpt2-xl": 1.56e9}


def set_default_model(name: str) -> None:
    """The model the picker starts on (app.py's --model)."""
    _POLICY["model"] = name or DEFAULT_MODEL


def set_model_policy(models, downloads: bool) -> None:
    """Which hub models or folders visitors may pick besides the bundled one and the default, and
    whether a model missing from this machine may be downloaded when picked."""
    _POLICY["models"], _POLICY["downloads"] = tuple(m for m in models if m), bool(downloads)


def default_model() -> str:
    return _POLICY["model"]


def model_choices() -> list[tuple[str, str]]:
    """(label, value) pairs of the models the operator offers; one that cannot load here says why."""
    out = [("bundled: tiny GPT-2 trained on Python's standard library (offline)", DEFAULT_MODEL)]
    offered = dict.fromkeys([default_model(), *_POLICY["models"]])
    for name in (n for n in offered if n != DEFAULT_MODEL):
        ok, why = model_status(name)
        if ok and why and not _POLICY["downloads"]:  # on the Hub only, and this server does not download
            ok, why = False, "not on this server, and downloads are off"
        out.append((name if ok else f"{name} (unavailable: {why})", name))
    return out


def free_memory_bytes() -> int:
    """What a run may still allocate on the device at hand: the GPU's free memory, or on CPU the memory
    the operating system reports available."""
    if device().type == "cuda":
        return torch.cuda.mem_get_info()[0]
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))


def check_memory(model, batch: int, positions: int, cache: bool) -> None:
    """Refuse a run whose KV cache and largest activations (modeled) would not fit in half of the free
    memory, before it allocates anything."""
    cfg, item = model.config, model.dtype.itemsize
    kv = metrics.kv_bytes_per_token(cfg.n_layer, cfg.n_head, cfg.head_dim, item) * batch * positions if cache else 0
    # A forward over the whole sequence holds a few (B, T, 4C) activations and the (B, vocab) logits in fp32.
    activations = 4 * batch * positions * 4 * cfg.n_embd * item + batch * cfg.vocab_size * 4
    need, free = kv + activations, free_memory_bytes()
    if need > free // 2:
        raise UserError(
            f"This run needs about {need / 2**30:.2f} GB (KV cache and activations) and the device has "
            f"{free / 2**30:.2f} GB free; lower the batch, the new tokens or the prompt length."
        )


def check_model(name: str) -> None:
    """Refuse a model this server may not fetch, or that would not fit the device, before loading it."""
    ok, why = model_status(name)
    if not ok or (why and not _POLICY["downloads"]):
        reason = why if not ok else "it is not on this server and the operator has not allowed downloads"
        raise UserError(f"Model {name!r} cannot be used here: {reason}. Pick the bundled model.")
    params = HUB_PARAMS.get(name)
    if params is not None and device().type == "cuda":
        need = params * 4 * 2  # loaded in fp32, then converted: twice the fp32 weights at the peak
        free = free_memory_bytes()
        if need > free:
            raise UserError(
                f"Model {name!r} needs about {need / 2**30:.1f} GB to load; the GPU has "
                f"{free / 2**30:.1f} GB free. Pick a smaller model."
            )


# The tile choices the app offers per kernel (the Tiles field each sets, and its allowed values).
TILE_FIELDS = {
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
# Which sweep kernel fills which Tiles field when its best config is sent to the Generate tab.
SWEEP_TO_TILES = {
    "attention": "attention",
    "decode_attention": "decode_attention",
    "layer_norm": "layer_norm",
    "linear": "linear",
}


def tiles_from(fields_by_kernel: dict[str, dict]) -> Tiles:
    """UI values -> Tiles. Each kernel's dict holds field -> "default" | int, plus autotune: bool."""
    chosen = {}
    for kernel, values in fields_by_kernel.items():
        if values.get("autotune"):
            chosen[kernel] = "autotune"
            continue
        picked = {k: int(v) for k, v in values.items() if k != "autotune" and v not in (None, "", "default")}
        chosen[kernel] = TileConfig(**picked) if picked else None
    return Tiles(**chosen)


def check(s: RunSettings) -> None:
    """Refuse impossible settings before anything runs."""
    if not s.prompt.strip():
        raise UserError("The prompt is empty: type some text to continue.")
    if not 1 <= s.new_tokens <= MAX_NEW_TOKENS:
        raise UserError(f"New tokens must be between 1 and {MAX_NEW_TOKENS} (got {s.new_tokens}).")
    if not 1 <= s.batch <= MAX_BATCH:
        raise UserError(f"Batch size must be between 1 and {MAX_BATCH} (got {s.batch}).")
    if s.prompt_tokens < 0:
        raise UserError("Prompt length must be 0 (as written) or a positive number of tokens.")
    if s.backend not in ("triton", "torch"):
        raise UserError(f"Backend must be 'triton' or 'torch' (got {s.backend!r}).")
    if (s.dtype or default_dtype()) not in dtype_choices():
        raise UserError(f"{s.dtype} is not available on this device (allowed: {', '.join(dtype_choices())}).")
    if s.temperature < 0 or s.top_k < 0:
        raise UserError("Temperature and top-k must not be negative (temperature 0 is greedy).")


def prompt_ids(tok, s: RunSettings, n_positions: int) -> list[int]:
    ids = tok.encode(s.prompt)
    if s.prompt_tokens:
        if s.prompt_tokens >= n_positions:
            raise UserError(f"Prompt length {s.prompt_tokens} leaves no room: the model has {n_positions} positions.")
        ids = (ids * (s.prompt_tokens // len(ids) + 1))[-s.prompt_tokens :]  # repeat, keep the last N
    if len(ids) >= n_positions:
        raise UserError(f"The prompt is {len(ids)} tokens; the model has {n_positions} positions.")
    return ids


def check_tiles(model, tiles: Tiles, batch: int, prompt_len: int, total_len: int) -> None:
    """Resolve every kernel's tiles for this run's shapes up front, so a config the device cannot run
    is refused before the first launch rather than in the middle of a step."""
    from kernels.attention import resolve_config as attention_tiles
    from kernels.attention_decode import resolve_decode_config
    from kernels.layer_norm import resolve_config as layer_norm_tiles
    from kernels.linear import resolve_config as linear_tiles

    cfg, dev, dt = model.config, model.device, model.dtype
    layer_norm_tiles(tiles.fixed("layer_norm"), batch * prompt_len, cfg.n_embd, dev)
    for out_f, in_f in ((3 * cfg.n_embd, cfg.n_embd), (4 * cfg.n_embd, cfg.n_embd), (cfg.n_embd, 4 * cfg.n_embd)):
        if batch * prompt_len > 16:
            linear_tiles(tiles.fixed("linear"), batch * prompt_len, out_f, in_f, dt, dev)
        linear_tiles(tiles.fixed("linear_decode"), batch, out_f, in_f, dt, dev)
    attention_tiles(tiles.fixed("attention"), prompt_len, cfg.head_dim, dt, dev)
    resolve_decode_config(tiles.fixed("decode_attention"), batch * cfg.n_head, total_len, cfg.head_dim, dt, dev)


@dataclass
class Update:
    """One refresh of the Generate view."""

    texts: list[str]
    steps: pd.DataFrame | None  # None when this update leaves the charts as they are
    kernels: pd.DataFrame | None
    summary: dict
    charts: bool  # whether this update should redraw the charts
    done: bool = False
    profiled: str = ""  # which positions the device times were profiled at


def _friendly(e: Exception) -> UserError:
    if isinstance(e, UserError):
        return e
    if isinstance(e, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return UserError(
            "The GPU ran out of memory for these settings: lower the batch, the new tokens or the "
            "prompt length, or pick a smaller model."
        )
    if isinstance(e, ValueError):  # validation of tiles, dtypes, lengths and models says what and why
        return UserError(str(e))
    return UserError(f"The run failed: {type(e).__name__}: {e}")


def run_generation(s: RunSettings) -> Iterator[Update]:
    """Generate token by token, yielding the text after at least 0.1 s of decoding (every token on CPU,
    where a token takes longer than that) and charts at most every half second.
    After the run, a profiling pass measures the device time per operation at decode positions
    spread over the run, and on a GPU torch.profiler counts the kernels one decode step runs."""
    try:
        check(s)
        check_model(s.model)
        model, tok = load_model(s.model, device=device(), dtype=DTYPES[s.dtype or default_dtype()], backend=s.backend)
        model = model.with_fusion(s.fusion)
        rung = fusion_label(s)
        ids = prompt_ids(tok, s, model.config.n_positions)
        positions = min(len(ids) + s.new_tokens, model.config.n_positions)
        check_memory(model, s.batch, positions, s.cache)
        if s.backend == "triton":
            check_tiles(model, s.tiles, s.batch, len(ids), positions)
        batch = [ids] * s.batch
        kw = dict(cache=s.cache, tiles=s.tiles, temperature=s.temperature, top_k=s.top_k, tokenizer=tok)
        graph = None if s.cuda_graph else False  # None: generate replays a graph wherever one applies
        steps, texts, last_chart, last_text = [], [tok.decode(ids)] * s.batch, 0.0, 0.0
        t0, over = time.monotonic(), False
        tokens = generate(model, batch, max_new_tokens=s.new_tokens, seed=s.seed, graph=graph, **kw)
        for step in tokens:
            steps.append(step)
            texts = [t + piece for t, piece in zip(texts, step.texts, strict=True)]
            now = time.monotonic()
            over = now - t0 > JOB_SECONDS and not step.stop_reason
            if over:
                break
            if now - last_text < TEXT_INTERVAL_S and not step.stop_reason:
                continue
            charts = now - last_chart >= CHART_INTERVAL_S
            if charts:
                last_chart = now
            # The frames cover every step so far: build them only when the charts will redraw.
            frames = (metrics.step_frame(steps), metrics.kernel_frame(steps)) if charts else (None, None)
            yield Update(texts, *frames, metrics.summary(steps, peaks()) | rung, charts)
            last_text = time.monotonic()  # from when the consumer asks again, not from before it took the update
        tokens.close()
        if over:  # no profiling pass either: the budget is spent
            summary = (
                metrics.summary(steps, peaks()) | rung | dict(stop_reason=f"the time budget ({JOB_SECONDS:.0f} s)")
            )
            kernels = metrics.kernel_frame(steps)
            yield Update(texts, metrics.step_frame(steps), kernels, summary, True, done=True)
            return
        samples = 5 if model.device.type == "cuda" else 2  # the interpreter takes seconds per profiled step
        after = (
            metrics.summary(steps, peaks()) | rung | dict(after_run=f"profiling the kernels at {samples + 1} steps…")
        )
        yield Update(texts, None, None, after, False)
        counted = None
        if model.device.type == "cuda":
            counted = launches.decode_step_launches(
                model, batch, cache=s.cache, graph=graph, tiles=s.tiles, backend=s.backend
            )
        profiled = profile_run(model, batch, steps, cache=s.cache, tiles=s.tiles, backend=s.backend, samples=samples)
        kernels, where = metrics.kernel_frame(steps, profiled), metrics.profiled_note(profiled)
        summary = metrics.summary(steps, peaks(), counted) | rung | dict(after_run=where)
        done = estimate.layer_steps(s.model, len(ids), len(steps), s.cache, s.batch, profiled=samples + 1)
        estimate.record(model.device.type, s.backend, done, time.monotonic() - t0)  # for the next estimate
        yield Update(texts, metrics.step_frame(steps), kernels, summary, True, done=True, profiled=where)
    except Exception as e:  # every failure becomes one message; the app serves the next request
        raise _friendly(e) from None


FUSION_INFO = {
    "none": "none: every operation its own kernel (bias, GELU, residual add apart), as eager PyTorch",
    "epilogue": "epilogue: bias, GELU and residual add in the matmul's epilogue",
    "decode": "decode: LayerNorm in the next matmul's prologue, the cache write in c_attn's epilogue, "
    "split-K and decode attention in one launch each (decode steps)",
    "overlap": "overlap: the decode rung's kernels, each launched to start while the one before finishes and "
    "load its weights meanwhile (programmatic dependent launch; on GPUs before Hopper, as decode)",
    "persistent": "persistent: each block of a decode step in one launch, one program per SM running the decode "
    "rung's five stages, which wait for each other at counters in device memory instead of kernel boundaries",
}


def fusion_label(s: RunSettings) -> dict:
    """The summary's row naming the rung the run used."""
    if s.backend != "triton":
        return {"fusion": "n/a: the torch backend launches PyTorch's own kernels"}
    return {"fusion": FUSION_INFO[s.fusion]}


def summary_markdown(summary: dict) -> str:
    if not summary:
        return ""
    timer = summary.get("timer", "")
    cpu = timer.startswith("cpu")
    bandwidth = f"{summary['achieved_gbs']:.3g} GB/s"
    if "bandwidth_fraction" in summary:
        bandwidth += f" ({summary['bandwidth_fraction']:.0%} of measured peak)"
    memory = summary["peak_memory_mb"]
    clock = "CPU clock" if cpu else "device clock, CUDA events"
    rows = [
        ("time to first token", f"{summary['ttft_ms']:.1f} ms"),
        ("tokens/s delivered (wall clock, first to last token)", _rate(summary.get("wall_tokens_per_s"))),
        (f"decode step p50 / p90 ({clock})", f"{summary['step_ms_p50']:.3f} / {summary['step_ms_p90']:.3f} ms"),
        ("warm-up (compile, first run, graph capture)", f"{summary['warmup_ms']:.0f} ms, not counted above"),
        ("fusion rung", summary.get("fusion", "")),
        ("decode step launches", _launches(summary)),
        ("bytes per token (modeled): HBM / L2 → SMs", _per_token(summary)),
        ("achieved bandwidth (modeled HBM bytes / step time)", bandwidth),
        ("KV cache", f"{summary['kv_cache_mb']:.2f} MB"),
        ("peak GPU memory (max allocated)", "n/a on CPU" if math.isnan(memory) else f"{memory:.0f} MB"),
        ("stopped", summary.get("stop_reason") or "running"),
    ]
    if summary.get("after_run"):
        rows.append(("kernel times", summary["after_run"]))
    head = f"CPU timings ({cpu_clock(timer)}), not GPU timings\n\n" if cpu else ""
    return head + "| measure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def cpu_clock(timer: str) -> str:
    """What ran on CPU, from a Step's timer ("cpu perf_counter (Triton interpreter)" -> "Triton
    interpreter"); "" for a GPU timer."""
    return timer[timer.find("(") + 1 : -1] if timer.startswith("cpu") else ""


def _per_token(summary: dict) -> str:
    return f"{summary['mb_per_token']:.2f} MB / {summary.get('l2_mb_per_token', math.nan):.2f} MB"


def _rate(value) -> str:
    return "needs two tokens" if value is None or math.isnan(value) else f"{value:.1f} tokens/s"


def _launches(summary: dict) -> str:
    n = summary.get("operations_per_step", math.nan)
    if math.isnan(n):
        return "no decode step yet"
    how = "replayed as one CUDA graph" if summary.get("cuda_graph") else "each launched from Python"
    if "kernels_per_step" in summary:
        return (
            f"{summary['kernels_per_step']} GPU kernels + {summary['memory_ops_per_step']} memory operations "
            f"(counted by torch.profiler), from {n:.0f} named operations, {how}"
        )
    counted = "kernels are counted on a GPU" if summary.get("timer", "").startswith("cpu") else "counting after the run"
    return f"{n:.0f} named operations, {how} ({counted})"


def generation_figures(
    steps: pd.DataFrame, kernels: pd.DataFrame, previous: pd.DataFrame | None = None, profiled: str = ""
):
    """The live charts; with `previous`, the last run overlaid on latency and KV growth; `profiled`
    says at which positions the kernel times were measured."""
    p = peaks()
    on_cpu = cpu_clock(steps.timer.iloc[0]) if len(steps) else ""
    note = f"CPU timings ({on_cpu})" if on_cpu else ""
    share_note = "; ".join(n for n in (note, profiled) if n)
    both = steps
    if previous is not None and not previous.empty:
        both = pd.concat([previous.assign(run="previous"), steps.assign(run="this run")], ignore_index=True)
    return (
        plots.latency_figure(both, note),
        plots.traffic_figure(kernels, "bytes from each kernel's traffic model at the chosen tiles"),
        plots.kv_figure(both),  # bytes and tokens: no timings in it
        plots.kernel_share_figure(kernels, share_note, "device time" if p else "CPU time"),
        plots.bandwidth_figure(both, p.bandwidth_gbs if p else None, note),
    )


def roofline_figure(kernels: pd.DataFrame, profiled: str = ""):
    """Each kernel kind's profiled decode and prefill work against the measured ceilings."""
    p = peaks()
    points = metrics.roofline(kernels, p)
    note = "; ".join(n for n in (timer_note(), profiled) if n)
    return plots.roofline_figure(points, p.tflops if p else None, p.bandwidth_gbs if p else None, note)


def hierarchy_before_a_run() -> str:
    """The tab before any run: the recorded counters already say how far the models go."""
    return (
        '<div class="hierarchy"><p>Generate to see where the bytes go.</p>'
        + plots.counters_html(*recorded())
        + "</div>"
    )


def hierarchy(s: RunSettings, kernels: pd.DataFrame) -> str:
    try:
        model, tok = load_model(s.model, device=device(), dtype=DTYPES[s.dtype or default_dtype()])
        lessons = fusion_table(s, max(1, len(prompt_ids(tok, s, model.config.n_positions))))
    except Exception:
        lessons = None
    p = peaks()
    return plots.hierarchy_html(kernels, p.bandwidth_gbs if p else None, lessons, plots.counters_html(*recorded()))


# One input set of a sweep may hold at most this many bytes: the interpreter runs every program in
# Python (a few MB already take minutes), and on a GPU the sweep makes up to 64 rotated copies.
SWEEP_BYTES = {"cpu": 4 << 20, "cuda": 1 << 30}


def sweep_shape(kernel: str, shape: dict, dtype: str) -> dict:
    """The sweep's shape: the sizes given, the rest from this device's defaults; refused when a size is
    not one the kernel has, or when its inputs would be too large to time here."""
    defaults = (DEFAULT_SHAPES if device().type == "cuda" else CPU_SHAPES)[kernel]
    unknown = set(shape) - set(defaults)
    if unknown:
        raise UserError(f"Shape sizes {', '.join(sorted(unknown))} are not {kernel}'s; it takes {', '.join(defaults)}.")
    full = {**defaults, **shape}
    item = DTYPES[dtype or default_dtype()].itemsize
    g = full.get
    elements = {
        "attention": lambda: 3 * g("B") * g("H") * g("T") * g("D"),
        "decode_attention": lambda: 2 * g("B") * g("H") * g("T") * g("D"),
        "linear": lambda: g("M") * g("K") + g("N") * g("K") + g("M") * g("N"),
        "layer_norm": lambda: 3 * g("M") * g("C"),
    }[kernel]()
    limit = SWEEP_BYTES[device().type]
    if elements * item > limit:
        raise UserError(
            f"Shape {', '.join(f'{k}={v}' for k, v in full.items())} needs {elements * item / 2**20:.0f} MB of "
            f"inputs; a sweep here takes at most {limit / 2**20:.0f} MB. Use smaller sizes."
        )
    return full


def run_sweep(kernel: str, shape: dict, dtype: str) -> Iterator[tuple[pd.DataFrame, TileConfig | None, str]]:
    """Yield (the rows so far, the fastest so far, what is happening) after each config. The job ends
    at the time budget; closing the generator (Stop, a closed tab) ends it after the config being timed."""
    shape = sweep_shape(kernel, shape, dtype)
    rows = []
    try:
        timed = sweeps.tile_sweep_rows(kernel, shape, dtype=DTYPES[dtype or default_dtype()], device=device())
        for row, status in _within_budget(timed, "configs"):
            rows.append(row)
            frame = sweeps.sweep_frame(kernel, shape, rows)
            yield frame, _best(frame), status
    except Exception as e:
        raise _friendly(e) from None


def _within_budget(progress, unit: str):
    """(index, count, item) as a job produces them -> (item, what is happening), ending the job after the
    item that spent the time budget."""
    t0 = time.monotonic()
    for i, n, item in progress:
        if time.monotonic() - t0 > JOB_SECONDS and i + 1 < n:
            yield item, f"stopped at the time budget ({JOB_SECONDS:.0f} s): {i + 1} of {n} {unit}"
            return
        yield item, f"{i + 1} of {n} {unit}" if i + 1 < n else f"all {n} {unit}"


def _best(frame: pd.DataFrame) -> TileConfig | None:
    try:
        return sweeps.best_config(frame)
    except ValueError:
        return None


def run_compare(s: RunSettings, prompt_lengths: list[int]) -> Iterator[tuple[pd.DataFrame, str]]:
    """Yield (the runs so far, what is happening) after each run, within the time budget; closing the
    generator ends it after the run in progress."""
    try:
        check(s)
        check_model(s.model)
        model, _ = load_model(s.model, device=device(), dtype=DTYPES[s.dtype or default_dtype()])
        model = model.with_fusion(s.fusion)
        # With the CUDA graph box ticked on a GPU, cache-on runs go both ways: launched one by one and
        # replayed from a graph (cache-off runs cannot replay: every step has a new shape).
        graphs = (False, True) if s.cuda_graph and graphs_available() else (False,)
        runs = sweeps.sequence_runs(model, prompt_lengths, s.new_tokens, tiles=s.tiles, graphs=graphs)
        frames = []
        for frame, status in _within_budget(runs, "runs"):
            frames.append(frame)
            yield pd.concat(frames, ignore_index=True), status
    except Exception as e:
        raise _friendly(e) from None


LADDER_CONTEXT = {"cuda": 1000, "cpu": 16}  # keys in the cache at the ladder's timed decode step


def run_ladder(s: RunSettings) -> Iterator[tuple[pd.DataFrame, str]]:
    """Yield (the rungs so far, what is happening) after each rung: one decode step of this model at a
    context sized for the device, per rung of the fusion ladder and for the torch backend."""
    try:
        check(s)
        check_model(s.model)
        model, _ = load_model(s.model, device=device(), dtype=DTYPES[s.dtype or default_dtype()])
        context = min(LADDER_CONTEXT[device().type], model.config.n_positions - 1)
        rows = []
        for row, status in _within_budget(_ladder_rungs(model, context, s.batch), "rungs"):
            rows.append(row)
            yield pd.DataFrame(rows), status
    except Exception as e:
        raise _friendly(e) from None


def ladder_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The ladder as a person reads it: one row per rung, rounded, with the speed-up over the torch backend."""
    view = frame[["rung", "kernels", "launches_modeled", "l2_mb", "hbm_mb", "step_ms"]].copy()
    view.columns = ["rung", "kernels (counted)", "launches (modeled)", "MB L2 → SMs", "MB HBM", "ms per step"]
    torch_ms = frame.set_index("rung").step_ms.get("torch")
    if torch_ms:
        view["× torch"] = (torch_ms / frame.step_ms).round(2)
    return view.round(3)


def _ladder_rungs(model, context: int, batch: int):
    for i, row in enumerate(ladder_rows(model, context=context, batch=batch)):
        yield i, len(RUNGS), row


EXPORT_DIR = os.path.join(tempfile.gettempdir(), "explorer-exports")
EXPORT_MAX_AGE_S = 3600  # an exported file is kept this long, for its download


def export(frame: pd.DataFrame | None, name: str, fmt: str) -> str:
    if frame is None or len(frame) == 0:
        raise UserError("Nothing to export yet: run something first.")
    prune_exports()
    folder = tempfile.mkdtemp(prefix="export-", dir=_makedirs(EXPORT_DIR))
    return metrics.export(frame, os.path.join(folder, f"{name}.{fmt}"))


def _makedirs(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def prune_exports(now: float | None = None) -> None:
    """Remove export folders older than EXPORT_MAX_AGE_S (Gradio keeps its own copy for the download,
    and removes it on its own schedule: see ui.build's delete_cache)."""
    now = time.time() if now is None else now
    if not os.path.isdir(EXPORT_DIR):
        return
    for entry in os.scandir(EXPORT_DIR):
        if entry.is_dir() and now - entry.stat().st_mtime > EXPORT_MAX_AGE_S:
            shutil.rmtree(entry.path, ignore_errors=True)


DEFAULT_SHAPES = sweeps.DEFAULT_SHAPES
# Small shapes for the interpreter, where every program runs in Python.
CPU_SHAPES = {
    "attention": dict(B=1, H=2, T=128, D=64),
    "decode_attention": dict(B=1, H=2, T=512, D=64),
    "linear": dict(M=64, K=256, N=512),
    "layer_norm": dict(M=256, C=256),
}


def shape_text(kernel: str) -> str:
    shapes = DEFAULT_SHAPES if device().type == "cuda" else CPU_SHAPES
    return ",".join(f"{k}={v}" for k, v in shapes[kernel].items())


def sweep_axes(kernel: str) -> list[str]:
    return list(sweeps.GRIDS[kernel])


def parse_shape(text: str) -> dict:
    try:
        shape = {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(",") if part.strip())}
    except ValueError:
        raise UserError(f"Shape {text!r} is not KEY=NUMBER pairs, e.g. B=1,H=12,T=1024,D=64.") from None
    if any(v < 1 for v in shape.values()):
        raise UserError("Every dimension of the shape must be at least 1.")
    return shape


def parse_lengths(text: str) -> list[int]:
    try:
        lengths = [int(p) for p in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(
            f"Prompt lengths {text!r} must be whole numbers separated by commas, e.g. 16, 64, 256."
        ) from None
    if not lengths or any(n < 1 or n > 4096 for n in lengths):
        raise UserError("Give one to a few prompt lengths between 1 and 4096 tokens.")
    if len(lengths) > MAX_COMPARE_LENGTHS:
        raise UserError(f"Give at most {MAX_COMPARE_LENGTHS} prompt lengths (got {len(lengths)}): each is four runs.")
    return lengths


def describe(cfg: TileConfig) -> str:
    """block_m=64, block_n=32, num_warps=4: the fields a config sets, as a person would write them."""
    return ", ".join(f"{f}={v}" for f, v in vars(cfg).items() if v is not None)


def best_text(frame: pd.DataFrame, best: TileConfig | None) -> str:
    if best is None:
        return "No valid config in this grid."
    ms = frame[frame.valid].ms.min()
    return f"Fastest valid: **{describe(best)}**, {ms * 1e3:.1f} µs ({sweep_note(frame)})."


def sweep_view(frame: pd.DataFrame) -> pd.DataFrame:
    """The sweep as a person reads it: fastest first, times in µs, rates rounded, a mark for validity."""
    tiles = [c for c in ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages") if c in frame]
    ordered = frame.sort_values("ms", na_position="last")
    view = ordered[tiles].astype("Int64")
    view["runs"] = ["✓" if v else "✗" for v in ordered.valid]
    view["µs"] = (ordered.ms * 1e3).round(2)
    for column, name, digits in (("gbs", "GB/s", 0), ("tflops", "TFLOP/s", 2), ("modeled_mb", "MB (L2 → SMs)", 2)):
        if column in ordered:
            view[name] = ordered[column].round(digits)
    view["why not"] = ordered.reason.str.replace(r"^.*? needs", "needs", regex=True)
    return view.reset_index(drop=True)


# What the sweep table shows before the first sweep: its columns, no rows.
SWEEP_VIEW_EMPTY = pd.DataFrame(columns=["runs", "µs", "GB/s", "TFLOP/s", "MB (L2 → SMs)", "why not"])


def sweep_note(frame: pd.DataFrame) -> str:
    """How the sweep's rows were timed, e.g. CUDA-graph replays with inputs rotated past L2."""
    return "; ".join(sorted(set(frame.timer.dropna()) - {""})) if "timer" in frame else timer_note()


def timer_note() -> str:
    return "" if device().type == "cuda" else "CPU interpreter timings"


def fusion_table(s: RunSettings, tokens: int) -> pd.DataFrame:
    dtype = DTYPES[s.dtype or default_dtype()]
    model, _ = load_model(s.model, device=device(), dtype=dtype)
    return metrics.fusion_lessons(model.config, tokens, dtype.itemsize, s.tiles, dtype, device())


def compare_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a sequence sweep: time to first token, decode median and last step."""
    keys = [k for k in ("backend", "cache", "launch_mode", "prompt_tokens") if k in frame.columns]
    decode = (
        frame[frame.phase == "decode"]
        .groupby(keys, as_index=False)
        .agg(
            decode_ms_p50=("latency_ms", "median"),
            last_step_ms=("latency_ms", "last"),
            mb_per_step=("modeled_mb", "median"),
        )
    )
    first = frame[frame.phase == "prefill"][[*keys, "latency_ms"]].rename(columns={"latency_ms": "ttft_ms"})
    return first.merge(decode, on=keys, how="left").round(3)
