"""What the page's events do: check what was sent (settings.py, validate.py), refuse a job whose estimate
exceeds the time budget (estimate.py), then pass the job's updates from the runner to the page.

A handler runs in the server; the job runs in the worker (runner.py). Handlers are async generators, so
that Stop, a closed tab or the API's cancel reaches the job at once: the runner asks it to stop and, if
it does not within a few seconds, ends its worker; the event ends only when the work has.
"""

from __future__ import annotations

import functools
import html
import inspect
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import gradio as gr
from gradio.components.plot import PlotData

from . import estimate, exports, lessons, runner, settings, validate
from .errors import UserError
from .models import Policy, dtype_choices
from .runner import Job

NEW_STATE = {"steps": None, "kernels": None, "previous": None, "sweep": None, "compare": None, "ladder": None}
GENERATE_OUT = ["text", "summary", "latency", "traffic", "kv", "share", "bandwidth", "hierarchy", "roofline", "status"]
SWEEP_OUT = ["heat", "table", "best", "heat_gpu"]
COMPARE_OUT = ["plot", "fusion", "table", "status"]
LADDER_OUT = ["plot", "table", "status"]
OCCUPANCY_OUT = ["occupancy", "tile_reads"]
PLOTS = {"latency", "traffic", "kv", "share", "bandwidth", "roofline", "heat", "heat_gpu", "plot", "fusion"}
SHOWN_WHEN_SENT = {"tile_reads"}  # plots hidden until their job sends one, then shown
EXPORTS = {
    "last run: steps": "steps",
    "last run: kernels": "kernels",
    "tile sweep": "sweep",
    "compare": "compare",
    "fusion ladder": "ladder",
}


@dataclass
class Context:
    """What the handlers share for one server: the runner, the operator's policy, the device."""

    runner: object
    policy: Policy = field(default_factory=Policy)
    device: str = "cpu"  # "cuda" | "cpu"
    lesson_picks: dict = field(default_factory=dict)  # per browser session: how many lessons it has picked

    def dynamic(self) -> dict:
        """The choices that depend on the operator or the device."""
        return {"model": self.policy.choices(), "dtype": dtype_choices()}


def api(names: list[str], fn):
    """fn(values: dict, *rest) as a Gradio handler whose first parameters are `names`, so that API clients
    pass them by name, followed by fn's own other parameters (the page's state)."""
    rest = list(inspect.signature(fn).parameters.values())[1:]
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    # Gradio fills a parameter annotated gr.Request itself; the annotation must be the class, not its name.
    rest = [p.replace(annotation=gr.Request) if p.name == "request" else p for p in rest]

    if inspect.isasyncgenfunction(fn):  # Gradio streams only what it sees as a generator function

        @functools.wraps(fn)
        async def handler(*args):
            runner.ASKED.set(time.time())
            async for out in fn(dict(zip(names, args, strict=False)), *args[len(names) :]):
                yield out
    else:

        @functools.wraps(fn)
        def handler(*args):
            return fn(dict(zip(names, args, strict=False)), *args[len(names) :])

    handler.__signature__ = inspect.Signature([*params, *rest])
    return handler


def fail(e: UserError):
    return gr.Error(str(e), print_exception=False)


def outputs(view: dict, names: list[str]) -> tuple:
    """The job's view so far (every update merged, by output name) as the event's outputs, in order; those
    it has not shown yet stay as they are. Every later yield repeats the values already shown: Gradio sends
    the page only what changed, and the last yield is the whole result an API client gets. Figures arrive
    as plotly JSON and go to the page as they are."""
    out = []
    for n in names:
        if n not in view:
            out.append(gr.skip())
        elif n in SHOWN_WHEN_SENT:
            out.append(gr.update(value=PlotData(type="plotly", plot=view[n]), visible=True))
        elif n in PLOTS and isinstance(view[n], str):
            out.append(PlotData(type="plotly", plot=view[n]))
        else:
            out.append(view[n])
    return tuple(out)


