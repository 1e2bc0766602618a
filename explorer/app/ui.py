"""The Gradio app: layout and event wiring only. Every handler is a few lines around explorer.actions."""

from __future__ import annotations

import functools
import inspect

import gradio as gr

from ..model.ops import DEFAULT_FUSION, FUSIONS
from . import actions, estimate, gpu, lessons, plots, validate

EXAMPLES = ["def fibonacci(n):", "class Config:", "import os\nimport sys\n\n\ndef main(", '"""Return the number of']
THEME = gr.themes.Soft(primary_hue="indigo")
CSS = """
.gradio-container {max-width: 1400px !important}
.hierarchy table {border-collapse: collapse; margin: 0.5em 0}
.hierarchy td, .hierarchy th {border: 1px solid #ccc; padding: 4px 10px; text-align: right}
.hierarchy td:first-child, .hierarchy th:first-child {text-align: left}
#out textarea {font-family: ui-monospace, monospace}
.lesson-text {font-size: 1.15em}
"""
INTRO = """# Triton Decoder Explorer
A small GPT-2 decoder generating token by token on our own Triton kernels. GPU speed is mostly about
moving bytes between HBM and on-chip SRAM: pick tiles, fusion and the KV cache, and watch latency,
memory traffic and the cache change. On a GPU, untick *CUDA graph* to see what launching every
kernel from Python costs."""
GPU = dict(concurrency_id="gpu", concurrency_limit=1)  # one run on the GPU at a time; others wait in line
# ZeroGPU's duration estimates (seconds a GPU is held per event): compile and warm-up, the tokens, the
# profiling pass; a sweep's configs; a compare's runs.
GENERATE_S, SWEEP_S, COMPARE_S, LADDER_S, LESSON_S = 90, 120, 240, 120, 240
NEW_STATE = {"steps": None, "kernels": None, "previous": None, "sweep": None, "compare": None}


def raw(component):
    """The component's value reaches the handler exactly as an API client sent it, so that validate.py
    says what is wrong with it: gr.Slider and gr.Number fail on a string or None with Gradio's generic
    error before the handler runs, and gr.Textbox turns 5 into "5" silently. (An instance attribute,
    not a subclass: Gradio writes a .pyi stub beside any module that subclasses a component.)"""
    component.preprocess = lambda payload: payload
    return component


def _fail(e: actions.UserError):
    return gr.Error(str(e), print_exception=False)


def _tile_controls():
    """One dropdown per tile field ('default' or a power of two) and an autotune box per kernel."""
    controls = []
    for kernel, field_choices in actions.TILE_FIELDS.items():
        # The kernel's name above its controls, which wrap at a width that fits "num_stages" and "default".
        gr.Markdown(f"**{kernel.replace('_', ' ')}**")
        with gr.Row():
            for name, values in field_choices.items():
                controls.append(gr.Dropdown(["default", *map(str, values)], value="default", label=name, min_width=120))
            controls.append(gr.Checkbox(False, label="autotune", min_width=120))
    return controls


TILE_NAMES = [f"{kernel}_{name}" for kernel, fields in actions.TILE_FIELDS.items() for name in [*fields, "autotune"]]


