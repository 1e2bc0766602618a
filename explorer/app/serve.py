"""The app assembled: its job runner started (and warmed), its page built, the launch options that keep
the server's surface to what the page uses. app.py launches it; the tests start it the same way."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Callable

from starlette.middleware import Middleware
from starlette.responses import JSONResponse

from . import estimate, events, handlers, models, settings, start, ui, validate
from .runner import InlineRunner, ProcessRunner, zero_gpu_duration
from .zerogpu import zero_gpu

ZERO_GPU_HEADER = (
    "**ZeroGPU: a GPU is attached for each run** (an NVIDIA RTX Pro 6000 Blackwell on ZeroGPU since May 2026), "
    "for about the seconds the run is estimated to take. Its copy bandwidth and matmul rate are measured inside "
    "the run and shown in the summary. The first run at new settings compiles Triton kernels for this GPU and "
    "says so; later runs read them from Triton's cache on disk."
)


class Guard:
    """Every request is bounded before Gradio reads it, and what the page does not use never reaches Gradio:
    - a body (any method, any route) may hold at most MAX_BODY bytes: one that says it holds more is refused
      before a byte of it is read, one that holds more than it said is refused as its bytes pass the limit;
    - JSON may nest at most MAX_DEPTH levels (the page sends flat lists of values): deeper is refused before
      any parser recurses through it;
    - an upload is refused before any byte of it is stored or served back (the page takes no files), and an
      event whose data holds a file reference (Gradio would try to copy that file into its cache before any
      handler runs) is refused with a message that says so;
    - a stream of an event or a session that is not waiting here is refused with a 404 before Gradio starts
      it (Gradio would answer 200 and then break the stream off)."""

    MAX_BODY = 8 << 20  # a 20,000-character prompt is at most 240 KB of JSON; four bodies at this limit are 32 MB
    MAX_DEPTH = 32

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refuse = functools.partial(_refuse, scope=scope, receive=receive, send=send)
        declared = _content_length(scope)
        if declared is None:
            return await refuse(400, "The request's Content-Length is not a whole number of bytes.")
        if declared > self.MAX_BODY:
            return await refuse(413, self.too_large())
        path = scope["path"].rstrip("/")
        if scope["method"] in ("GET", "HEAD"):
            missing = events.missing(scope, path)
            return await (refuse(404, missing) if missing else self.app(scope, receive, send))
        if scope["method"] == "POST" and path.endswith("/upload"):
            return await refuse(403, "This app takes no files: uploads are refused.")
        body = await _read(receive, self.MAX_BODY)
        if body is None:
            return await refuse(413, self.too_large())
        event = path.endswith("/queue/join") or "/call/" in path or "/run/" in path
        data, problem = await asyncio.to_thread(_inspect, body, event, self.MAX_DEPTH) if body else (None, None)
        if problem is None and event:
            problem = events.short(scope, path, data)
        if problem is not None:
            return await refuse(400, problem)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def too_large(self) -> str:
        return f"A request may hold at most {self.MAX_BODY >> 20} MB."


def _content_length(scope) -> int | None:
    """The body's declared length (0 when none is declared); None when the header is not a number."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return 0


async def _read(receive, limit: int) -> bytes | None:
    """The request's body, or None once more than `limit` bytes have come (the rest is not read)."""
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _inspect(body: bytes, event: bool, max_depth: int) -> tuple[object, str | None]:
    """(the body's JSON, why it is refused or None). A body that is not JSON goes on to Gradio, which
    answers it."""
    deep = f"The request's JSON nests deeper than {max_depth} levels; this app's values nest a few levels at most."
    try:
        data = json.loads(body)
    except RecursionError:
        return None, deep
    except ValueError:
        return None, None
    if any(depth > max_depth for _, depth in _containers(data)):
        return None, deep
    if event and isinstance(data, dict) and isinstance(data.get("data"), list):
        for i, value in enumerate(data["data"]):
            if any(isinstance(c, dict) and validate.is_file_reference(c) for c, _ in _containers(value)):
                return data, f"Input {i} is a file reference: this app takes no files."
    return data, None


