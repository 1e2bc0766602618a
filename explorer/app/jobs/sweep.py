"""The tile sweep job: every config of a grid timed for one kernel at one shape, a row at a time, by the
one timing method (kernels.timing): CUDA-graph replays over inputs rotated past the L2 on a GPU, one
interpreter call on CPU."""

from __future__ import annotations

from kernels import ahead

from ...measure import sweeps
from .. import gpu_sweeps, models, plots, views
from .base import Control


def recorded_heatmap(kernel: str, x: str, y: str, value: str) -> str | None:
    """The GPU's recorded sweep of `kernel` (at its default GPU shape) as a heatmap's JSON, or None."""
    rec = gpu_sweeps.latest()
    if rec is None or kernel not in rec.frames:
        return None
    frame = rec.frames[kernel]
    best = _best(frame)
    note = f"{rec.label(kernel)}; fastest {views.describe(best)}" if best else rec.label(kernel)
    note += f" ({views.sweep_note(frame)}). The interpreter's sweep of this machine is below it."
    fig = plots.sweep_heatmap(frame, x, y, value, note=note)
    fig.update_layout(title_text=f"{rec.meta['gpu']}, recorded: " + fig.layout.title.text)
    return views.figure_json(fig)


def run(payload: dict, control: Control):
    kernel, shape, dtype = payload["kernel"], payload["shape"], payload["dtype"]
    x, y, value = payload["x"], payload["y"], payload["value"]
    device = models.device()
    if device.type == "cuda" and not control.why():
        yield from _compile_ahead(kernel, shape, models.dtype_of(dtype), device, control)
        if control.why():
            yield {"best": f"Stopped {control.why()}: while compiling, before the first config was timed."}
            return
    timed = sweeps.tile_sweep_rows(kernel, shape, dtype=models.dtype_of(dtype), device=device)
    gpu = recorded_heatmap(kernel, x, y, value) if device.type == "cpu" else None
    rows = []
    for i, n, row in timed:
        rows.append(row)
        frame = sweeps.sweep_frame(kernel, shape, rows)
        best = _best(frame)
        why = control.why()
        status = f"{i + 1} of {n} configs" if i + 1 < n else f"all {n} configs"
        if why and i + 1 < n:
            status = f"stopped {why}: {i + 1} of {n} configs"
        yield {
            "heat": views.figure_json(plots.sweep_heatmap(frame, x, y, value, note=views.sweep_note(frame))),
            "heat_gpu": gpu,
            "table": views.sweep_view(frame),
            "best": f"{views.best_text(frame, best)} Timed: {status}.",
            "state": {"sweep": frame, "best": (kernel, best)},
        }
        if why:
            timed.close()
            return


_AHEAD = set()  # the sweeps (kernel, shape, dtype) whose kernels this process has compiled ahead


def _compile_ahead(kernel, shape, dtype, device, control: Control):
    """Every config's kernels compiled before the first is timed, several at once (kernels.ahead): a sweep
    compiles a kernel per config, one after another where each is first launched. Says so while it runs; once
    per kernel, shape and dtype in a process. Stopped (by the visitor or the budget), it ends within a compile or
    two, and the sweep with it."""
    key = (kernel, tuple(sorted(shape.items())), str(dtype))
    if key in _AHEAD:
        return
    launches = ahead.distinct(sweeps.sweep_launches(kernel, shape, dtype=dtype, device=device))
    if not launches:
        return
    threads = min(ahead.workers(), len(launches))
    yield {"best": f"Compiling the sweep's {len(launches)} kernels for this GPU, {threads} at a time…"}
    done = ahead.compile_ahead(launches, threads, stop=lambda: control.why() is not None)
    if done.launches == len(launches):
        _AHEAD.add(key)
    yield {"best": f"Compiled {done.launches} kernels in {done.seconds:.1f} s; timing the first config…"}


def _best(frame):
    try:
        return sweeps.best_config(frame)
    except ValueError:
        return None
