"""What the page shows of a job's results: markdown, tables and figures, from tidy frames and summaries.

Pure functions (plots.py draws the figures); the job worker calls them and sends the page what they
return, figures as plotly JSON, so the server only passes them on.
"""

from __future__ import annotations

import math

import pandas as pd

from kernels.config import TileConfig

from ..measure import metrics
from ..measure.counters import recorded
from . import beside, plots, units
from .counterpart import Counterpart
from .hierarchy import counters_html, hierarchy_html

FUSION_INFO = {
    "none": "none: every operation its own kernel (bias, GELU, residual add apart), as eager PyTorch",
    "epilogue": "epilogue: bias, GELU and residual add in the matmul's epilogue",
    "decode": "decode: LayerNorm in the next matmul's prologue, the cache write in c_attn's epilogue, "
    "split-K and decode attention in one launch each (decode steps)",
    "overlap": "overlap: the decode rung's kernels, each launched to start while the one before finishes and "
    "load its weights meanwhile (programmatic dependent launch; on GPUs before Hopper, as decode)",
    "persistent": "persistent: each block of a decode step in one launch, one program per SM running the decode "
    "rung's five stages, which wait for each other at counters in device memory instead of kernel boundaries",
    "megakernel": "megakernel: a whole decode step in one launch, its operations tasks on one program per SM, each "
    "waiting at counters only for the tiles it reads (attention for its head's q, k and v), weights loaded first",
}


def fusion_label(backend: str, fusion: str) -> str:
    """The summary's row naming the rung the run used."""
    if backend != "triton":
        return "n/a: the torch backend launches PyTorch's own kernels"
    return FUSION_INFO[fusion]


def figure_json(fig) -> str:
    return fig.to_json()


# --- Generate ----------------------------------------------------------------------------------------


def summary_markdown(summary: dict, gpu: Counterpart | None = None) -> str:
    """The run's numbers, each named by its clock; on CPU, beside them, the same job's on a GPU (`gpu`)."""
    if not summary:
        return ""
    timer = summary.get("timer", "")
    cpu = timer.startswith("cpu")
    clock = "CPU clock" if cpu else "device clock, CUDA events"
    rows = _rows(summary, clock)
    if gpu is None:
        head = f"CPU timings ({cpu_clock(timer)}), not GPU timings\n\n" if cpu else ""
        return head + "| measure | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
    timings = {k: v for k, v in _gpu_summary(gpu).items() if k in GPU_TIMINGS}
    theirs = dict(_rows({k: v for k, v in summary.items() if k != "bandwidth_fraction"} | timings, "device clock"))
    head = (
        f"The same job on a GPU beside this CPU's run: **{gpu.label}**. This CPU's times are Python running each "
        "program of every kernel in Triton's interpreter, not a GPU's.\n\n"
    )
    # The GPU first: it is what the lesson is about; the interpreter's clock beside it.
    lines = [f"| measure | {short_gpu(gpu)} | this CPU (interpreter) |", "|---|---|---|"]
    for (k, v), gpu_value in zip(rows, theirs.values(), strict=True):
        lines.append(f"| {k} | {gpu_value if k.split(' (')[0] in GPU_ROWS else ''} | {v} |")
    return head + "\n".join(lines)


# The figures and rows a GPU's answer fills in beside a CPU run: its times, and the rates made of them.
GPU_TIMINGS = ("waited_s", "ttft_ms", "step_ms_p50", "step_ms_p90", "device_tokens_per_s", "achieved_gbs")
GPU_ROWS = {
    "time to first token",
    "first step",
    "decode step p50 / p90",
    "tokens/s at the decode step's pace",
    "achieved bandwidth",
}