def _containers(value):
    """Every list and dict in `value`, itself included, with its depth (1 for `value`): a walk with its own
    stack, so that no nesting makes it recurse."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        yield item, depth
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


async def _refuse(status: int, message: str, scope, receive, send) -> None:
    await JSONResponse({"detail": message, "error": message}, status_code=status)(scope, receive, send)


def launch_options() -> dict:
    return dict(
        theme=ui.THEME,
        css=ui.CSS,
        footer_links=["api", "gradio", "settings"],
        max_file_size=0,
        app_kwargs={"middleware": [Middleware(Guard)]},
    )


def runner(warm: bool, log: Callable[[str], None] = print, started: ProcessRunner | None = None):
    """The runner for this machine, ready: jobs in a worker process (`started`, where start.worker began it
    already), or under ZeroGPU in the platform's GPU calls."""
    if zero_gpu():
        import spaces

        from . import jobs

        wrapped = {kind: spaces.GPU(duration=zero_gpu_duration)(fn) for kind, fn in jobs.JOBS.items()}
        return InlineRunner(lambda fn, job: wrapped[job.kind])
    r = started or start.worker(warm, log)
    r.wait_ready()
    return r


def helped_keys(task: str, s) -> list:
    """The kinds of work a warm-up helper's task (jobs.warm.run_task) compiled, as estimates name them."""
    if task.startswith("lesson:"):
        return [("lesson", task.split(":", 1)[1])]
    if task == "sweep":
        return estimate.sweep_compiles(*settings.default_sweep("cuda"), s.dtype)
    if task == "shapes":  # both bundled models and SmolLM2-135M's shape (jobs.warm.warm_shapes)
        from .jobs.warm import SHAPES_MODELS, SHAPES_PROMPTS

        # Past 128 rows no kernel's tile of rows grows: every longer prefill, and every cache-off pass from there,
        # runs kernels compiled already. A decode step's attention plan follows the cache: the prompts' plans.
        buckets = [1 << i for i in range(3, 13)]
        keys = []
        for model in SHAPES_MODELS:
            at = dataclasses.replace(s, model=model)
            keys += [estimate.model_key(at), *(estimate.prefill_key(at, n) for n in buckets)]
            keys += [estimate.cache_off_key(at, n) for n in buckets]
            keys += [estimate.decode_key(at, n + k) for n in SHAPES_PROMPTS for k in (1, 2)]
        return keys
    return []


def count_warm_up(device: str, warmed: dict, helped, ran: dict | None = None) -> None:
    """Tell the estimates what the worker's warm-up compiled (`warmed`: start.default_job) and what its helpers ran
    (`helped`: their tasks, jobs.warm), so that no estimate counts compiling it again; and on a CPU, where nothing
    compiles, how long its default Generate took (`ran`: jobs.warm.ran), as a visitor's run of it would count."""
    s = warmed["settings"]
    estimate.compiled(device, estimate.generation_keys(s))
    if device == "cpu" and (ran or {}).get("generate_s"):
        units = estimate.generation_units(s, device)
        estimate.record(device, s.backend, units, ran["generate_s"], key=estimate.rate_key(s))
    if warmed["ladder"]:  # on a GPU, where the warm-up also compiled the bundled Llama's decoder (jobs.warm)
        estimate.compiled(device, estimate.ladder_keys(s))
        from .jobs.warm import llama_runs, warmed_lessons

        for llama in llama_runs(s):
            estimate.compiled(device, estimate.generation_keys(llama))
        for name in warmed_lessons():  # their kernels are the warm-up's own, whether or not a helper ran them
            estimate.compiled(device, helped_keys(f"lesson:{name}", s))
    for task in helped:
        estimate.compiled(device, helped_keys(task, s))


def app(default_model: str, offered, downloads: bool, *, warm: bool = True, log=print, started=None):
    """(the page, the options its launch takes, its runner). Starts the job worker (or takes the one
    start.worker began) and, with `warm`, waits for its warm-up."""
    r = runner(warm, log, started)
    device = "cuda" if zero_gpu() else models.device().type
    warmed = getattr(r, "warm", None)  # what the worker's warm-up ran, and so compiled
    if warmed:
        count_warm_up(device, warmed, r.info.get("helped", ()), r.info.get("warm_ran"))
    header = ZERO_GPU_HEADER if zero_gpu() else r.info.get("header", "")
    ctx = handlers.Context(r, models.Policy(default_model, offered, downloads), device)
    return ui.build(ctx, header), launch_options(), r
