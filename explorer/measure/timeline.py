"""What every SM did during one decode step: each program of each kernel as an interval on the SM that ran it, from
the stamps the kernels write when asked (kernels.stamps, kernels.launch.stamping), on a GPU only.

    intervals(launches, values)   the stamping buffer read back, one row per program
    task_intervals(tasks, ...)    the megakernel's tasks read back from the same buffer, one row per task
    idle_share(frame, sms)        SM-time inside no program over the step's window, as a fraction
    most_at_once(frame)           the most programs one SM ran at the same time
    running(frame)                programs and busy SMs over the step, at even instants
    check(frame, launches)        what the GPU run must satisfy: every program of every grid stamped once, each
                                  interval inside the step's window
    record(model, ...)            one decode step run with stamps (after a plain one, to compile), its rows, and
                                  the step's time with and without them (CUDA events, median of several)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kernels.stamps import SLOT

COLUMNS = ["launch", "operation", "kernel", "program", "sm", "start_ns", "end_ns"]


def intervals(launches: list[tuple], values: np.ndarray) -> pd.DataFrame:
    """One row per program: launches as kernels.launch.Stamping records them (kernel, grid dims, first program,
    operation), values the stamping buffer as int64s. Times from the first program's start; `stamped` says
    whether the program wrote both its stamps."""
    rows = []
    for i, (kernel, dims, first, operation) in enumerate(launches):
        programs = dims[0] * dims[1] * dims[2]
        block = values[first * SLOT : (first + programs) * SLOT].reshape(programs, SLOT)
        for p, (start, end, sm) in enumerate(block):
            rows.append((i, operation, kernel.strip("_").removesuffix("_kernel"), p, int(sm), int(start), int(end)))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame["stamped"] = (frame.start_ns > 0) & (frame.end_ns >= frame.start_ns)
    origin = int(frame.start_ns[frame.stamped].min()) if frame.stamped.any() else 0
    frame["start_ns"] -= origin
    frame["end_ns"] -= origin
    frame.attrs["origin_ns"] = origin
    return frame


TASK_COLUMNS = ["launch", "task", "operation", "layer", "program", "sm", "start_ns", "ready_ns", "end_ns"]


def task_intervals(tasks: list[tuple], values: np.ndarray, frame: pd.DataFrame) -> pd.DataFrame:
    """One row per task of each launch whose tasks stamped themselves: tasks as kernels.launch.Stamping keeps them
    ((launch, first slot, (task list, programs)), the task list as kernels.ops.decode_step.tasks gives it), values
    the stamping buffer, frame the launches' programs (intervals()), whose origin the times share. Task g ran on
    program g mod programs; its three stamps are its start, its inputs ready (its wait met) and its arrival."""
    rows = []
    origin = frame.attrs.get("origin_ns", 0)
    for launch, first, (runs, programs) in tasks:
        on = frame[frame.launch == launch].set_index("program").sm
        total = sum(n for _, _, n in runs)
        block = values[first * SLOT : (first + total) * SLOT].reshape(total, SLOT)
        g = 0
        for operation, layer, n in runs:
            for task in range(g, g + n):
                start, ready, end = (int(v) for v in block[task, :3])
                rows.append((launch, task, operation, layer, task % programs, int(on.get(task % programs, -1)),
                             start, ready, end))  # fmt: skip
            g += n
    out = pd.DataFrame(rows, columns=TASK_COLUMNS)
    out["stamped"] = (out.start_ns > 0) & (out.ready_ns >= out.start_ns) & (out.end_ns >= out.ready_ns)
    for column in ("start_ns", "ready_ns", "end_ns"):
        out[column] -= origin
    return out


def check(
    frame: pd.DataFrame, launches: list[tuple], window_ns: float | None = None, tasks: pd.DataFrame | None = None
) -> list[str]:
    """What is wrong with a timeline, if anything: a program that wrote no stamp or ended before it started, a
    launch with another count of programs than its grid, a span from first start to last end longer than the
    step's window_ns (CUDA events around it); a task without its three stamps in order, or outside its program."""
    problems = []
    if tasks is not None and len(tasks):
        if (~tasks.stamped).any():
            problems.append(f"{int((~tasks.stamped).sum())} tasks without a start, a ready and an end in that order")
        ran = frame[["launch", "program", "start_ns", "end_ns"]]
        on = tasks.merge(ran, on=["launch", "program"], how="left", suffixes=("", "_program"))
        outside = ~((on.start_ns_program <= on.start_ns) & (on.end_ns <= on.end_ns_program))  # no program: outside
        if outside.any():
            problems.append(f"{int(outside.sum())} tasks outside the interval of the program that ran them")
    for i, (kernel, dims, _, _) in enumerate(launches):
        got = int((frame.launch == i).sum())
        if got != dims[0] * dims[1] * dims[2]:
            problems.append(
                f"launch {i} ({kernel}): {got} programs stamped, its grid has {dims[0] * dims[1] * dims[2]}"
            )
    unstamped = frame[~frame.stamped] if "stamped" in frame else frame.iloc[:0]
    if len(unstamped):
        problems.append(f"{len(unstamped)} programs without a start and an end")
    stamped = frame[frame.stamped] if "stamped" in frame else frame
    if window_ns is not None and len(stamped) and (stamped.start_ns.min() < 0 or stamped.end_ns.max() > window_ns):
        problems.append(f"intervals outside the step's {window_ns:.0f} ns")
    return problems