def _rows(summary: dict, clock: str) -> list[tuple[str, str]]:
    achieved = summary.get("achieved_gbs")
    measured = achieved is not None and math.isfinite(achieved)
    bandwidth = f"{_number(achieved)} GB/s" if measured else "n/a: needs a measured time (this one is modeled)"
    if "bandwidth_fraction" in summary and measured:
        bandwidth += f" ({summary['bandwidth_fraction']:.0%} of measured peak)"
    memory = summary.get("peak_memory_mb", math.nan)
    p50, p90 = summary["step_ms_p50"], summary["step_ms_p90"]
    rows = [
        ("time to first token (waited, from the click)", _seconds(summary.get("waited_s"))),
        (f"first step (prefill, {clock})", units.duration(summary["ttft_ms"])),
        ("tokens/s delivered (wall clock, first to last token)", _rate(summary.get("wall_tokens_per_s"))),
        (f"decode step p50 / p90 ({clock})", _steps(p50, p90)),
        ("tokens/s at the decode step's pace", _rate(summary.get("device_tokens_per_s"))),
        ("warm-up (compile, first run, graph capture)", f"{summary.get('warmup_ms', 0):.0f} ms, not counted above"),
        ("fusion rung", summary.get("fusion", "")),
        ("decode step launches", _launches(summary)),
        ("bytes per token (modeled): HBM / SM requests", _per_token(summary)),
        ("achieved bandwidth (modeled HBM bytes / step time)", bandwidth),
        ("KV cache", f"{summary['kv_cache_mb']:.2f} MB"),
        ("peak GPU memory (max allocated)", "n/a on CPU" if math.isnan(memory) else f"{memory:.0f} MB"),
        ("stopped", summary.get("stop_reason") or "running"),
    ]
    if summary.get("after_run"):
        rows.append(("kernel times", summary["after_run"]))
    return rows


def _gpu_summary(gpu: Counterpart) -> dict:
    """The timing figures of a GPU counterpart: its recorded summary, or ones made from its modeled steps
    (no wait and no wall-clock rate to model)."""
    if gpu.recorded:
        return gpu.summary
    steps = gpu.tables["steps"]
    decode = steps[steps.phase == "decode"].latency_ms
    first = steps[steps.phase == "prefill"].latency_ms
    p50 = float(decode.median()) if len(decode) else math.nan
    batch = int(steps.batch.iloc[0]) if len(steps) else 1
    return dict(
        waited_s=None,
        ttft_ms=float(first.iloc[0]) if len(first) else math.nan,
        step_ms_p50=p50,
        step_ms_p90=float(decode.quantile(0.9)) if len(decode) else math.nan,
        device_tokens_per_s=1e3 * batch / p50 if p50 > 0 else math.nan,
        achieved_gbs=math.nan,  # a modeled time: bytes over it would only say back what the model assumed
    )


def short_gpu(gpu: Counterpart) -> str:
    return f"{gpu.gpu} ({'recorded' if gpu.recorded else 'modeled'})"


def cpu_clock(timer: str) -> str:
    """What ran on CPU, from a Step's timer ("cpu perf_counter (Triton interpreter)" -> "Triton
    interpreter"); "" for a GPU timer."""
    return timer[timer.find("(") + 1 : -1] if timer.startswith("cpu") else ""


# What a run of one new token (a prefill alone) shows where a decode step's figures would be.
NEEDS_TWO, NO_STEP = "needs two tokens", "no decode step yet"


def _seconds(value) -> str:
    return "" if value is None else f"{value:.2f} s"


def _steps(p50, p90) -> str:
    """A run of one token has no decode step: no blank and no lone slash."""
    if p50 is None or not math.isfinite(p50):
        return NEEDS_TWO
    return f"{units.duration(p50)} / {units.duration(p90)}"


def _per_token(summary: dict) -> str:
    hbm, l2 = summary.get("mb_per_token", math.nan), summary.get("l2_mb_per_token", math.nan)
    if not math.isfinite(hbm):
        return NO_STEP
    return f"{hbm:.2f} MB / {l2:.2f} MB"


def _rate(value) -> str:
    return NEEDS_TWO if value is None or math.isnan(value) else f"{_number(value)} tokens/s"


