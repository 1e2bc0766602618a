"""The Generate job: tokens as they come, charts as the run grows, then the kernels profiled.

Text goes out first and alone: an update with new text never waits for a figure to be drawn. On a GPU a
token takes a fraction of a millisecond, so tokens go out in groups (TEXT_INTERVAL_S); on CPU each token
goes out as it is made. Charts follow at most every CHART_INTERVAL_S while the run goes on (on CPU the first
with the first token), and once at its end. On a GPU a profiling pass after the run times each kernel at
decode positions spread over it, and torch.profiler counts the kernels one decode step runs; on CPU each
operation is timed in the run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import pandas as pd

from ...measure import launches, metrics
from ...measure.clock import timed
from ...measure.profile import NoKernelTime, Profiler, profile_run
from ...model.ops import Tiles
from ...model.weights import load_model
from .. import counterpart, estimate, models, tile_fit, views
from ..settings import RunSettings
from .base import Control
from .compiling import compile_note, peaks, remember_warm

TEXT_INTERVAL_S = {"cuda": 0.04, "cpu": 0.0}  # at least this long between two text updates
CHART_INTERVAL_S = {"cuda": 1.0, "cpu": 3.0}  # charts at most this often while tokens stream
# The first charts: on CPU with the first token (a token takes most of a second there, and the page should not
# show the previous run's charts for seconds); on a GPU after the first interval, the text going first.
FIRST_CHART_S = {"cuda": 1.0, "cpu": 0.0}
PROFILED = {"cuda": 5}  # decode positions the profiling pass times on a GPU (besides the prefill)
# What a decode step launches, by the run's settings and cache size: the same settings launch the same kernels, so a
# Generate run again is not counted again (the count, four short generations under torch.profiler, takes a tenth of
# a GPT-2 small Generate on a GPU). A dict cleared past 256 rather than functools.lru_cache: the key is the
# settings' (estimate.profile_key), not the model and prompt the count runs on, which lru_cache would key on.
_counted: dict[tuple, launches.StepLaunches] = {}


def check_tiles(model, tiles: Tiles, batch: int, prompt_len: int, total_len: int) -> None:
    """Resolve every kernel's tiles for this run's shapes up front, so a config the device cannot run
    is refused before the first launch rather than in the middle of a step, in the page's words (tile_fit).
    The shapes are the model's own (a Llama's stacked q/k/v, its SwiGLU's gate and up), read from its first
    block."""
    from kernels.ops.attention.kernel import resolve_config as attention_tiles
    from kernels.ops.decode_attention.kernel import resolve_decode_config
    from kernels.ops.layer_norm.kernel import resolve_config as norm_tiles
    from kernels.ops.linear.kernel import resolve_config as linear_tiles
    from kernels.ops.swiglu import kernel as swiglu

    cfg, dev, dt = model.config, model.device, model.dtype
    llama = model.family == "Llama"
    at = lambda rule, *shape: lambda c: rule(c, *shape)  # a kernel's tile rule at one shape: a check of a config
    rules = {"layer_norm": [at(norm_tiles, batch * prompt_len, cfg.n_embd, dev, "rms_norm" if llama else "layer_norm")]}
    block = model.transformer.h[0]
    for linear in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
        out_f, in_f = linear.weight.shape
        gated = llama and linear is block.mlp.c_fc  # one matmul of gate and up, SiLU(gate) * up in its epilogue
        for rows, which in ((batch * prompt_len, "linear"), (batch, "linear_decode")):
            if which == "linear" and rows <= 16:
                continue  # a prompt this short runs as decode-shaped rows
            rule = (
                at(swiglu.resolve_config, rows, out_f // 2, in_f, dt, dev)
                if gated
                else at(linear_tiles, rows, out_f, in_f, dt, dev)
            )
            rules.setdefault(which, []).append(rule)
    if not llama:  # grouped-query attention takes its own tiles (kernels.ops.grouped_decode_attention.kernel.plan)
        rules["attention"] = [at(attention_tiles, prompt_len, cfg.head_dim, dt, dev)]
        rules["decode_attention"] = [at(resolve_decode_config, batch * cfg.n_head, total_len, cfg.head_dim, dt, dev)]
    for kernel, kernel_rules in rules.items():
        chosen = tiles.fixed(kernel)
        fits = lambda c, kernel_rules=kernel_rules: [rule(c) for rule in kernel_rules]
        try:
            fits(chosen)
        except ValueError as e:
            if chosen is None:  # the kernel's own defaults: nothing of the visitor's to name
                raise
            raise tile_fit.refusal(kernel, chosen, fits, e) from None


def prepare(s: RunSettings):
    """The model at the run's rung and the prompt's ids, every refusal made before anything runs."""
    models.check_fits(s.model)
    model, tok = load_model(s.model, device=models.device(), dtype=models.dtype_of(s.dtype), backend=s.backend)
    model = model.with_fusion(s.fusion)
    ids = models.prompt_ids(tok, s.prompt, s.prompt_tokens, model.config.n_positions)
    positions = min(len(ids) + s.new_tokens, model.config.n_positions)
    models.check_memory(model, s.batch, positions, s.cache)
    if s.backend == "triton":
        check_tiles(model, s.tiles, s.batch, len(ids), positions)
    return model, tok, ids


def _text(texts: list[str]) -> str:
    return "\n\n".join(t if len(texts) == 1 else f"[{i + 1}] {t}" for i, t in enumerate(texts))


@dataclass
class _Job:
    """One Generate as it goes: its settings, model and prompt, the steps and texts so far, and why it stopped."""

    s: RunSettings
    model: object
    tok: object
    ids: list[int]
    previous: pd.DataFrame | None  # the page's last run, drawn under this one's lines
    started: float  # wall clock: when the page's request began
    ran_from: float  # the estimate's rate counts the run, not a model's first load
    p: object = field(default_factory=peaks)
    steps: list = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    timed_rows: list[dict] = field(default_factory=list)
    waited: float | None = None  # seconds from the request to the first token
    stopped: str | None = None  # why the visitor or the budget ended it

    @property
    def device(self) -> str:
        return self.model.device.type

    @property
    def key(self) -> tuple:
        s = self.s
        return ("generate", s.model, s.dtype, s.backend, s.fusion, s.tiles, s.batch, s.cache, s.cuda_graph)

    def charts(self, profiled=None, timed: str = "") -> dict:
        """Every chart of the run so far; on CPU with the same job's GPU answer beside its times."""
        frame, kernels = metrics.step_frame(self.steps), metrics.kernel_frame(self.steps, profiled)
        gpu = counterpart.for_generate(self.s, frame, kernels) if self.device == "cpu" else None
        kv_why = metrics.kv_why(self.model.config, self.model.dtype.itemsize) if self.s.cache else ""
        figures = views.generation_figures(frame, kernels, self.p, self.previous, timed, gpu=gpu, kv_why=kv_why)
        return dict(figures, frame=frame, kernels=kernels, gpu=gpu)

    def summary(self, gpu=None, counted=None, **extra) -> tuple[str, dict]:
        rung = {"fusion": views.fusion_label(self.s.backend, self.s.fusion)}
        totals = metrics.summary(self.steps, self.p, counted) | rung | {"waited_s": self.waited} | extra
        return views.summary_markdown(totals, gpu), totals

    def finish(self, drawn: dict, text, status: str, **extra) -> dict:
        """finish(), with the run's seconds for the estimate."""
        update = finish(self.s, self.model, self.ids, self.p, drawn, self.summary, text, status, **extra)
        return update | {"ran_s": ran_s(self.ran_from, self.steps)}