def idle_share(frame: pd.DataFrame, sms: int) -> float:
    """The share of the window from the first start to the last end, summed over `sms` SMs, in which an SM ran no
    program (programs that overlap on an SM count once)."""
    if frame.empty:
        return 1.0
    window = frame.end_ns.max() - frame.start_ns.min()
    if window <= 0:
        return 1.0
    busy = 0
    for _, on in frame.groupby("sm"):
        spans = sorted(zip(on.start_ns, on.end_ns, strict=True))
        lo, hi = spans[0]
        for a, b in spans[1:]:
            if a > hi:
                busy += hi - lo
                lo, hi = a, b
            else:
                hi = max(hi, b)
        busy += hi - lo
    return 1.0 - busy / (sms * window)


def most_at_once(frame: pd.DataFrame) -> int:
    """The most programs one SM ran at the same time (an end and a start at one instant: the end first)."""
    most = 0
    for _, on in frame.groupby("sm"):
        events = sorted([(s, 1) for s in on.start_ns] + [(e, -1) for e in on.end_ns])
        running = 0
        for _, change in events:
            running += change
            most = max(most, running)
    return most


def running(frame: pd.DataFrame, points: int = 400) -> pd.DataFrame:
    """Programs running on the whole GPU and SMs running at least one, at `points` even instants from the first
    start to the last end: {"t_us", "programs", "sms"}."""
    if frame.empty:
        return pd.DataFrame({"t_us": [], "programs": [], "sms": []})
    at = np.linspace(frame.start_ns.min(), frame.end_ns.max(), points)
    starts, ends, sm = frame.start_ns.to_numpy(), frame.end_ns.to_numpy(), frame.sm.to_numpy()
    inside = (starts[None, :] <= at[:, None]) & (at[:, None] < ends[None, :])  # instants x programs
    sms = [len(np.unique(sm[row])) for row in inside]
    return pd.DataFrame({"t_us": at / 1e3, "programs": inside.sum(axis=1), "sms": sms})


def record(model, *, context: int, batch: int = 1, repeats: int = 20, graph: bool = False, tiles=None) -> dict:
    """One decode step of `model` (a GPU model at its rung, at `tiles`: explorer.model.ops.Tiles, None for the
    defaults) at `context` tokens, stamped: {"frame": intervals, "tasks": task_intervals (empty but at the
    megakernel rung), "launches", "problems": check(), "step_ms": the median step without stamps, "stamped_ms": with
    them, "sms", "graph"}. Eager: each launch from the host; graph: a CUDA-graph replay of the step
    (kernels.launch.stamping around the capture bakes each launch's slice of the buffer into the graph). Both
    variants run before any timing, so nothing compiles while timed."""
    import torch

    from kernels import launch

    from ..model.cache import KVCache
    from ..model.graphs import DecodeGraph

    device = model.device
    cache = KVCache.for_model(model, batch, context + 2)
    ids = torch.randint(model.config.vocab_size, (batch, context), device=device)
    model.prefill(ids, cache, [context] * batch)
    token = ids[:, -1]
    buffer = torch.zeros(1 << 20, dtype=torch.int64, device=device)
    operation = [""]

    def observe(op, run):
        operation[0] = op.name
        return run()

    def eager(stamped: bool):
        if not stamped:
            return model.decode(token, cache, tiles=tiles, observer=observe), None
        with launch.stamping(buffer) as s:
            s.operations = operation
            out = model.decode(token, cache, tiles=tiles, observer=observe)
        return out, (s.launches, s.tasks)

    if graph:
        cache.set_lengths([context] * batch)
        plain_graph = DecodeGraph(model, cache, tiles=tiles)
        cache.set_lengths([context] * batch)
        with launch.stamping(buffer) as s:
            stamped_graph = DecodeGraph(model, cache, tiles=tiles)
        # the warm-up step's launches, then the capture's, the same step: a replay writes into the capture's
        half = len(s.launches) // 2
        warm, captured = s.launches[:half], s.launches[half:]
        if [w[:2] for w in warm] != [c[:2] for c in captured]:
            raise RuntimeError("the captured step launched other kernels than its warm-up: its stamps cannot be read")
        captured = (captured, [(at - half, first, what) for at, first, what in s.tasks if at >= half])

    def step(stamped: bool):
        cache.set_lengths([context] * batch)  # the same position every time
        if not graph:
            return eager(stamped)[1]
        (stamped_graph if stamped else plain_graph).graph.replay()
        return captured if stamped else None

    if not graph:  # compile both variants before any timing (a graph's capture did)
        step(False)
        step(True)

    def timed(stamped: bool) -> float:
        times = []
        for _ in range(repeats):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            step(stamped)
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end))
        return float(np.median(times))

    plain_ms, stamped_ms = timed(False), timed(True)
    buffer.zero_()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    launches, kept = step(True)
    end.record()
    torch.cuda.synchronize()
    values = buffer.cpu().numpy()
    frame = intervals(launches, values)
    tasks = task_intervals(kept, values, frame)
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    window = begin.elapsed_time(end) * 1e6
    return dict(
        frame=frame,
        tasks=tasks,
        launches=launches,
        problems=check(frame, launches, window, tasks),
        step_ms=plain_ms,
        stamped_ms=stamped_ms,
        sms=sms,
        graph=graph,
    )