def _number(x: float) -> str:
    """Three significant digits below a thousand, whole numbers with separators above: 0.755, 32.1, 4,300."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _launches(summary: dict) -> str:
    n = summary.get("operations_per_step", math.nan)
    if math.isnan(n):
        return NO_STEP
    one = n == 1  # the megakernel rung's step
    if summary.get("cuda_graph"):
        how = "replayed as one CUDA graph"
    else:
        how = "launched from Python" if one else "each launched from Python"
    named = f"{n:.0f} named operation{'' if one else 's'}"
    if "kernels_per_step" in summary:
        return (
            f"{summary['kernels_per_step']} GPU kernels + {summary['memory_ops_per_step']} memory operations "
            f"(counted by torch.profiler), from {named}, {how}"
        )
    counted = "kernels are counted on a GPU" if summary.get("timer", "").startswith("cpu") else "counting after the run"
    return f"{named}, {how} ({counted})"


def generation_figures(
    steps: pd.DataFrame,
    kernels: pd.DataFrame,
    peaks,
    previous: pd.DataFrame | None = None,
    profiled: str = "",
    gpu: Counterpart | None = None,
    kv_why: str = "",
) -> dict:
    """The live charts, as JSON by output name; with `previous`, the last run overlaid on latency and KV
    growth; `profiled` says at which positions the kernel times were measured; on CPU, `gpu` is the same
    job's GPU answer (counterpart.py), shown first in every chart of a time; `kv_why` is what one position of
    the cache holds (metrics.kv_why), under the KV chart's title."""
    on_cpu = cpu_clock(steps.timer.iloc[0]) if len(steps) else ""
    note = f"CPU timings ({on_cpu})" if on_cpu else ""
    share_note = "; ".join(n for n in (note, profiled) if n)
    both = steps
    if previous is not None and not previous.empty:
        both = pd.concat([previous.assign(run="previous"), steps.assign(run="this run")], ignore_index=True)
    figures = dict(
        latency=plots.latency_figure(both, note),
        traffic=plots.traffic_figure(kernels, "bytes from each kernel's traffic model at the chosen tiles"),
        kv=plots.kv_figure(both, kv_why),  # bytes and tokens: no timings in it
        share=plots.kernel_share_figure(kernels, share_note, "device time" if peaks else "CPU time"),
        bandwidth=plots.bandwidth_figure(both, peaks.bandwidth_gbs if peaks else None, note),
    )
    if gpu is not None:
        figures |= dict(latency=beside.latency(both, gpu), share=beside.share(gpu), bandwidth=beside.bandwidth(gpu))
    return {name: figure_json(fig) for name, fig in figures.items()}


def roofline(kernels: pd.DataFrame, peaks, profiled: str = "", gpu: Counterpart | None = None) -> str:
    """Each kernel kind's profiled decode and prefill work against the measured ceilings, as JSON; on CPU
    the same job's on a GPU (`gpu`)."""
    if gpu is not None:
        return figure_json(beside.roofline(gpu))  # the GPU's chart: how this CPU's run was timed is not its note
    points = metrics.roofline(kernels, peaks)
    fig = plots.roofline_figure(points, peaks, profiled)
    return figure_json(fig)


def hierarchy_before_a_run() -> str:
    """The tab before any run: the recorded counters already say how far the models go."""
    return '<div class="hierarchy"><p>Generate to see where the bytes go.</p>' + counters_html(*recorded()) + "</div>"


def hierarchy(kernels: pd.DataFrame, peaks, fusion: pd.DataFrame | None) -> str:
    return hierarchy_html(kernels, peaks.bandwidth_gbs if peaks else None, fusion, counters_html(*recorded()))


# --- Tile sweep --------------------------------------------------------------------------------------


def describe(cfg: TileConfig) -> str:
    """block_m=64, block_n=32, num_warps=4: the fields a config sets, as a person would write them."""
    return ", ".join(f"{f}={v}" for f, v in vars(cfg).items() if v is not None)


def best_text(frame: pd.DataFrame, best: TileConfig | None) -> str:
    if best is None:
        return "No valid config in this grid."
    ms = frame[frame.valid].ms.min()
    return f"Fastest valid: **{describe(best)}**, {ms:.3g} ms ({sweep_note(frame)})."