def run(payload: dict, control: Control):
    """Prepare, stream the tokens, then (on a GPU) profile the kernels, and finish: each a step below."""
    s: RunSettings = payload["settings"]
    model, tok, ids = prepare(s)
    job = _Job(s, model, tok, ids, payload.get("previous"), payload.get("started", time.time()), time.monotonic())
    if note := compile_note(job.key, job.device, payload.get("compile_s")):
        yield {"status": note}
    # On CPU every operation of every step is timed as the run goes (the interpreter's clock around each
    # call costs nothing beside it), so no profiling pass follows; on a GPU a pass after the run times the
    # kernels with launch overhead kept out, and the run itself replays graphs untouched.
    watch = Profiler() if job.device == "cpu" else None
    yield from stream(job, control, watch)
    remember_warm(job.key)
    if job.stopped:  # no profiling pass either: the visitor or the budget ended the job
        yield job.finish(job.charts(), _text(job.texts), f"Stopped {job.stopped}", stop_reason=job.stopped)
    elif watch is not None:
        where = "timed in the run itself, every step (CPU clock)"
        yield job.finish(job.charts(pd.DataFrame(job.timed_rows), where), None, "Done", after_run=where)
    else:
        yield from profile(job, control)


def stream(job: _Job, control: Control, watch: Profiler | None):
    """The tokens as they come: text first and alone, the summary and charts as their intervals allow. Stops
    early, with job.stopped saying why, when the visitor stops it or its steps so far project past the budget."""
    s, device = job.s, job.device
    sampling = dict(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, repetition_penalty=s.repetition_penalty)
    tokens = timed(
        job.model,
        [job.ids] * s.batch,
        max_new_tokens=s.new_tokens,
        graph=None if s.cuda_graph else False,  # None: a graph wherever one applies
        observer=watch,
        cache=s.cache,
        tiles=s.tiles,
        tokenizer=job.tok,
        seed=s.seed,
        **sampling,
    )
    job.texts = [job.tok.decode(job.ids)] * s.batch
    last_text, last_chart = 0.0, time.monotonic() - CHART_INTERVAL_S[device] + FIRST_CHART_S[device]
    for step in tokens:
        job.steps.append(step)
        if watch is not None:
            job.timed_rows += [
                dict(step=step.index, phase=step.phase, position=step.position, **r) for r in watch.take()
            ]
        job.texts = [t + piece for t, piece in zip(job.texts, step.texts, strict=True)]
        job.waited = job.waited if job.waited is not None else time.time() - job.started
        final = bool(step.stop_reason)
        job.stopped = None if final else control.why() or overrun(s, job.steps, control.deadline - time.monotonic())
        if job.stopped:
            break
        now = time.monotonic()
        if not final and now - last_text < TEXT_INTERVAL_S[device]:
            continue
        update = {"text": _text(job.texts), "status": f"{len(job.steps)} of {s.new_tokens} tokens"}
        # The last step's charts are drawn once, by finish(): on CPU right away, on a GPU with the kernels'
        # profile a fraction of a second later (drawing them here as well would delay either by as long).
        chart = not final and now - last_chart >= CHART_INTERVAL_S[device]
        # The summary table goes with the charts (on a GPU the text comes every few tokens, and a table over
        # every step so far each time would slow the tokens); on CPU, where a token takes most of a second,
        # with every token.
        if chart or device == "cpu":
            update["summary"] = job.summary()[0]
        yield update
        last_text = time.monotonic()
        if chart:
            drawn = job.charts()
            yield {k: v for k, v in drawn.items() if k not in ("frame", "kernels", "gpu")}
            last_chart = time.monotonic()
    tokens.close()


