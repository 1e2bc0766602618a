"""The Gradio app's layout and wiring: a control per Field of settings.py, a short function per tab, each
event wired to a handler of handlers.py. No torch here."""

from __future__ import annotations

import gradio as gr

from . import exports, failed, gpu_sweeps, handlers, lessons, timelines, views
from .handlers import Context, api
from .models import default_dtype
from .settings import EXAMPLES, FIELDS, RUN, TILE_CHOICES, TILES, defaults, shape_text

THEME = gr.themes.Soft(primary_hue="indigo")
CSS = """
.gradio-container {max-width: 1400px !important}
.hierarchy table {border-collapse: collapse; margin: 0.5em 0}
.hierarchy td, .hierarchy th {border: 1px solid #ccc; padding: 4px 10px; text-align: right}
.hierarchy td:first-child, .hierarchy th:first-child {text-align: left}
#out textarea {font-family: ui-monospace, monospace}
.lesson-text {font-size: 1.15em}
#summary table td:not(:first-child), #summary table th:not(:first-child) {min-width: 8em}
"""
# Talk mode (/?talk=1), for a 1280x720 projector read from the back of a room: larger type, no introduction, and
# on each tab what is being explained in one screen. Generate: the status, the latency chart under it (drawn at 85%:
# a run beside a modeled GPU has a note of three lines over the chart, which at full size pushed the summary past
# the screen's bottom), the text and the summary side by side under that, the controls in a column of their own
# on the right that scrolls by itself.
# A lesson: its chart (drawn at three quarters) and its explanation side by side under the picker, the introduction
# left out (the explanation opens with the lesson's title), the recorded GPU run below. The summary's opening
# sentence is left out too: its table's columns name the GPU and this CPU.
CSS += """
body.talk .gradio-container {max-width: 100% !important; padding: 0 10px !important; font-size: 18px;
  --text-md: 18px; --text-lg: 20px; --text-sm: 15px; --block-padding: 4px 8px; --layout-gap: 6px}
body.talk #intro, body.talk #header {display: none}
body.talk #generate-row {flex-wrap: nowrap}
body.talk #controls {order: 2; flex: 0 0 320px !important; min-width: 320px !important;
  max-height: calc(100vh - 56px); overflow-y: auto}
body.talk #outputs {order: 1; display: grid !important; grid-template-columns: 1fr 1fr; align-content: start}
body.talk #outputs > * {grid-column: 1 / 3}
body.talk #outputs > #generate-status {grid-row: 1; min-height: 0}
body.talk #outputs > #latency-plot {grid-row: 2; zoom: 0.85}
body.talk #outputs > .form:has(#out) {grid-column: 1 / 2; grid-row: 3}
body.talk #outputs > #summary {grid-column: 2 / 3; grid-row: 3; max-height: 170px; overflow-y: auto; font-size: 15px}
body.talk #out textarea {height: 110px !important; font-size: 18px}
body.talk #summary p {display: none}
body.talk #summary * {font-size: 15px}
body.talk #summary table {table-layout: fixed; width: 100%}
body.talk #summary table td, body.talk #summary table th {min-width: 0 !important; padding: 2px 6px}
body.talk #summary table th:first-child {width: 40%}
body.talk #lesson-picker label {padding: 2px 8px}
body.talk #lesson-intro {display: none}
body.talk #lesson-plot {zoom: 0.75}
body.talk #lesson-live-row {flex-wrap: wrap}
body.talk #lesson-live-col {min-width: 100% !important; display: grid !important; grid-template-columns: 60% 40%;
  align-items: start}
body.talk #lesson-live {max-height: calc(100vh - 250px); overflow-y: auto; font-size: 18px}
"""
TALK_JS = """() => {
    if (new URLSearchParams(window.location.search).get("talk") === "1") document.body.classList.add("talk");
}"""
INTRO = """# Triton Decoder Explorer
A small decoder (GPT-2, or a Llama-family block) generating token by token on our own Triton kernels. GPU speed is
mostly about moving bytes between HBM and on-chip SRAM: pick tiles, fusion and the KV cache, and watch latency,
memory traffic and the cache change. On a GPU, untick *CUDA graph* to see what launching every
kernel from Python costs."""
# One job at a time, the others wait with their place shown; a click while the page's own job still runs
# (its profiling pass, say) is kept and runs next, not dropped.
GPU = dict(concurrency_id="gpu", concurrency_limit=1, trigger_mode="always_last")
NO_GRAPHS = "CUDA graphs need a GPU: on this CPU every kernel is launched from Python"
EXAMPLE_LABELS = [e.replace("\n", " ⏎ ") for e in EXAMPLES]  # the newlines shown, not collapsed


