"""The Compare tab's jobs: generations across prompt lengths with the cache on and off on both backends
(and, on a GPU, launched one by one and replayed from a CUDA graph), and the fusion ladder, one decode
step per rung."""

from __future__ import annotations

import pandas as pd

from ...measure import metrics
from ...measure.ladder import RUNGS, ladder_rows
from ...measure.sweeps import sequence_runs
from ...model.weights import load_model
from .. import beside, counterpart, models, plots, views
from ..settings import RunSettings
from .base import Control
from .generate import check_tiles

LADDER_CONTEXT = {"cuda": 1000, "cpu": 16}  # keys in the cache at the ladder's timed decode step


def run(payload: dict, control: Control):
    s: RunSettings = payload["settings"]
    lengths: list[int] = payload["lengths"]
    models.check_fits(s.model)
    model, _ = load_model(s.model, device=models.device(), dtype=models.dtype_of(s.dtype))
    model = model.with_fusion(s.fusion)
    for n in sorted(set(lengths)):  # tiles this device cannot run are refused before the first run, as Generate's are
        check_tiles(model, s.tiles, 1, n, n + s.new_tokens)
    fusion = metrics.fusion_lessons(
        model.config, max(lengths), model.dtype.itemsize, s.tiles, model.dtype, model.device
    )
    yield {"fusion": views.figure_json(plots.fusion_figure(fusion))}
    # With the CUDA graph box ticked on a GPU, cache-on runs go both ways: launched one by one and replayed
    # from a graph (cache-off runs cannot replay: every step has a new shape).
    graphs = (False, True) if s.cuda_graph and model.device.type == "cuda" else (False,)
    runs = sequence_runs(model, lengths, s.new_tokens, tiles=s.tiles, graphs=graphs)
    frames = []
    for i, n, frame in runs:
        frames.append(frame)
        why = control.why()
        status = f"{i + 1} of {n} runs" if i + 1 < n else f"all {n} runs"
        if why and i + 1 < n:
            status = f"stopped {why}: {i + 1} of {n} runs"
        both = pd.concat(frames, ignore_index=True)
        gpu = counterpart.for_compare(s, lengths, both) if model.device.type == "cpu" else None
        if gpu is not None:
            note = counterpart.cache_note(gpu.tables["compare"], gpu.gpu) if gpu.recorded else ""
            figure = beside.compare(both, gpu, f"{status}. {note}" if note else status)
            table = views.compare_table(both, gpu.tables["compare"], beside.short(gpu))
        else:
            note = "; ".join(x for x in ("" if model.device.type == "cuda" else "CPU interpreter timings", status) if x)
            figure, table = plots.compare_figure(both, note), views.compare_table(both)
        yield {
            "plot": views.figure_json(figure),
            "table": table,
            "status": status,
            "state": {"compare": both},
        }
        if why:
            runs.close()
            return


def ladder(payload: dict, control: Control):
    s: RunSettings = payload["settings"]
    models.check_fits(s.model)
    model, _ = load_model(s.model, device=models.device(), dtype=models.dtype_of(s.dtype))
    context = payload.get("context") or min(LADDER_CONTEXT[model.device.type], model.config.n_positions - 1)
    rows = []
    measured = ladder_rows(model, context=context, batch=s.batch)
    for i, row in enumerate(measured):
        rows.append(row)
        n = len(RUNGS)
        why = control.why()
        status = f"{i + 1} of {n} rungs" if i + 1 < n else f"all {n} rungs"
        if model.RUNS_AS:  # the one-launch block and step are GPT-2's
            runs_as = " and ".join(f"the {rung} rung as {other}" for rung, other in model.RUNS_AS.items())
            status += f"; a {model.family} model runs {runs_as}"
        if why and i + 1 < n:
            status = f"stopped {why}: {i + 1} of {n} rungs"
        frame = pd.DataFrame(rows)
        note = "; ".join(x for x in (frame.timer.iloc[-1], status) if x)
        gpu = counterpart.for_ladder(s, context, frame) if model.device.type == "cpu" else None
        if gpu is not None:
            ms = gpu.tables["ladder"].set_index("rung").step_ms.reindex(frame.rung)
            note = f"{gpu.label}; right: {beside.INTERPRETER}. {status}"
            figure = plots.ladder_figure(frame, note, ms, beside.short(gpu))
            table = views.ladder_table(frame, ms, beside.short(gpu))
        else:
            figure, table = plots.ladder_figure(frame, note), views.ladder_table(frame)
        yield {
            "plot": views.figure_json(figure),
            "table": table,
            "status": status,
            "state": {"ladder": frame},
        }
        if why:
            measured.close()
            return