def _with_tile_names(fn):
    """Name the handler's *tiles parameters (attention_block_m, ...) so API users can pass them by name."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_POSITIONAL and p.name != "progress"]
    tiles = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in TILE_NAMES]
    extra = [p for p in sig.parameters.values() if p.name == "progress"]

    if inspect.isgeneratorfunction(fn):  # Gradio streams only what it sees as a generator function

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            yield from fn(*args, **kwargs)
    else:

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*params, *tiles, *extra])
    return wrapper


def _tiles(values) -> actions.Tiles:
    it = iter(values)
    chosen = {}
    for kernel, field_choices in actions.TILE_FIELDS.items():
        fields = {
            name: validate.choice(f"{kernel} {name}", next(it), ["default", *map(str, allowed)])
            for name, allowed in field_choices.items()
        }
        chosen[kernel] = fields | {"autotune": validate.flag(f"{kernel} autotune", next(it))}
    return actions.tiles_from(chosen)


def _settings(
    model,
    prompt,
    prompt_tokens,
    new_tokens,
    batch,
    dtype,
    backend,
    fusion,
    cache,
    cuda_graph,
    temperature,
    top_k,
    seed,
    tiles,
):
    """The Generate and Compare controls, each checked (validate.py) before anything runs."""
    return actions.RunSettings(
        model=validate.choice("model", model, [value for _, value in actions.model_choices()]),
        prompt=validate.text("prompt", prompt, validate.MAX_PROMPT_CHARS),
        prompt_tokens=validate.whole("prompt length in tokens", prompt_tokens, 0, 1000),
        new_tokens=validate.whole("new tokens", new_tokens, 1, actions.MAX_NEW_TOKENS),
        batch=validate.whole("batch", batch, 1, actions.MAX_BATCH),
        dtype=validate.choice("dtype", dtype, actions.dtype_choices()),
        backend=validate.choice("backend", backend, ["triton", "torch"]),
        fusion=validate.choice("fusion", fusion, FUSIONS),
        cache=validate.flag("KV cache", cache),
        cuda_graph=validate.flag("CUDA graph", cuda_graph),
        temperature=validate.number("temperature", temperature, 0.0, 2.0),
        top_k=validate.whole("top-k", top_k, 0, 200),
        seed=validate.whole("seed", seed, 0, validate.MAX_SEED),
        tiles=_tiles(tiles),
    )


def generate(
    model,
    prompt,
    prompt_tokens,
    new_tokens,
    batch,
    dtype,
    backend,
    fusion,
    cache,
    cuda_graph,
    temperature,
    top_k,
    seed,
    overlay,
    state,
    *tiles,
):
    """Stream the text and, at a throttled rate, the charts."""
    try:
        s = _settings(
            model,
            prompt,
            prompt_tokens,
            new_tokens,
            batch,
            dtype,
            backend,
            fusion,
            cache,
            cuda_graph,
            temperature,
            top_k,
            seed,
            tiles,
        )
        overlay = validate.flag("overlay previous run", overlay)
        state = dict(state or NEW_STATE)
        previous = state.get("steps") if overlay else None
        for u in actions.run_generation(s):
            text = "\n\n".join(t if len(u.texts) == 1 else f"[{i + 1}] {t}" for i, t in enumerate(u.texts))
            figures = (
                actions.generation_figures(u.steps, u.kernels, previous, u.profiled) if u.charts else [gr.skip()] * 5
            )
            if u.done:
                state = {**state, "previous": state.get("steps"), "steps": u.steps, "kernels": u.kernels}
                hierarchy = actions.hierarchy(s, u.kernels)
                yield (
                    text,
                    actions.summary_markdown(u.summary),
                    *figures,
                    hierarchy,
                    actions.roofline_figure(u.kernels, u.profiled),
                    state,
                )
            else:
                yield (text, actions.summary_markdown(u.summary), *figures, gr.skip(), gr.skip(), gr.skip())
    except actions.UserError as e:
        raise _fail(e) from None


def sweep(kernel, shape, dtype, x, y, value, state):
    """The heatmap, the table and the fastest config so far, after each config."""
    try:
        kernel = validate.choice("kernel", kernel, actions.DEFAULT_SHAPES)
        shape = actions.parse_shape(validate.text("shape", shape))
        dtype = validate.choice("dtype", dtype, actions.dtype_choices())
        x = validate.choice("x", x, actions.sweep_axes(kernel))
        y = validate.choice("y", y, actions.sweep_axes(kernel))
        value = validate.choice("show", value, ["ms", "gbs", "tflops"])
        for frame, best, status in actions.run_sweep(kernel, shape, dtype):
            heat = plots.sweep_heatmap(frame, x, y, value, note=actions.sweep_note(frame))
            text = f"{actions.best_text(frame, best)} Timed: {status}."
            state = {**(state or NEW_STATE), "sweep": frame, "best": (kernel, best)}
            yield heat, actions.sweep_view(frame), text, state
    except actions.UserError as e:
        raise _fail(e) from None


def stopped(summary: str) -> str:
    """The summary after Stop: the run did not reach its end, and the table says so."""
    return summary.replace("| stopped | running |", "| stopped | by you, before the end |")


def sweep_axes(kernel):
    axes = actions.sweep_axes(kernel)
    return actions.shape_text(kernel), gr.update(choices=axes, value=axes[0]), gr.update(choices=axes, value=axes[-1])


def use_best(state):
    """Send the sweep's fastest config to the Generate tab's tile controls."""
    kernel, best = (state or {}).get("best") or (None, None)
    if best is None:
        raise gr.Error("Run a tile sweep first.", print_exception=False)
    target = actions.SWEEP_TO_TILES[kernel]
    updates = []
    for name_kernel, field_choices in actions.TILE_FIELDS.items():
        for name in field_choices:
            value = getattr(best, name) if name_kernel == target else None
            updates.append(gr.update(value=str(value)) if value is not None else gr.skip())
        updates.append(gr.update(value=False) if name_kernel == target else gr.skip())
    gr.Info(f"{kernel} tiles set to {best} in Generate.")
    return updates


def compare(
    model,
    prompt,
    prompt_tokens,
    new_tokens,
    batch,
    dtype,
    backend,
    fusion,
    cache,
    cuda_graph,
    temperature,
    top_k,
    seed,
    lengths,
    state,
    *tiles,
):
    try:
        s = _settings(
            model,
            prompt,
            prompt_tokens,
            new_tokens,
            batch,
            dtype,
            backend,
            fusion,
            cache,
            cuda_graph,
            temperature,
            top_k,
            seed,
            tiles,
        )
        lengths = actions.parse_lengths(validate.text("prompt lengths", lengths))
        lessons = plots.fusion_figure(actions.fusion_table(s, max(lengths)))
        for frame, status in actions.run_compare(s, lengths):
            note = "; ".join(n for n in (actions.timer_note(), status) if n)
            state = {**(state or NEW_STATE), "compare": frame}
            yield plots.compare_figure(frame, note), lessons, actions.compare_table(frame), state
    except actions.UserError as e:
        raise _fail(e) from None


def ladder(model, dtype, batch):
    """One decode step per rung of the fusion ladder, each shown as soon as it is measured."""
    try:
        s = actions.RunSettings(
            model=validate.choice("model", model, [value for _, value in actions.model_choices()]),
            dtype=validate.choice("dtype", dtype, actions.dtype_choices()),
            batch=validate.whole("batch", batch, 1, actions.MAX_BATCH),
        )
        for frame, status in actions.run_ladder(s):
            note = "; ".join(n for n in (frame.timer.iloc[-1], status) if n)
            yield plots.ladder_figure(frame, note), actions.ladder_table(frame)
    except actions.UserError as e:
        raise _fail(e) from None


def export(which, fmt, state):
    frames = {"last run: steps": "steps", "last run: kernels": "kernels", "tile sweep": "sweep", "compare": "compare"}
    try:
        which = validate.choice("table", which, frames)
        fmt = validate.choice("format", fmt, ["csv", "json"])
        return actions.export((state or {}).get(frames[which]), frames[which], fmt)
    except actions.UserError as e:
        raise _fail(e) from None


def lesson(lesson):
    """The lesson's job, then its explanation and chart, beside the lesson as recorded on a GPU."""
    try:
        name = validate.choice("lesson", lesson, lessons.names())
        text, figure = lessons.recorded_view(name)
        recorded = (text, gr.update(value=figure, visible=figure is not None))
        yield f"*Running {lessons.LESSONS[name].title.lower()}…*", None, *recorded
        result = lessons.run(name)
        yield lessons.live_markdown(result), lessons.LESSONS[name].figure(result), *recorded
    except actions.UserError as e:
        raise _fail(e) from None