def raw(component):
    """The component's value reaches the handler exactly as an API client sent it, so that validate.py
    says what is wrong with it: Gradio's own checks refuse a wrong type or an unknown choice with a
    generic message that echoes the whole value, and gr.Textbox turns 5 into "5" silently. (An instance
    attribute, not a subclass: Gradio writes a .pyi stub beside any module that subclasses a component.)"""
    component.preprocess = lambda payload: payload
    return component


def control(ctx: Context, name: str, **kw):
    """The control of settings.FIELDS[name]: its label, bounds, choices and this device's default."""
    f = FIELDS[name]
    value = kw.pop("value", defaults(ctx.device, {"model": ctx.policy.default, "dtype": default_dtype()})[name])
    choices = list(ctx.dynamic().get(name, f.choices))
    common = dict(label=f.label, info=f.info or None) | kw
    if f.widget == "dropdown":
        return raw(gr.Dropdown(choices, value=value, **common))
    if f.widget == "radio":
        return raw(gr.Radio(choices, value=value, **common))
    if f.widget == "slider":
        return raw(gr.Slider(f.lo, f.hi, value, step=f.step, **common))
    if f.widget == "number":
        return raw(gr.Number(value, precision=0, **common))
    if f.widget == "checkbox":
        return raw(gr.Checkbox(value, **common))
    return raw(gr.Textbox(value, **common))


# explorer.model.ops: no config reaches the one-launch forms (a Llama runs the persistent rung as overlap)
ONE_LAUNCH_TILES = (
    "The megakernel rung's decode step and the persistent rung's GPT-2 blocks choose their own tiles: "
    "these set every prefill's and the other rungs' launches."
)


def _tile_controls(ctx: Context) -> dict:
    """One dropdown per tile field ('default' or a power of two) and an autotune box per kernel."""
    out = {}
    for kernel, fields in TILE_CHOICES.items():
        # The kernel's name above its controls, which wrap at a width that fits "num_stages" and "default".
        gr.Markdown(f"**{kernel.replace('_', ' ')}**")
        with gr.Row():
            for name in [*fields, "autotune"]:
                out[f"{kernel}_{name}"] = control(ctx, f"{kernel}_{name}", label=name, min_width=120)
    return out