async def run_job(ctx: Context, kind: str, payload: dict, seconds: float, compiles=()):
    """The job's updates through the runner, once its estimate is within the time budget; at its end the
    kinds of work it `compiles` (estimate.compiled) count as compiled for the next estimate."""
    budget = estimate.budget_s()
    if seconds > budget:
        raise UserError(
            f"This would take about {estimate.shown(seconds)} here, and one run may take at most "
            f"{estimate.shown(budget)}. {estimate.advice(kind)}"
        )
    view: dict = {}
    async for update in ctx.runner.run(Job(kind, payload, budget, seconds)):
        view |= update
        yield view
    estimate.compiled(ctx.device, compiles)


@dataclass
class Plan:
    """A job as its endpoint's checks make it: its payload, about how long it takes (refused past the time
    budget), the kinds of work it leaves compiled, and what the page keeps and shows of it besides its views."""

    payload: dict
    seconds: float
    compiles: Iterable = ()
    keep: Callable[[dict, dict], dict] = lambda state, new: {**state, **new}  # the page's state with the job's
    done: Callable[[dict], None] = lambda view: None  # the job ended by itself, its view (every update merged)
    first: tuple | None = None  # what the page shows before the job's first update
    after: tuple = ()  # outputs after the job's own, the same all through the run
    current: Callable[[], bool] = lambda: True  # False once the page has asked for another job in its place


def job(ctx: Context, kind: str, plan: Callable, shown: list[str], page: str = "state", about: str | None = None):
    """The handler of a job endpoint: `plan(ctx, values, page)` checks what was sent and says what to run (a
    Plan); the job's views go to the `shown` outputs as they come, then `page`: "state", the page's state (the
    job's own merged in, as the last output), or "request", Gradio's request (the endpoint keeps no state). A
    refusal or failure, in the checks or in the job, is one message (gr.Error). `about`: the API's description."""
    keeps = page == "state"

    async def handler(values: dict, arg=None):
        try:
            state = dict(arg or NEW_STATE) if keeps else None
            p = plan(ctx, values, state if keeps else arg)
            if p.first is not None:
                yield p.first
            view: dict = {}
            async for view in run_job(ctx, kind, p.payload, p.seconds, p.compiles):
                if not p.current():
                    return  # closing the job's updates stops it
                if keeps and "state" in view:
                    state = p.keep(state, view.pop("state"))
                yield (*outputs(view, shown), *p.after, *((state,) if keeps else ()))
            p.done(view)
        except UserError as e:
            raise fail(e) from None

    # Gradio reads a handler's parameters (it fills one annotated gr.Request itself), its name and its docstring
    # (the API's description).
    kind_ = inspect.Parameter.POSITIONAL_OR_KEYWORD
    second = inspect.Parameter(page, kind_) if keeps else inspect.Parameter(page, kind_, default=None)
    handler.__annotations__ = {"values": dict} | ({} if keeps else {page: gr.Request})
    handler.__signature__ = inspect.Signature([inspect.Parameter("values", kind_), second])
    handler.__name__ = handler.__qualname__ = kind
    handler.__doc__ = about
    return handler


def plan_generate(ctx: Context, values: dict, state: dict) -> Plan:
    s = settings.parse(values, ctx.dynamic())
    overlay = settings.check("overlay", values["overlay"])
    ctx.policy.check(s.model)
    units = estimate.generation_units(s, ctx.device)
    overlaid = overlays(overlay, state)
    seconds = estimate.generation_seconds(s, ctx.device, overlaid)
    keys = estimate.generation_keys(s)
    compile_s = estimate.compile_s(ctx.device, keys)  # what the job's process, if new, cannot know
    compiling = compile_s > 0
    previous = state.get("steps") if overlay else None
    payload = dict(settings=s, previous=previous, started=time.time(), compile_s=compile_s)

    def done(view: dict) -> None:
        # The run's own seconds, a model's first load left out, are the next estimate's rate; a run that
        # compiled kernels along the way (new lengths, a new model) would make that rate seconds too slow.
        ran = view.get("ran_s")
        if ran is not None and not compiling:
            ran -= estimate.OVERLAY_S[ctx.device] if overlaid else 0
            estimate.record(ctx.device, s.backend, units, ran, key=estimate.rate_key(s))

    def keep(state: dict, new: dict) -> dict:
        return {**state, "previous": state.get("steps"), **new}

    return Plan(payload, seconds, keys, keep=keep, done=done)