# The controls a lesson may set, in the order pick_lesson returns them.
LESSON_CONTROLS = ["model", "prompt_tokens", "new_tokens", "dtype", "backend", "cache", "cuda_graph", "kernel"]


def pick_lesson(name):
    """A lesson picked: its introduction, and the app's controls set to its job."""
    try:
        name = validate.choice("lesson", name, lessons.names())
    except actions.UserError as e:
        raise _fail(e) from None
    chosen = lessons.LESSONS[name]
    values = chosen.controls(chosen.settings(lessons.size()))
    return lessons.intro(name), *(gr.update(value=values[c]) if c in values else gr.skip() for c in LESSON_CONTROLS)


def open_link(request: gr.Request):
    """/?lesson=kv-cache: the Lessons tab, with that lesson picked (which runs it)."""
    name = request.query_params.get("lesson") if request is not None else None
    if name is None:
        return gr.skip(), gr.skip()
    if name not in lessons.LESSONS:
        gr.Warning(f"There is no lesson {name!r}; the lessons are {', '.join(lessons.names())}.")
        return gr.Tabs(selected="lessons"), gr.skip()
    return gr.Tabs(selected="lessons"), gr.update(value=name)


def generate_estimate(model, prompt, prompt_tokens, new_tokens, batch, backend, cache):
    """The note under Generate: about how long these settings take here (nothing while a value is invalid)."""
    try:
        tokens = validate.whole("prompt length", prompt_tokens, 0, 1000) or max(1, len(validate.text("p", prompt)) // 3)
        return estimate.generation_note(
            validate.text("model", model),
            tokens,
            validate.whole("new tokens", new_tokens, 1, actions.MAX_NEW_TOKENS),
            validate.flag("cache", cache),
            validate.whole("batch", batch, 1, actions.MAX_BATCH),
            validate.choice("backend", backend, ["triton", "torch"]),
            actions.device().type,
        )
    except actions.UserError:
        return ""


def compare_estimate(model, new_tokens, cuda_graph, lengths):
    """The note under Compare: about how long its runs take here."""
    try:
        return estimate.compare_note(
            validate.text("model", model),
            actions.parse_lengths(validate.text("lengths", lengths)),
            validate.whole("new tokens", new_tokens, 1, actions.MAX_NEW_TOKENS),
            validate.flag("CUDA graph", cuda_graph) and actions.graphs_available(),
            actions.device().type,
        )
    except actions.UserError:
        return ""


def build() -> gr.Blocks:
    # Gradio's copies of exported files (and of any other file it serves) go after an hour.
    age = actions.EXPORT_MAX_AGE_S
    with gr.Blocks(title="Triton Decoder Explorer", delete_cache=(age, age)) as demo:
        state = gr.State(NEW_STATE)
        gr.Markdown(INTRO)
        gr.Markdown(actions.header())
        with gr.Tabs() as tabs:
            with gr.Tab("Generate", id="generate"):
                with gr.Row():
                    with gr.Column(scale=1, min_width=340):
                        model = gr.Dropdown(actions.model_choices(), value=actions.default_model(), label="model")
                        prompt = raw(gr.Textbox(EXAMPLES[0], lines=3, label="prompt"))
                        gr.Examples([[e] for e in EXAMPLES], [prompt], label="examples")
                        prompt_tokens = raw(
                            gr.Slider(0, 1000, 0, step=1, label="prompt length in tokens (0: as written)")
                        )
                        new_tokens = raw(
                            gr.Slider(
                                1, actions.MAX_NEW_TOKENS, actions.default_new_tokens(), step=1, label="new tokens"
                            )
                        )
                        batch = raw(gr.Slider(1, actions.MAX_BATCH, 1, step=1, label="batch (copies of the prompt)"))
                        with gr.Row():
                            dtype = gr.Radio(actions.dtype_choices(), value=actions.default_dtype(), label="dtype")
                            backend = gr.Radio(["triton", "torch"], value="triton", label="backend")
                        fusion = gr.Radio(
                            list(FUSIONS),
                            value=DEFAULT_FUSION,
                            label="fusion (Triton backend)",
                            info="none: every op its own kernel · epilogue: bias, GELU, add in the matmul · "
                            "decode: LayerNorm and the cache write fused too, about 5 kernels a layer · "
                            "overlap: those kernels start early and load their weights (Hopper GPUs) · "
                            "persistent: each layer one kernel, its stages waiting at counters on the GPU",
                        )
                        with gr.Row():
                            cache = gr.Checkbox(True, label="KV cache")
                            cuda_graph = gr.Checkbox(
                                actions.graphs_available(),
                                label="CUDA graph",
                                interactive=actions.graphs_available(),
                                info=actions.GRAPH_INFO if actions.graphs_available() else "needs a GPU",
                            )
                            overlay = gr.Checkbox(True, label="overlay previous run")
                        with gr.Accordion("sampling", open=False):
                            temperature = raw(gr.Slider(0, 2, 0, step=0.05, label="temperature (0: greedy)"))
                            top_k = raw(gr.Slider(0, 200, 0, step=1, label="top-k (0: all)"))
                            seed = raw(gr.Number(0, precision=0, label="seed"))
                        with gr.Accordion("tiles (default, a power of two, or autotune)", open=False):
                            tiles = _tile_controls()
                        with gr.Row():
                            go_btn = gr.Button("Generate", variant="primary")
                            stop_btn = gr.Button("Stop")
                        generate_note = gr.Markdown()
                    with gr.Column(scale=2):
                        out = gr.Textbox(label="output", lines=8, elem_id="out")
                        summary = gr.Markdown()
                        with gr.Row():
                            latency_plot, traffic_plot = gr.Plot(show_label=False), gr.Plot(show_label=False)
                        with gr.Row():
                            kv_plot, share_plot = gr.Plot(show_label=False), gr.Plot(show_label=False)
                        bandwidth_plot = gr.Plot(show_label=False)
            with gr.Tab("Lessons", id="lessons"):
                lesson_pick = raw(
                    gr.Radio(
                        lessons.choices(),
                        value=None,
                        label="lessons: one click sets the controls, runs the lesson and explains what it measured",
                    )
                )
                with gr.Row():
                    lesson_intro = gr.Markdown("Pick a lesson above.")
                    again_btn = gr.Button("Run the lesson again", scale=0, min_width=220)
                # Each side: its chart, then what it measured. Without a GPU, the GPU recording beside the run.
                with gr.Row(equal_height=False):
                    with gr.Column():
                        lesson_plot = gr.Plot(show_label=False, elem_id="lesson-plot")
                        lesson_md = gr.Markdown(elem_classes="lesson-text", elem_id="lesson-live")
                    with gr.Column(visible=lessons.size() == "cpu"):
                        recorded_plot = gr.Plot(show_label=False, visible=False, elem_id="lesson-recorded-plot")
                        recorded_md = gr.Markdown(elem_classes="lesson-text", elem_id="lesson-recorded")
            with gr.Tab("Memory hierarchy"):
                hierarchy = gr.HTML(actions.hierarchy_before_a_run())
                roofline_plot = gr.Plot(show_label=False)
            with gr.Tab("Tile sweep"):
                with gr.Row():
                    kernel = gr.Dropdown(list(actions.DEFAULT_SHAPES), value="attention", label="kernel")
                    shape = raw(gr.Textbox(actions.shape_text("attention"), label="shape"))
                    sweep_dtype = gr.Radio(actions.dtype_choices(), value=actions.default_dtype(), label="dtype")
                with gr.Row():
                    x_axis = gr.Dropdown(["block_m", "block_n"], value="block_m", label="x")
                    y_axis = gr.Dropdown(["block_n", "num_warps", "num_stages"], value="block_n", label="y")
                    value = gr.Radio(["ms", "gbs", "tflops"], value="ms", label="show")
                with gr.Row():
                    sweep_btn = gr.Button("Run sweep", variant="primary")
                    sweep_stop = gr.Button("Stop")
                    best_btn = gr.Button("Use best in Generate")
                best_md = gr.Markdown()
                heat = gr.Plot(label="tile sweep")
                sweep_table = gr.Dataframe(
                    actions.SWEEP_VIEW_EMPTY, label="every config, impossible ones with the reason"
                )
            with gr.Tab("Compare"):
                lengths = raw(gr.Textbox(actions.default_lengths(), label="prompt lengths (tokens)"))
                with gr.Row():
                    compare_btn = gr.Button("Compare cache on/off, backends and launches", variant="primary")
                    compare_stop = gr.Button("Stop")
                compare_note = gr.Markdown()
                compare_plot, fusion_plot = gr.Plot(label="decode latency"), gr.Plot(label="fusion")
                compare_df = gr.Dataframe(label="per run")
                with gr.Row():
                    ladder_btn = gr.Button("Climb the fusion ladder (one decode step per rung)", variant="primary")
                    ladder_stop = gr.Button("Stop")
                ladder_plot = gr.Plot(label="fusion ladder")
                ladder_df = gr.Dataframe(label="per rung", elem_id="ladder-table")
            with gr.Tab("Export"):
                which = gr.Radio(
                    ["last run: steps", "last run: kernels", "tile sweep", "compare"],
                    value="last run: steps",
                    label="table",
                )
                fmt = gr.Radio(["csv", "json"], value="csv", label="format")
                export_btn = gr.Button("Export")
                file = gr.File(label="download")
        settings = [
            model,
            prompt,
            prompt_tokens,
            new_tokens,
            batch,
            dtype,
            backend,
            fusion,
            cache,
            cuda_graph,
            temperature,
            top_k,
            seed,
        ]
        figures = [latency_plot, traffic_plot, kv_plot, share_plot, bandwidth_plot]
        outputs = [out, summary, *figures, hierarchy, roofline_plot, state]
        run = go_btn.click(
            gpu.event(_with_tile_names(generate), GENERATE_S),
            [*settings, overlay, state, *tiles],
            outputs,
            api_name="generate",
            **GPU,
        )
        stop_btn.click(stopped, summary, summary, cancels=[run], api_visibility="private")
        kernel.change(sweep_axes, kernel, [shape, x_axis, y_axis], api_visibility="private")
        swept = sweep_btn.click(
            gpu.event(sweep, SWEEP_S),
            [kernel, shape, sweep_dtype, x_axis, y_axis, value, state],
            [heat, sweep_table, best_md, state],
            api_name="sweep",
            **GPU,
        )
        sweep_stop.click(None, None, None, cancels=[swept], api_visibility="private")
        best_btn.click(use_best, state, tiles, api_visibility="private")
        compared = [compare_plot, fusion_plot, compare_df, state]
        comparing = compare_btn.click(
            gpu.event(_with_tile_names(compare), COMPARE_S),
            [*settings, lengths, state, *tiles],
            compared,
            api_name="compare",
            **GPU,
        )
        compare_stop.click(None, None, None, cancels=[comparing], api_visibility="private")
        climbing = ladder_btn.click(
            gpu.event(ladder, LADDER_S), [model, dtype, batch], [ladder_plot, ladder_df], api_name="ladder", **GPU
        )
        ladder_stop.click(None, None, None, cancels=[climbing], api_visibility="private")
        export_btn.click(export, [which, fmt, state], file, api_name="export")
        lesson_out = [lesson_md, lesson_plot, recorded_md, recorded_plot]
        lesson_controls = [model, prompt_tokens, new_tokens, dtype, backend, cache, cuda_graph, kernel]
        picked = lesson_pick.change(
            pick_lesson, lesson_pick, [lesson_intro, *lesson_controls], api_visibility="private", queue=False
        )
        picked.then(gpu.event(lesson, LESSON_S), lesson_pick, lesson_out, api_name="lesson", **GPU)
        again_btn.click(gpu.event(lesson, LESSON_S), lesson_pick, lesson_out, api_visibility="private", **GPU)
        demo.load(open_link, None, [tabs, lesson_pick], api_visibility="private")  # queued: it may warn
        # The estimates under Generate and Compare follow their controls, from the page's first load on.
        for fn, inputs, note in (
            (generate_estimate, [model, prompt, prompt_tokens, new_tokens, batch, backend, cache], generate_note),
            (compare_estimate, [model, new_tokens, cuda_graph, lengths], compare_note),
        ):
            triggers = [demo.load, *(c.change for c in inputs)]
            gr.on(triggers, fn, inputs, note, api_visibility="private", queue=False, show_progress="hidden")
    return demo