def _generate_tab(ctx: Context) -> dict:
    c: dict = {}
    gpu = ctx.device == "cuda"
    with gr.Row(elem_id="generate-row"):
        with gr.Column(scale=1, min_width=340, elem_id="controls"):
            c["model"] = control(ctx, "model")
            c["prompt"] = control(ctx, "prompt", lines=3)
            gr.Examples([[e] for e in EXAMPLES], [c["prompt"]], label="examples", example_labels=EXAMPLE_LABELS)
            for name in ("prompt_tokens", "new_tokens", "batch"):
                c[name] = control(ctx, name)
            with gr.Row():
                c["dtype"], c["backend"] = control(ctx, "dtype"), control(ctx, "backend")
            c["fusion"] = control(ctx, "fusion")
            with gr.Row():
                c["cache"] = control(ctx, "cache")
                c["cuda_graph"] = control(
                    ctx, "cuda_graph", value=gpu, interactive=gpu, info=None if gpu else NO_GRAPHS
                )
                c["overlay"] = control(ctx, "overlay")
            with gr.Accordion("sampling", open=False):
                for name in ("temperature", "top_k", "top_p", "repetition_penalty", "seed"):
                    c[name] = control(ctx, name)
            with gr.Accordion("tiles (default, a power of two, or autotune)", open=False):
                gr.Markdown(ONE_LAUNCH_TILES)
                c |= _tile_controls(ctx)
                where = "the H200" if ctx.device == "cpu" else "this GPU"
                c["occupancy_go"] = gr.Button(f"Programs per SM on {where}", size="sm")
                recorded = timelines.latest()
                c["timeline_go"] = gr.Button(
                    f"One decode step on the {recorded.meta['gpu'] if recorded else 'GPU'}'s SMs (recorded)",
                    size="sm",
                    visible=recorded is not None,
                )
            with gr.Row():
                c["go"] = gr.Button("Generate", variant="primary")
                c["stop"] = gr.Button("Stop")
            c["note"] = gr.Markdown()
        with gr.Column(scale=2, elem_id="outputs"):
            c["status"] = gr.Markdown(elem_id="generate-status")
            c["text"] = gr.Textbox(label="output", lines=8, elem_id="out")
            c["summary"] = gr.Markdown(elem_id="summary")
            c["occupancy"] = gr.Markdown(elem_id="occupancy")  # the tiles' programs per SM, when asked
            c["tile_reads"] = gr.Plot(show_label=False, visible=False, elem_id="tile-reads")  # and their reads
            c["timeline"] = gr.Plot(show_label=False, visible=False, elem_id="sm-timeline")  # a recorded step
            if gpu:
                with gr.Row():
                    c["latency"], c["traffic"] = (
                        gr.Plot(show_label=False, elem_id="latency-plot"),
                        gr.Plot(show_label=False),
                    )
                with gr.Row():
                    c["kv"], c["share"] = gr.Plot(show_label=False), gr.Plot(show_label=False)
                c["bandwidth"] = gr.Plot(show_label=False)
            else:  # the latency chart holds two panels, the GPU's and the interpreter's: a whole row
                c["latency"] = gr.Plot(show_label=False, elem_id="latency-plot")
                with gr.Row():
                    c["traffic"], c["kv"] = gr.Plot(show_label=False), gr.Plot(show_label=False)
                with gr.Row():
                    c["share"], c["bandwidth"] = gr.Plot(show_label=False), gr.Plot(show_label=False)
    return c


def _lessons_tab(ctx: Context) -> dict:
    c: dict = {}
    c["lesson"] = raw(
        gr.Radio(
            lessons.choices(),
            value=None,
            label="lessons: one click sets the controls, runs the lesson and explains what it measured",
            elem_id="lesson-picker",
        )
    )
    with gr.Row():
        c["intro"] = gr.Markdown("Pick a lesson above.", elem_id="lesson-intro")
        c["again"] = gr.Button("Run the lesson again", scale=0, min_width=220)
    # Each side: its chart, then what it measured. Without a GPU, the GPU recording beside the run.
    with gr.Row(equal_height=False, elem_id="lesson-live-row"):
        with gr.Column(elem_id="lesson-live-col"):
            c["plot"] = gr.Plot(show_label=False, elem_id="lesson-plot")
            c["text"] = gr.Markdown(elem_classes="lesson-text", elem_id="lesson-live")
        with gr.Column(visible=ctx.device != "cuda"):
            c["recorded_plot"] = gr.Plot(show_label=False, visible=False, elem_id="lesson-recorded-plot")
            c["recorded"] = gr.Markdown(elem_classes="lesson-text", elem_id="lesson-recorded")
    return c


