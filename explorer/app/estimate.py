"""What a job will cost, said before it starts, and the job refused when that is more than the budget.

Generations are counted in layer-steps: one layer of one decode step of a model 256 wide. A pass over T
tokens (a prefill; every step with the cache off) counts PASS_BASE + T / TOKENS_PER_UNIT of them: it
runs the tiled matmul and prefill attention, which cost more than a decode step even for a few tokens,
and grows with T. A wider model counts more: on a GPU by its layers alone, in the interpreter faster than its
width (interpreter_width). Seconds per layer-step come from the
last generation on this device and backend when there was one, else from RATES, measured on the
machines named there; each job also costs FIXED_S whatever its size (the last figures, the hierarchy
table, on a GPU the profiling pass). A sweep is counted in interpreter programs on CPU (every program of
every config's grid runs in Python) and in configs on a GPU. Rough, and labelled so: benchmarks/page.py
and RESULTS.md hold each estimate next to the time its job then took.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import threading

from kernels.config import H200, next_pow2
from kernels.operations import sweep

from ..measure.sweeps import DEFAULT_SHAPES, GRIDS
from ..model.ops import DECODE_RUNGS
from .errors import UserError

# Seconds per layer-step before any run here: the interpreter on the reference 2-core CPU machine, PyTorch on that
# CPU, an H200 with eager launches included. And seconds a job costs whatever its size, per device: a job's own
# setup, beside its steps. Each constant here was set from a measurement named in benchmarks/RESULTS.md, "Where
# the estimator's constants come from".
RATES = {("cpu", "triton"): 0.065, ("cpu", "torch"): 0.0008, ("cuda", "triton"): 0.0001, ("cuda", "torch"): 0.0003}
FIXED_S = {"cpu": 0.4, "cuda": 0.25}
# Triton's compilation on a GPU, the first time a kind of work meets its key, in seconds on the H200: a model's
# decode kernels at a dtype and fusion level ("model"); its prefill at a new bucket of rows ("prefill": the tile
# constants follow the rows); its decode attention at a new tile plan ("generate", decode_key: the cache's splits
# follow its size); the cache-off passes of a bucket of lengths, a prefill per token ("cache off": its new tiles of
# rows, since kernels stopped specialising on lengths); each config of a sweep, once per kernel, dtype and shape
# ("sweep", its configs compiled several at once before the first is timed: jobs.sweep).
# Beside compilation, a GPU Generate's steps after its text cost more the first time they meet their settings and
# length ("profile", nothing compiled): the decode step's launches are counted anew (the count is kept by settings
# and cache size), and the profiling pass's PyTorch prefills meet new row counts.
COMPILE_S = {
    "cuda": {
        "model": 0.5,
        "prefill": 2.2,
        "generate": 0.7,
        "cache off": 1.0,
        "ladder": 12.0,
        "sweep": 0.2,
        "profile": 0.25,
    },
}
COMPILE_S["cpu"] = dict.fromkeys(COMPILE_S["cuda"], 0.0)  # the interpreter compiles nothing, and times in the run
PASS_BASE = 2.0  # a pass over a few tokens, in decode steps: the tiled path's programs and prefill attention
TOKENS_PER_UNIT = 96
# (layers, width) of the models the app offers; others count as GPT-2 small.
SHAPES = {"bundled": (6, 256), "distilgpt2": (6, 768), "gpt2": (12, 768), "gpt2-shape": (12, 768)}
SHAPES |= {"blocks-cpu": (2, 192), "blocks-gpu": (12, 768)}  # the blocks lesson's two models, each
SHAPES |= {"gpt2-medium": (24, 1024), "gpt2-large": (36, 1280), "gpt2-xl": (48, 1600)}
SHAPES |= {"bundled-llama": (6, 192), "HuggingFaceTB/SmolLM2-135M": (30, 576)}  # the Llama family's
# In the interpreter a Llama layer costs as a GPT-2 layer of its width: its extra launches (rotary, a third matrix)
# are few beside its matrices' programs, which interpreter_cost counts. On a GPU its layers cost as GPT-2's too:
# launches, not bytes, set a small model's step time.
# The interpreter's time for a layer grows faster than its width: each of a matrix's programs loops over its
# inputs, so that part goes as the width squared, beside a part per launch that does not (WIDTH_FIXED).
WIDTH_FIXED = 1.35


@functools.lru_cache(maxsize=64)
def model_sizes(model: str) -> dict:
    """What an estimate counts a model by: layers, width, heads (query, key/value, and each one's width), the
    feed-forward's hidden width, the vocabulary and the family. From the tables above for the models the app
    offers; for a folder (--models takes folders) from its config.json; GPT-2 small's for anything else."""
    from .models import folder_config

    cfg = {} if model in SHAPES else folder_config(model)
    if cfg.get("model_type") == "llama":
        layers, width, heads = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or width // heads
        return dict(layers=layers, width=width, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                    hidden=cfg["intermediate_size"], vocab=cfg["vocab_size"], llama=True)  # fmt: skip
    if cfg.get("model_type") == "gpt2":
        layers, width, heads = cfg["n_layer"], cfg["n_embd"], cfg["n_head"]
        return dict(layers=layers, width=width, heads=heads, kv_heads=heads, head_dim=width // heads,
                    hidden=cfg.get("n_inner") or 4 * width, vocab=cfg["vocab_size"], llama=False)  # fmt: skip
    layers, width = SHAPES.get(model, SHAPES["gpt2"])
    llama = model in ATTENTION_HEADS
    heads, kv_heads, head_dim = ATTENTION_HEADS.get(model, (width // 64, width // 64, 64))
    hidden = {"bundled-llama": 512, "HuggingFaceTB/SmolLM2-135M": 1536}.get(model, 4 * width)
    vocab = {"bundled": 4096, "bundled-llama": 4096, "HuggingFaceTB/SmolLM2-135M": 49152}.get(model, 50257)
    return dict(layers=layers, width=width, heads=heads, kv_heads=kv_heads, head_dim=head_dim, hidden=hidden,
                vocab=vocab, llama=llama)  # fmt: skip


POSITIONS = {"bundled": 1024}  # positions of each model; GPT-2's 1024 for the others
# A tile sweep: seconds per interpreter program on CPU, per config on a GPU (graph capture and replays); held
# against every kernel's sweep by `benchmarks/estimates.py --sweeps`.
SWEEP_PROGRAM_S = 0.0005
SWEEP_CONFIG_S = {"cpu": 0.05, "cuda": 0.05}
# One input set of a sweep may hold at most this many bytes: the interpreter runs every program in Python,
# and on a GPU the sweep makes up to 64 rotated copies.
SWEEP_BYTES = {"cpu": 4 << 20, "cuda": 1 << 30}
# Decode steps' worth one rung of the ladder costs: on CPU the step traced, eager and observed; on a GPU that step,
# its graph's capture and the replays.
LADDER_STEPS = {"cpu": 1.8, "cuda": 3}
# Seconds a rung of the ladder costs beside its steps: on a GPU its graph captured and its kernels profiled, which
# for a small model outweigh the steps.
LADDER_RUNG_S = {"cpu": 0.0, "cuda": 0.06}
# A Generate whose charts overlay the previous run's draws each with both runs' lines, which on a GPU costs about
# this much more. On CPU, where the charts are drawn as the run goes, that falls within the learned rate.
OVERLAY_S = {"cpu": 0.0, "cuda": 0.28}
# The occupancy job: a process of its own that loads the model, records a prefill's and a decode step's launches and
# compiles each kernel once (Triton's cache keeps them for the next time).
OCCUPANCY_S = {"cpu": 20.0, "cuda": 15.0}
PROFILED = {"cpu": 0, "cuda": 6}  # steps a profiling pass after Generate times (none on CPU: its run is timed)
# Decode steps' worth of one profiled step on a GPU, per layer: 6 ms at the GPU's reference rate (each step's two
# runs and its PyTorch prefill).
PROFILED_STEP = 60

_measured: dict[tuple, tuple[float, ...]] = {}  # (device, backend, rate_key): the last rates; a device's speed, shared
_fixed: dict[str, float] = {}  # a job's fixed seconds on this device, learned from the short jobs run here
_compiled: set[tuple] = set()  # (device type, (kind, model, bucket)) compiled for this server
_lock = threading.Lock()


def budget_s() -> float:
    """Seconds one job may run (the operator's EXPLORER_JOB_SECONDS): longer estimates are refused, and a
    job still running at the budget is stopped."""
    return float(os.environ.get("EXPLORER_JOB_SECONDS", "600"))


def shown(seconds: float) -> str:
    """'under a second', '1.5 s' (a tenth under 10 s, where a whole second would be a third of it), '5 s',
    '40 s', '7 min'."""
    if seconds < 1:
        return "under a second"
    if seconds < 10:  # a whole number without its tenth: a budget of 5 s reads "5 s"
        return f"{seconds:.1f}".removesuffix(".0") + " s"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


ADVICE = {
    "generate": "Lower the new tokens, the prompt length or the batch.",
    "compare": "Give fewer or shorter prompt lengths, or fewer new tokens.",
    "ladder": "Pick a smaller model or batch.",
    "sweep": "Use smaller sizes in the shape.",
    "lesson": "",
}


def advice(kind: str) -> str:
    return ADVICE.get(kind, "")


def layer_steps(
    model: str,
    prompt: int,
    new_tokens: int,
    cache: bool,
    batch: int = 1,
    profiled: int = 0,
    device: str = "cpu",
    per_step: float = 1.0,
    per_pass: float = 1.0,
) -> float:
    """Layer-steps of one generation: its prefill and decode steps, `profiled` steps of a profiling pass
    after it (each rebuilt from a pass over the whole run), and on a GPU a warm-up prefill and decode step
    before it. The interpreter's time grows with the width (every program runs in Python); a GPU's, for
    these small models, with the layers only: their launches, not their bytes, set a step's time. `per_step`,
    `per_pass`:
    what the run's settings cost a decode step and a pass against the reference settings (setting_factors)."""

    def full(tokens: int) -> float:  # a pass over `tokens` tokens of each sequence
        return (PASS_BASE + batch * tokens / TOKENS_PER_UNIT) * per_pass

    decode = [per_step if cache else full(prompt + i) for i in range(1, new_tokens)]
    steps = full(prompt) + sum(decode)
    if profiled and device == "cpu":  # the prefill again, then each decode position rebuilt: with the cache,
        # PyTorch's prefill (next to nothing beside the interpreter) and our step; without it, our whole pass
        steps += full(prompt) + (profiled - 1) * (per_step if cache else full(prompt + new_tokens // 2))
    elif profiled:  # on a GPU each rebuilt step runs twice (untimed, then op by op behind spins) after PyTorch's
        # prefill of its cache (without the cache, our whole pass): work the host's pace sets, PROFILED_STEP each
        steps += min(profiled, new_tokens) * (PROFILED_STEP + (0 if cache else full(prompt + new_tokens // 2)))
    if device == "cuda":
        steps += full(prompt) + 1
    return steps * model_scale(model, device)


def model_scale(model: str, device: str) -> float:
    """Layer-steps of the model's step, per layer-step of one 256 wide: layers x width / 256 in the
    interpreter, the layers alone on a GPU (see layer_steps)."""
    m = model_sizes(model)
    if device == "cpu":
        return m["layers"] * interpreter_width(m["width"])
    return m["layers"]


def interpreter_width(width: int) -> float:
    """A layer's cost in the interpreter at this width, per layer 256 wide (WIDTH_FIXED: the part per launch)."""
    return (WIDTH_FIXED + (width / 256) ** 2) / (WIDTH_FIXED + 1)


def cpu_speed() -> float:
    """How much slower this CPU runs the interpreter than the machine RATES were measured on (below 1: faster),
    from the Generates here: what a cost counted in that machine's seconds is multiplied by."""
    return generic_rate("cpu", "triton") / RATES[("cpu", "triton")]


def rate_key(s) -> tuple:
    """What sets a Generate's seconds per layer-step beyond its length: each such setting keeps rates of its own."""
    return (s.model, s.dtype, s.backend, s.fusion, s.tiles, s.batch, s.cache)


def rate(device: str, backend: str, key=None) -> float:
    """Seconds per layer-step: the median of the last runs of these settings (`key`, rate_key) here, else
    generic_rate. The layer-steps already count what the settings cost (setting_factors)."""
    own = _measured.get((device, backend, key)) if key is not None else None
    return statistics.median(own) if own else generic_rate(device, backend)


def generic_rate(device: str, backend: str) -> float:
    """The rate of settings not yet run here: the median of each run setting's own median and of RATES counted
    twice, so that one setting, however slow or odd its runs, does not move it; three settings that agree do."""
    prior = RATES[(device, backend)]
    own = [statistics.median(v) for (d, b, _), v in _measured.items() if (d, b) == (device, backend)]
    return statistics.median([prior, prior, *own])


def seconds(device: str, backend: str, units: float, key=None) -> float:
    """Seconds for `units` layer-steps and a job's fixed cost."""
    return fixed_s(device) + units * rate(device, backend, key)


def fixed_s(device: str) -> float:
    """A job's seconds whatever its size: FIXED_S until a short job has run here, then learned from those."""
    return _fixed.get(device, FIXED_S[device])


def bucket(tokens: int) -> int:
    """Lengths that share compiled kernels, as far as an estimate can tell: the power of two at or above."""
    return 1 << max(0, tokens - 1).bit_length()


def compile_s(device: str, keys, cost=None) -> float:
    """Triton's compilation for the kinds of work in `keys` not yet compiled here (none on CPU): each key's
    COMPILE_S by its kind, or `cost(key)` seconds."""
    cost = cost or (lambda key: COMPILE_S[device][key[0]])
    return sum(cost(key) for key in missing(device, keys))


def missing(device: str, keys) -> set:
    """The kinds of work in `keys` that no job or warm-up has yet run here."""
    return {key for key in keys if (device, key) not in _compiled}


def compiled(device: str, keys) -> None:
    """These kinds of work have been compiled (a job ran them, or the worker's warm-up did)."""
    with _lock:
        _compiled.update((device, key) for key in keys)


def record(device: str, backend: str, units: float, wall_s: float, key=None) -> None:
    """A finished job's speed, for the next estimate of the same settings (`key`, rate_key) on this device and
    backend: its rate joins the last RECENT of that key, whose median is the key's rate, so one slow run
    (a busy machine) moves no rate and an odd setting moves only its own. A job whose steps cost more than
    its fixed part sets a rate. One whose steps should cost less cannot tell the rate apart from the fixed part
    and leaves the rate as it was (a 2-token run that took 2.5 s on a busy machine would otherwise make a
    1000-token run's estimate 700 s); it moves the fixed part halfway to what it took beyond its steps,
    within FIXED_RANGE of FIXED_S. On a GPU most jobs are such short ones, and the same job's seconds differ
    between machines of one kind by more than half."""
    if units <= 0 or wall_s <= 0:
        return
    fixed = fixed_s(device)
    with _lock:
        if units * rate(device, backend, key) >= fixed:
            runs = _measured.get((device, backend, key), ())
            _measured[(device, backend, key)] = (*runs, max(wall_s - fixed, 0.1 * wall_s) / units)[-RECENT:]
        else:
            lo, hi = (f * FIXED_S[device] for f in FIXED_RANGE)
            _fixed[device] = min(max((fixed + wall_s - units * rate(device, backend, key)) / 2, lo), hi)


RECENT = 5  # runs of one setting whose median is its rate
LESSON = "lesson"  # the backend under which a lesson's own seconds are kept, by its name


def record_lesson(name: str, wall_s: float) -> None:
    """A lesson's run on CPU took `wall_s`: the median of its last RECENT runs is its next estimate."""
    with _lock:
        _measured[("cpu", LESSON, name)] = (*_measured.get(("cpu", LESSON, name), ()), wall_s)[-RECENT:]


def lesson_seconds(name: str, modeled: float) -> float:
    """A lesson's seconds on CPU: its own runs here when there are some, else `modeled` at this CPU's speed."""
    runs = _measured.get(("cpu", LESSON, name))
    return statistics.median(runs) if runs else modeled


FIXED_RANGE = (0.5, 4.0)


def source(device: str, backends, key=None) -> str:
    """Where an estimate's rate comes from: runs of the same settings (`key`: rate_key, or a lesson's name),
    runs of others, or neither."""
    if key is not None and (all((device, b, key) in _measured for b in backends) or (device, LESSON, key) in _measured):
        return "from the last runs of these settings here"
    if all(any(k[:2] == (device, b) for k in _measured) for b in backends):
        return "from runs of other settings here, scaled to these"
    return "before any run here: a rough guess"


def about(seconds: float, device: str) -> str:
    """'about 40 s on this CPU', or 'under a second on this GPU'."""
    where = "this CPU" if device == "cpu" else "this GPU"
    return f"{'about ' if seconds >= 1 else ''}{shown(seconds)} on {where}"


def note(total_s: float, device: str, backends=("triton",), key=None) -> str:
    """'Estimate: about 40 s on this CPU (...)', or under a second."""
    if total_s < 1:
        return f"*Estimate: {about(total_s, device)}.*"
    return f"*Estimate: {about(total_s, device)} ({source(device, backends, key)}).*"


def generation_units(s, device: str) -> float:
    tokens = prompt_tokens(s)
    per_step, per_pass = setting_factors(s, device)
    return layer_steps(
        s.model,
        tokens,
        s.new_tokens,
        s.cache,
        s.batch,
        profiled=PROFILED[device],
        device=device,
        per_step=per_step,
        per_pass=per_pass,
    )


def setting_factors(s, device: str) -> tuple[float, float]:
    """(decode step, pass) at the run's tiles, rung, dtype and batch against the reference settings: in the
    interpreter, from the programs and loop steps each kernel's tile rules give (interpreter_cost); on a GPU,
    or with PyTorch, 1 (launches set a small model's step there, and RATES hold that). Tiles the device cannot
    run count as 1: the run refuses them before any work."""
    if device != "cpu" or s.backend != "triton":
        return 1.0, 1.0
    from . import interpreter_cost
    from .models import DTYPES

    dtype = DTYPES.get(s.dtype or "float32")
    tokens = prompt_tokens(s)
    middle = tokens + s.new_tokens // 2  # the cache's length halfway: decode attention's steps follow it
    try:
        per_step = interpreter_cost.decode_factor(s, dtype, middle)
        per_pass = interpreter_cost.pass_factor(s, dtype, tokens if s.cache else middle)
    except ValueError:
        return 1.0, 1.0
    return per_step, per_pass


def prompt_tokens(s) -> int:
    return s.prompt_tokens or max(1, len(s.prompt) // 3)


def model_key(s) -> tuple:
    """A model's decoder kernels, compiled once for each dtype and fusion level."""
    return ("model", s.model, s.dtype, s.fusion)


def prefill_key(s, tokens: int) -> tuple:
    """A prefill's kernels, compiled once for each bucket of rows (128 rows or fewer share one)."""
    return ("prefill", *model_key(s)[1:], max(128, bucket(s.batch * tokens)))


def generation_keys(s) -> list:
    """The kinds of work a Generate meets for the first time or not: its kernels' compilation (ours only), and on
    a GPU its steps after the text at these settings and this length (profile_key). With the cache off its steps
    are passes over every token so far (as Compare's cache-off runs: their bucket of lengths), not decode steps."""
    tokens = prompt_tokens(s)
    after = profile_key(s, tokens + s.new_tokens)
    if s.backend != "triton":
        return [after]
    if not s.cache:
        return [model_key(s), prefill_key(s, tokens), cache_off_key(s, tokens + s.new_tokens), after]
    return [model_key(s), prefill_key(s, tokens), decode_key(s, tokens + s.new_tokens), after]


def cache_off_key(s, positions: int) -> tuple:
    """The cache-off passes up to `positions` tokens: their new tiles of rows, once for each bucket of lengths."""
    return ("cache off", s.model, bucket(positions))


def profile_key(s, positions: int) -> tuple:
    """A Generate's launch count and profiling pass, at its settings and cache size: jobs.generate keeps the count
    by this key, with the run's exact size; an estimate counts the prompt's tokens roughly (prompt_tokens)."""
    return ("profile", s.model, s.dtype, s.backend, s.fusion, s.tiles, s.batch, s.cache, s.cuda_graph, positions)


# Heads, key/value heads and head width of the Llama-family models; a GPT-2 model's heads are 64 wide.
ATTENTION_HEADS = {"bundled-llama": (6, 2, 32), "HuggingFaceTB/SmolLM2-135M": (9, 3, 64)}
# The GPU whose tile rules an estimate follows: the H200, where COMPILE_S was timed (the server's own process
# does not touch the GPU; a GPU of another size may plan a few lengths differently).
PLANNED_ON = H200


def decode_key(s, positions: int) -> tuple:
    """The decode attention kernel a run's steps compile, as Triton tells its variants apart: the cache's size
    reaches it only through the tile plan (key tiles, warps, splits), so runs whose plans agree share one,
    whatever the model or the length. The fusion level picks the kernels."""
    import torch

    from kernels.ops.decode_attention import tiles as decode_tiles
    from kernels.ops.grouped_decode_attention import kernel as grouped

    from .models import DTYPES

    dtype = DTYPES.get(s.dtype, torch.bfloat16)  # "" is the device's default: an H200's
    fused = s.fusion in DECODE_RUNGS
    m = model_sizes(s.model)
    heads, kv_heads, head_dim = m["heads"], m["kv_heads"], m["head_dim"]
    if not m["llama"]:
        tiles = s.tiles.fixed("decode_attention")
        try:
            plan = decode_tiles.launch_plan(tiles, s.batch * heads, positions, head_dim, dtype, PLANNED_ON)
        except ValueError:  # tiles this GPU could not run: the run says so; the estimate counts a compile
            return ("generate", head_dim, str(dtype), fused, tiles)
        cfg, _, splits, _, block_s, prefetch, dot = plan[:7]
        varies = (cfg.block_n, cfg.num_warps, cfg.num_stages, block_s, prefetch, dot, splits == 1)
    else:  # grouped heads: the cache's length is an argument of its own (specialised on its multiples of 16)
        p = grouped.plan(s.batch * kv_heads, positions, PLANNED_ON, group=heads // kv_heads, head_dim=head_dim)
        varies = (heads // kv_heads, p.block_n, p.num_warps, next_pow2(p.splits), p.chunk == p.block_n, p.apart)
        varies += (p.splits == 1, positions % 16 == 0)
    return ("generate", head_dim, str(dtype), fused, *varies)


def generation_seconds(s, device: str, overlaid: bool = False) -> float:
    """A Generate's seconds; `overlaid`: its charts draw the previous run's lines beside its own."""
    overlay = OVERLAY_S[device] if overlaid else 0.0
    run = seconds(device, s.backend, generation_units(s, device), rate_key(s))
    return run + compile_s(device, generation_keys(s)) + overlay


def compare_units(s, lengths: list[int], device: str) -> dict[str, float]:
    """Compare runs both backends, the cache on and off, each cache-on run twice with graphs, per length."""
    graphs = s.cuda_graph and device == "cuda"
    out = {}
    for backend in ("triton", "torch"):
        out[backend] = 0.0
        for cache, runs in ((True, 2 if graphs else 1), (False, 1)):
            out[backend] += sum(layer_steps(s.model, n, s.new_tokens, cache, device=device) for n in lengths) * runs
    return out


def compare_keys(s, lengths: list[int]) -> list:
    prefills = [prefill_key(s, n) for n in lengths]
    cache_off = [cache_off_key(s, n + s.new_tokens) for n in lengths]
    return [model_key(s), *prefills, *[decode_key(s, n + s.new_tokens) for n in lengths], *cache_off]


def compare_seconds(s, lengths: list[int], device: str) -> float:
    units = compare_units(s, lengths, device)
    run = sum(seconds(device, b, u) - fixed_s(device) for b, u in units.items()) + fixed_s(device)
    return run + compile_s(device, compare_keys(s, lengths))


def ladder_keys(s) -> list:
    """The ladder compiles every rung's kernels for its model, a set of its own."""
    return [("ladder", s.model, s.batch)]


def ladder_seconds(s, device: str, rungs: int = 5) -> float:
    """One decode step per Triton rung at the ladder's context (the torch backend's costs next to nothing):
    on CPU the step traced is the step timed; on a GPU it is traced, captured and replayed (LADDER_STEPS)."""
    run = seconds(device, "triton", ladder_units(s.model, s.batch, device, rungs)) + rungs * LADDER_RUNG_S[device]
    return run + compile_s(device, ladder_keys(s))


def ladder_units(model: str, batch: int, device: str, rungs: int) -> float:
    """Layer-steps of one decode step per rung (LADDER_STEPS decode steps' worth each)."""
    return rungs * LADDER_STEPS[device] * batch * model_scale(model, device)


def check_lengths(model: str, lengths: list[int], new_tokens: int) -> None:
    """Compare's prompts and new tokens must fit the model's positions, before any work."""
    positions = POSITIONS.get(model, 1024)
    longest = max(lengths)
    if longest + new_tokens > positions:
        raise UserError(
            f"A prompt of {longest} tokens and {new_tokens} new tokens need {longest + new_tokens} positions; "
            f"the model has {positions}. Give shorter prompt lengths or fewer new tokens."
        )


def sweep_keys(kernel: str) -> list[str]:
    return list(DEFAULT_SHAPES[kernel])


def sweep_axes(kernel: str) -> list[str]:
    return list(GRIDS[kernel])


def check_sweep_inputs(kernel: str, shape: dict, itemsize: int, device: str) -> None:
    """Refuse a sweep whose inputs would not fit what can be timed here, or that the kernel cannot take."""
    sw = sweep(kernel)
    try:
        sw.check(shape)
    except ValueError as e:
        raise UserError(str(e)) from None
    need, limit = sw.elements(shape) * itemsize, SWEEP_BYTES[device]
    if need > limit:
        sizes = ", ".join(f"{k}={v}" for k, v in shape.items())
        raise UserError(
            f"Shape {sizes} needs {need / 2**20:.0f} MB of inputs; a sweep here takes at most "
            f"{limit / 2**20:.0f} MB. Use smaller sizes."
        )


def sweep_configs(kernel: str) -> list[dict]:
    import itertools

    grid = GRIDS[kernel]
    return [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())]


def sweep_compiles(kernel: str, shape: dict, dtype: str) -> list:
    """Each config of the sweep compiles once for its kernel, dtype and shape."""
    sizes = tuple(sorted(shape.items()))
    return [("sweep", kernel, dtype, sizes, tuple(sorted(c.items()))) for c in sweep_configs(kernel)]


def sweep_s(kernel: str, shape: dict, device: str, dtype: str = "float32") -> float:
    configs = sweep_configs(kernel)
    speed = cpu_speed() if device == "cpu" else 1.0  # the CPU's costs are the reference machine's seconds
    run = fixed_s(device) + len(configs) * SWEEP_CONFIG_S[device] * speed
    if device == "cpu":
        run += sum(sweep(kernel).programs(shape, c) for c in configs) * SWEEP_PROGRAM_S * speed
    return run + compile_s(device, sweep_compiles(kernel, shape, dtype))


def generation_note(s, device: str, overlaid: bool = False) -> str:
    return note(generation_seconds(s, device, overlaid), device, [s.backend], rate_key(s))


def compare_note(s, lengths: list[int], device: str) -> str:
    return note(compare_seconds(s, lengths, device), device, ["triton", "torch"])


def finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0