def sweep_view(frame: pd.DataFrame) -> pd.DataFrame:
    """The sweep as a person reads it: fastest first, times in ms as the heatmap shows them, rates rounded
    to what they resolve, a mark for validity."""
    tiles = [c for c in ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages") if c in frame]
    ordered = frame.sort_values("ms", na_position="last")
    view = ordered[tiles].astype("Int64")
    view["runs"] = ["✓" if v else "✗" for v in ordered.valid]
    view["ms"] = ordered.ms.map(_three_digits)
    for column, name in (("gbs", "GB/s"), ("tflops", "TFLOP/s"), ("modeled_mb", "MB (SM requests)")):
        if column in ordered:
            view[name] = ordered[column].map(_three_digits)
    view["why not"] = ordered.reason.str.replace(r"^.*? needs", "needs", regex=True)
    return view.reset_index(drop=True)


def _three_digits(x) -> str:
    """Three significant digits, whatever the magnitude: 0.00123, 1.23, 1230 (a CPU sweep's rates are tiny)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.0f}"


# What the sweep table shows before the first sweep: its columns, no rows.
SWEEP_VIEW_EMPTY = pd.DataFrame(columns=["runs", "ms", "GB/s", "TFLOP/s", "MB (SM requests)", "why not"])


def sweep_note(frame: pd.DataFrame) -> str:
    """How the sweep's rows were timed, e.g. CUDA-graph replays with inputs rotated past L2."""
    return "; ".join(sorted(set(frame.timer.dropna()) - {""})) if "timer" in frame else ""


# --- Compare and the ladder --------------------------------------------------------------------------


COMPARE_EMPTY = pd.DataFrame(
    columns=["backend", "cache", "launch_mode", "prompt_tokens", "ttft_ms", "decode_ms_p50", "last_step_ms"]
)
LADDER_EMPTY = pd.DataFrame(columns=["rung", "kernels (counted)", "launches (modeled)", "MB SM requests", "MB HBM"])


def compare_table(frame: pd.DataFrame, gpu: pd.DataFrame | None = None, gpu_name: str = "") -> pd.DataFrame:
    """One row per run of a sequence sweep: time to first token, decode median and last step; with `gpu`
    (the same runs on a GPU, recorded or modeled), its decode median beside the CPU's, named for the GPU."""
    if gpu is not None:
        ours, theirs = compare_table(frame), compare_table(gpu)
        keys = [k for k in ("backend", "cache", "launch_mode", "prompt_tokens") if k in ours.columns]
        theirs = theirs[[*keys, "decode_ms_p50"]].rename(columns={"decode_ms_p50": f"decode_ms_p50 ({gpu_name})"})
        ours = ours.rename(columns={c: f"{c} (CPU)" for c in ("ttft_ms", "decode_ms_p50", "last_step_ms")})
        return ours.merge(theirs.astype({"prompt_tokens": int}), on=keys, how="left")
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


def ladder_table(frame: pd.DataFrame, gpu_ms=None, gpu_name: str = "") -> pd.DataFrame:
    """The ladder as a person reads it: one row per rung, rounded, with the speed-up over the torch backend.
    On CPU, `gpu_ms` (per rung) is the same step on a GPU, and the speed-up is that GPU's: the interpreter's
    is Python's, not the kernels'."""
    view = frame[["rung", "kernels", "launches_modeled", "l2_mb", "hbm_mb", "step_ms"]].copy()
    view.columns = ["rung", "kernels (counted)", "launches (modeled)", "MB SM requests", "MB HBM", "ms per step"]
    if view["kernels (counted)"].isna().all():  # nothing counts kernels here (no GPU): no column of blanks
        view = view.drop(columns="kernels (counted)")
    times = frame.step_ms
    if gpu_ms is not None:
        view = view.rename(columns={"ms per step": "ms per step (CPU)"})
        times = pd.Series(gpu_ms).to_numpy()
        view[f"ms per step ({gpu_name})"] = times
    torch_ms = dict(zip(frame.rung, times, strict=True)).get("torch")
    if torch_ms:
        view["× torch"] = (torch_ms / times).round(2)
    return view.round(3)