def _sweep_tab(ctx: Context) -> dict:
    c: dict = {}
    axes = list(handlers.estimate.sweep_axes("attention"))
    with gr.Row():
        c["kernel"] = control(ctx, "kernel")
        c["shape"] = raw(gr.Textbox(shape_text("attention", ctx.device), label="shape"))
        c["dtype"] = control(ctx, "dtype")
    with gr.Row():
        c["x"] = raw(gr.Dropdown(axes, value=axes[0], label="x"))
        c["y"] = raw(gr.Dropdown(axes, value=axes[1], label="y"))
        c["value"] = control(ctx, "value")
    with gr.Row():
        c["go"] = gr.Button("Run sweep", variant="primary")
        c["stop"] = gr.Button("Stop")
        c["use"] = gr.Button("Use best in Generate")
    c["best"] = gr.Markdown()
    # Without a GPU, the GPU's recorded sweep of the kernel (where one is shipped) first, then the interpreter's.
    recorded = ctx.device == "cpu" and gpu_sweeps.latest() is not None
    c["heat_gpu"] = gr.Plot(show_label=False, visible=recorded, elem_id="sweep-gpu")
    c["heat"] = gr.Plot(show_label=False)
    c["table"] = gr.Dataframe(views.SWEEP_VIEW_EMPTY, label="every config, impossible ones with the reason")
    return c


def _compare_tab(ctx: Context) -> dict:
    c: dict = {}
    c["lengths"] = control(ctx, "lengths")
    with gr.Row():
        c["go"] = gr.Button("Compare cache on/off, backends and launches", variant="primary")
        c["stop"] = gr.Button("Stop")
    c["note"] = gr.Markdown()
    c["status"] = gr.Markdown()
    c["plot"], c["fusion"] = gr.Plot(show_label=False), gr.Plot(show_label=False)
    c["table"] = gr.Dataframe(views.COMPARE_EMPTY, label="per run")
    with gr.Row():
        c["ladder"] = gr.Button("Climb the fusion ladder (one decode step per rung)", variant="primary")
        c["ladder_stop"] = gr.Button("Stop")
    c["ladder_status"] = gr.Markdown()
    c["ladder_plot"] = gr.Plot(show_label=False)
    c["ladder_table"] = gr.Dataframe(views.LADDER_EMPTY, label="per rung", elem_id="ladder-table")
    return c


def _export_tab() -> dict:
    c: dict = {}
    c["which"] = raw(gr.Radio(list(handlers.EXPORTS), value="last run: steps", label="table"))
    c["fmt"] = raw(gr.Radio(["csv", "json"], value="csv", label="format"))
    c["go"] = gr.Button("Export")
    c["file"] = gr.File(label="download")
    return c


def build(ctx: Context, header: str = "") -> gr.Blocks:
    # Gradio's copies of exported files (and of any other file it serves) go after an hour.
    age = exports.MAX_AGE_S
    with gr.Blocks(title="Triton Decoder Explorer", delete_cache=(age, age)) as demo:
        state = gr.State(handlers.NEW_STATE)
        gr.Markdown(INTRO, elem_id="intro")
        gr.Markdown(header, elem_id="header")
        with gr.Tabs() as tabs:
            with gr.Tab("Generate", id="generate"):
                g = _generate_tab(ctx)
            with gr.Tab("Lessons", id="lessons"):
                le = _lessons_tab(ctx)
            with gr.Tab("Memory hierarchy"):
                hierarchy = gr.HTML(views.hierarchy_before_a_run())
                roofline = gr.Plot(show_label=False)
            with gr.Tab("Tile sweep"):
                sw = _sweep_tab(ctx)
            with gr.Tab("Compare"):
                co = _compare_tab(ctx)
            with gr.Tab("Export"):
                ex = _export_tab()
        _wire(ctx, demo, state, tabs, g, le, sw, co, ex, hierarchy, roofline)
    return demo