def plan_sweep(ctx: Context, values: dict, state: dict) -> Plan:
    kernel = settings.check("kernel", values["kernel"])
    dtype = settings.check("dtype", values["dtype"], ctx.dynamic())
    shape = validate.shape("shape", validate.text("shape", values["shape"]), estimate.sweep_keys(kernel))
    axes = estimate.sweep_axes(kernel)
    x, y = validate.choice("x", values["x"], axes), validate.choice("y", values["y"], axes)
    if x == y:
        raise UserError(f"x and y are both {x}: pick two different tile fields to lay the sweep out.")
    value = settings.check("value", values["value"])
    estimate.check_sweep_inputs(kernel, shape, settings.ITEMSIZE[dtype], ctx.device)
    payload = dict(kernel=kernel, shape=shape, dtype=dtype, x=x, y=y, value=value)
    seconds = estimate.sweep_s(kernel, shape, ctx.device, dtype)
    return Plan(payload, seconds, estimate.sweep_compiles(kernel, shape, dtype))


def plan_compare(ctx: Context, values: dict, state: dict) -> Plan:
    s = settings.parse(values, ctx.dynamic())
    lengths = settings.check("lengths", values["lengths"])
    ctx.policy.check(s.model)
    estimate.check_lengths(s.model, lengths, s.new_tokens)
    seconds, keys = estimate.compare_seconds(s, lengths, ctx.device), estimate.compare_keys(s, lengths)
    return Plan(dict(settings=s, lengths=lengths), seconds, keys)


def plan_ladder(ctx: Context, values: dict, state: dict) -> Plan:
    dynamic = ctx.dynamic()
    s = settings.RunSettings(
        model=settings.check("model", values["model"], dynamic),
        dtype=settings.check("dtype", values["dtype"], dynamic),
        batch=settings.check("batch", values["batch"]),
    )
    ctx.policy.check(s.model)
    return Plan(dict(settings=s), estimate.ladder_seconds(s, ctx.device), estimate.ladder_keys(s))


def plan_occupancy(ctx: Context, values: dict, state: dict) -> Plan:
    """Every Triton launch of a prefill and a decode step at the page's settings, compiled for the GPU (on a CPU,
    the one the page stands for): programs per SM and waves."""
    from .jobs.occupancy import target

    s = settings.parse(values, ctx.dynamic())
    ctx.policy.check(s.model)
    if s.backend != "triton":
        raise UserError("The torch backend launches PyTorch's own kernels, which are not compiled here: pick triton.")
    try:
        arch, gpu, note = target(ctx.device)
    except ValueError as e:
        raise UserError(str(e)) from None
    payload = dict(settings=s, arch=arch, gpu=gpu, note=note)
    return Plan(payload, estimate.OCCUPANCY_S[ctx.device], keep=lambda state, new: state)


LESSON_ABOUT = (  # the /lesson endpoint's description for API clients
    "A lesson's job; another lesson picked on the same page meanwhile ends it (the pick's own job\n"
    "runs next), since a visitor who picks another lesson wants that one, not the one before."
)


def plan_lesson(ctx: Context, values: dict, request: gr.Request | None) -> Plan:
    """The lesson's recorded side is shown from the start, beside its run; a newer pick on the page ends it."""
    session = getattr(request, "session_hash", None)
    mine = ctx.lesson_picks.get(session)
    name = validate.choice("lesson", values["lesson"], lessons.names())
    text, figure = lessons.recorded_view(name)
    recorded = (text, gr.update(value=figure, visible=figure is not None))
    seconds = lessons.estimate(name, ctx.runner.compiled)
    title = lessons.LESSONS[name].title.lower()
    return Plan(
        dict(lesson=name),
        seconds,
        lessons.compiles(name),
        done=lambda view: lessons.ran(name, view.get("ran_s")),
        first=(f"*Running {title} ({estimate.about(seconds, ctx.device)})…*", None, *recorded),
        after=recorded,
        current=lambda: ctx.lesson_picks.get(session) == mine,
    )


def export(values: dict, state):
    try:
        which = validate.choice("table", values["which"], EXPORTS)
        fmt = validate.choice("format", values["fmt"], ["csv", "json"])
        made = [label for label, key in EXPORTS.items() if (state or {}).get(key) is not None]
        if which not in made and made:
            raise UserError(f"Nothing to export yet as {which}: run it first, or export {' or '.join(made)}.")
        return exports.export((state or {}).get(EXPORTS[which]), EXPORTS[which], fmt)
    except UserError as e:
        raise fail(e) from None