def profile(job: _Job, control: Control):
    """On a GPU, after the run: the kernels a decode step launches counted (once per settings), each kernel timed
    at PROFILED decode positions with launch overhead kept out, and the run finished with them."""
    s, model, ids = job.s, job.model, job.ids
    samples = PROFILED[job.device]
    yield {
        "summary": job.summary(after_run=f"profiling the kernels at {samples + 1} steps…")[0],
        "status": "Profiling…",
    }
    graph = None if s.cuda_graph else False
    positions = len(ids) + s.new_tokens  # the run's cache: its kernels (and graph) serve the steps rebuilt below
    counted_key = estimate.profile_key(s, positions)
    counted = _counted.get(counted_key)
    if counted is None:
        counted = launches.decode_step_launches(
            model, [ids] * s.batch, cache=s.cache, graph=graph, tiles=s.tiles, backend=s.backend, positions=positions
        )
        if len(_counted) >= 256:
            _counted.clear()
        _counted[counted_key] = counted
    try:
        profiled = profile_run(
            model,
            [ids] * s.batch,
            job.steps,
            cache=s.cache,
            tiles=s.tiles,
            backend=s.backend,
            samples=samples,
            stop=control.stopped,
            positions=positions,
        )
        where = metrics.profiled_note(profiled)
    except NoKernelTime as e:
        profiled, where = None, f"not measured: {e}"
    if control.why():
        profiled, where = None, f"not measured: stopped {control.why()}"
    drawn = job.charts(profiled, where if profiled is not None else "")
    yield job.finish(drawn, None, "Done", counted=counted, after_run=where)