def _wire(ctx, demo, state, tabs, g, le, sw, co, ex, hierarchy, roofline) -> None:
    job = handlers.make(ctx)
    run = [g[n] for n in RUN]
    tiles = [g[n] for n in TILES]
    names = [*RUN, "overlay", *TILES]
    out = [g[n] for n in handlers.GENERATE_OUT if n not in ("hierarchy", "roofline")]
    out[7:7] = [hierarchy, roofline]
    generating = _job(
        g["go"].click, api(names, job["generate"]), [*run, g["overlay"], *tiles, state], [*out, state], "generate"
    )
    _job(
        g["occupancy_go"].click,
        api([*RUN, *TILES], job["occupancy"]),
        [*run, *tiles, state],
        [g["occupancy"], g["tile_reads"], state],
        "occupancy",
        status=0,
    )
    # Stop cancels the run, then says so: a separate step after the cancel, so that no update of the run
    # still on its way can land over what Stop wrote (one in six Stops right after the first token did).
    g["stop"].click(None, None, None, cancels=[generating], api_visibility="private").then(
        handlers.stopped, [g["summary"], g["status"]], [g["summary"], g["status"]], api_visibility="private"
    )

    sweeping = _job(
        sw["go"].click,
        api(["kernel", "shape", "dtype", "x", "y", "value"], job["sweep"]),
        [sw[n] for n in ("kernel", "shape", "dtype", "x", "y", "value")] + [state],
        [sw["heat"], sw["table"], sw["best"], sw["heat_gpu"], state],
        "sweep",
    )
    sw["stop"].click(None, None, None, cancels=[sweeping], api_visibility="private")
    sw["kernel"].change(_sweep_axes(ctx), sw["kernel"], [sw["shape"], sw["x"], sw["y"]], api_visibility="private")
    sw["use"].click(_use_best, state, tiles, api_visibility="private")
    g["timeline_go"].click(_timeline, [g["model"], g["backend"], g["fusion"]], g["timeline"], api_visibility="private")

    comparing = _job(
        co["go"].click,
        api([*RUN, "lengths", *TILES], job["compare"]),
        [*run, co["lengths"], *tiles, state],
        [co["plot"], co["fusion"], co["table"], co["status"], state],
        "compare",
    )
    co["stop"].click(None, None, None, cancels=[comparing], api_visibility="private")
    climbing = _job(
        co["ladder"].click,
        api(["model", "dtype", "batch"], job["ladder"]),
        [g["model"], g["dtype"], g["batch"], state],
        [co["ladder_plot"], co["ladder_table"], co["ladder_status"], state],
        "ladder",
    )
    # Export offers first the table the last job made.
    for event, table in ((generating, "steps"), (sweeping, "sweep"), (comparing, "compare"), (climbing, "ladder")):
        event.then(_offer(table), state, ex["which"], api_visibility="private", queue=False, show_progress="hidden")
    co["ladder_stop"].click(None, None, None, cancels=[climbing], api_visibility="private")
    ex["go"].click(api(["which", "fmt"], job["export"]), [ex["which"], ex["fmt"], state], ex["file"], api_name="export")

    lesson_out = [le["text"], le["plot"], le["recorded"], le["recorded_plot"]]
    lesson_controls = [g[n] if n != "kernel" else sw["kernel"] for n in handlers.LESSON_CONTROLS]
    # Another lesson picked while one runs: the running one sees it and stops, and the new one runs after it.
    picked = le["lesson"].change(
        handlers.picker(ctx), le["lesson"], [le["intro"], *lesson_controls], api_visibility="private", queue=False
    )
    _job(picked.then, api(["lesson"], job["lesson"]), le["lesson"], lesson_out, "lesson", status=0, panels=[1])
    again = failed.on_page(_again(job["lesson"]), 1 + len(lesson_out), status_at=1, panels=[2])
    le["again"].click(again, le["lesson"], [le["intro"], *lesson_out], api_visibility="private", **GPU)
    demo.load(handlers.open_link, None, [tabs, le["lesson"]], api_visibility="private")  # queued: it may warn
    demo.load(None, None, None, js=TALK_JS, api_visibility="private")
    # The estimates under Generate and Compare follow their controls, from the page's first load on.
    # and again once a job has run, whose time is the next estimate's rate.
    for fn, inputs, names_, note, event in (
        (
            handlers.generate_estimate,
            [*run, *tiles, g["overlay"], state],
            [*RUN, *TILES, "overlay", "state"],
            g["note"],
            generating,
        ),
        (handlers.compare_estimate, [*run, co["lengths"], *tiles], [*RUN, "lengths", *TILES], co["note"], comparing),
    ):
        estimate_note = _note(ctx, fn, names_)
        triggers = [demo.load, *(c.change for c in inputs)]
        gr.on(triggers, estimate_note, inputs, note, api_visibility="private", queue=False, show_progress="hidden")
        event.then(estimate_note, inputs, note, api_visibility="private", queue=False, show_progress="hidden")