def make(ctx: Context) -> dict:
    """The handlers of the page's jobs, bound to this server's context, by endpoint name."""
    return dict(
        generate=job(ctx, "generate", plan_generate, GENERATE_OUT),
        sweep=job(ctx, "sweep", plan_sweep, SWEEP_OUT),
        compare=job(ctx, "compare", plan_compare, COMPARE_OUT),
        ladder=job(ctx, "ladder", plan_ladder, LADDER_OUT),
        lesson=job(ctx, "lesson", plan_lesson, ["text", "plot"], page="request", about=LESSON_ABOUT),
        occupancy=job(ctx, "occupancy", plan_occupancy, OCCUPANCY_OUT),
        export=export,
    )


# --- events that run no job --------------------------------------------------------------------------

# The controls a lesson may set, in the order pick_lesson returns them.
LESSON_CONTROLS = ["model", "prompt_tokens", "new_tokens", "dtype", "backend", "cache", "cuda_graph", "kernel"]


def stopped(summary: str, status: str = "") -> tuple[str, str]:
    """The summary and status line after Stop: the run did not reach its end, and the table's "stopped" row
    says so (its last column, this run's, also where a GPU's answer stands beside it)."""
    summary = re.sub(r"^(\| stopped .*)\| running \|$", r"\1| by you, before the end |", summary or "", flags=re.M)
    made = re.fullmatch(r"(\d+) of (\d+) tokens", (status or "").strip())
    status = f"Stopped by you after {made[1]} of {made[2]} tokens." if made else "Stopped by you."
    return summary, status


def picker(ctx: Context):
    """pick_lesson, counting the page's picks: a lesson still running for this page sees it was superseded."""

    def pick(name, request: gr.Request = None):
        session = getattr(request, "session_hash", None)
        ctx.lesson_picks[session] = ctx.lesson_picks.get(session, 0) + 1
        return pick_lesson(name)

    return pick


def pick_lesson(name):
    """A lesson picked: its introduction, and the app's controls set to its job."""
    if name is None:
        return "Pick a lesson above.", *(gr.skip() for _ in LESSON_CONTROLS)
    try:
        name = validate.choice("lesson", name, lessons.names())
    except UserError as e:
        raise fail(e) from None
    chosen = lessons.LESSONS[name]
    values = chosen.controls(chosen.settings(lessons.size()))
    return lessons.intro(name), *(gr.update(value=values[c]) if c in values else gr.skip() for c in LESSON_CONTROLS)


def open_link(request: gr.Request):
    """/?lesson=kv-cache: the Lessons tab, with that lesson picked (which runs it). The name is a visitor's
    text: shown escaped and cut short, never as markup."""
    name = request.query_params.get("lesson") if request is not None else None
    if name is None:
        return gr.skip(), gr.skip()
    if name not in lessons.LESSONS:
        shown = html.escape(name if len(name) <= 80 else name[:77] + "...")
        gr.Warning(f"There is no lesson '{shown}'; the lessons are {', '.join(lessons.names())}.")
        return gr.Tabs(selected="lessons"), gr.skip()
    return gr.Tabs(selected="lessons"), gr.update(value=name)


def generate_estimate(ctx: Context, values: dict) -> str:
    """The note under Generate: about how long these settings take here (nothing while a value is invalid)."""
    try:
        s = settings.parse(values, ctx.dynamic())
    except UserError:
        return ""
    return estimate.generation_note(s, ctx.device, overlays(values.get("overlay"), values.get("state")))


def overlays(overlay, state) -> bool:
    """Whether a Generate's charts will draw the previous run's lines: the overlay box ticked and a run in the
    page's state."""
    return bool(overlay) and (state or {}).get("steps") is not None


def compare_estimate(ctx: Context, values: dict) -> str:
    """The note under Compare: about how long its runs take here."""
    try:
        s = settings.parse(values, ctx.dynamic())
        lengths = settings.check("lengths", values["lengths"])
    except UserError:
        return ""
    return estimate.compare_note(s, lengths, ctx.device)