# Decode steps timed before a run's length is projected: the first decode step may still warm up (a graph's
# capture, the interpreter's first launch of a kernel), so the projection takes the median of these.
PROJECT_AFTER = 2


def overrun(s: RunSettings, steps, left_s: float) -> str | None:
    """Why the run stops now, if the time its decode steps have taken says the rest will not fit the `left_s`
    seconds left of the budget: the projection and the control to change, or None. Cache-off steps grow with the
    sequence, so the projection from the steps so far is a floor, never a stop too early."""
    decode = [t.latency_ms / 1e3 for t in steps if t.phase == "decode"]
    remaining = s.new_tokens - len(steps)
    if len(decode) < PROJECT_AFTER or remaining <= 0:
        return None
    per = statistics.median(decode)
    if remaining * per <= left_s:
        return None
    total = sum(t.latency_ms for t in steps) / 1e3 + remaining * per
    return (
        f"after {len(steps)} of {s.new_tokens} tokens: at {estimate.shown(per)} a token this run would take about "
        f"{estimate.shown(total)}, past the {estimate.shown(estimate.budget_s())} budget. {faster(s)}"
    )


def faster(s: RunSettings) -> str:
    """The control that would make a slow run's steps cheaper, in a sentence."""
    tiles = s.tiles if s.backend == "triton" else Tiles()
    if tiles.fixed("linear_decode") is not None:
        return "Use larger decode-linear tiles (block N × block K) or fewer new tokens."
    if tiles.fixed("decode_attention") is not None:
        return "Use larger decode-attention tiles (block N) or fewer splits, or fewer new tokens."
    if not s.cache:
        return "Turn the KV cache on (each step without it recomputes the whole sequence), or ask fewer new tokens."
    return "Ask fewer new tokens, or lower the batch or the prompt length."


def ran_s(ran_from: float, steps) -> float:
    """The run's seconds without its warm-up (Triton's compilation, graph capture): the estimate's rate, which
    counts compilation apart, once per kind of work (estimate.compile_s)."""
    return time.monotonic() - ran_from - sum(step.warmup_ms for step in steps) / 1000


def finish(s, model, ids, p, drawn: dict, summary, text, status: str, **extra) -> dict:
    """The run's last update: every chart, the summary, the hierarchy tab and what the page keeps."""
    fusion = metrics.fusion_lessons(
        model.config, max(1, len(ids)), model.dtype.itemsize, s.tiles, model.dtype, model.device
    )
    frame, kernels, gpu = drawn.pop("frame"), drawn.pop("kernels"), drawn.pop("gpu")
    markdown, totals = summary(gpu, **extra)
    timed = extra.get("after_run", "") if kernels.kernel_ms.notna().any() else ""
    update = {
        **drawn,
        "summary": markdown,
        "status": f"{status}: {len(frame)} of {s.new_tokens} tokens.",
        "hierarchy": views.hierarchy(kernels, p, fusion),
        "roofline": views.roofline(kernels, p, timed, gpu=gpu),
        "state": {"steps": frame, "kernels": kernels, "summary": totals},
    }
    if text is not None:
        update["text"] = text
    return update