def _job(trigger, handler, inputs, outputs, api_name: str, status: int = -2, panels: list[int] | None = None):
    """A job's event: on the page, a refusal or failure ends it with its status output saying so (failed.on_page);
    for API clients, the endpoint `api_name` of the handler itself, on a hidden button's event, where a refusal is
    an error the client raises. `status`: the status output's index (by default the one before the page's state);
    `panels`: the outputs a failed run clears if it had filled any (by default all but the status and the state)."""
    gr.Button(visible=False).click(handler, inputs, outputs, api_name=api_name, **GPU)
    at = status % len(outputs)
    if panels is None:
        panels = [i for i, o in enumerate(outputs) if i != at and not isinstance(o, gr.State)]
    page = failed.on_page(handler, len(outputs), at, panels)
    return trigger(page, inputs, outputs, api_visibility="private", **GPU)


def _offer(table: str):
    """The Export tab's choice set to `table` once the page's state holds it."""
    label = next(k for k, v in handlers.EXPORTS.items() if v == table)
    return lambda state: gr.update(value=label) if (state or {}).get(table) is not None else gr.skip()


def _note(ctx, fn, names):
    return lambda *values: fn(ctx, dict(zip(names, values, strict=True)))


def _again(lesson_job):
    """Run the picked lesson again; with none picked, say so where the introduction goes."""

    async def again(name):
        if name is None:
            yield "Pick a lesson above first, then run it again from here.", gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        async for out in lesson_job({"lesson": name}):
            yield gr.skip(), *out

    return again


def _sweep_axes(ctx):
    def axes(kernel):
        names = handlers.estimate.sweep_axes(kernel)
        pick = lambda v: gr.update(choices=names, value=v)  # noqa: E731
        return shape_text(kernel, ctx.device), pick(names[0]), pick(names[1])

    return axes


def _timeline(model, backend, fusion):
    """The recorded timeline of a decode step on the SMs at the page's model and rung."""
    if backend != "triton":
        raise gr.Error("The timeline is of our Triton kernels: pick the triton backend.", print_exception=False)
    fig, why = timelines.figure(model, fusion)
    if fig is None:
        raise gr.Error(why, print_exception=False)
    return gr.update(value=fig, visible=True)


def _use_best(state):
    """Send the sweep's fastest config to the Generate tab's tile controls."""
    kernel, best = (state or {}).get("best") or (None, None)
    if best is None:
        raise gr.Error("Run a tile sweep first.", print_exception=False)
    updates = []
    for name_kernel, field_choices in TILE_CHOICES.items():
        for name in field_choices:
            value = getattr(best, name) if name_kernel == kernel else None
            updates.append(gr.update(value=str(value)) if value is not None else gr.skip())
        updates.append(gr.update(value=False) if name_kernel == kernel else gr.skip())
    gr.Info(f"{kernel} tiles set to {views.describe(best)} in Generate.")
    return updates
