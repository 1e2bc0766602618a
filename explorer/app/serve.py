"""The app assembled: its job runner started (and warmed), its page built, the launch options that keep
the server's surface to what the page uses. app.py launches it; the tests start it the same way."""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.middleware import Middleware
from starlette.responses import JSONResponse

from . import estimate, handlers, models, ui, validate
from .runner import InlineRunner, ProcessRunner, zero_gpu, zero_gpu_duration
from .settings import RunSettings

ZERO_GPU_HEADER = (
    "**ZeroGPU: a GPU is attached for each run** (an NVIDIA RTX Pro 6000 Blackwell on ZeroGPU since May 2026), "
    "for about the seconds the run is estimated to take. Its copy bandwidth and matmul rate are measured inside "
    "the run and shown in the summary. The first run at new settings compiles Triton kernels for this GPU and "
    "says so; later runs read them from Triton's cache on disk."
)


class Guard:
    """What the page does not use never reaches Gradio: an upload is refused before any byte of it is
    stored or served back (the page takes no files), and an event whose data holds a file reference
    (Gradio would try to copy that file into its cache before any handler runs) is refused with a message
    that says so. Request bodies of events are read here, up to MAX_BODY bytes."""

    MAX_BODY = 32 << 20

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        path = scope["path"].rstrip("/")
        if path.endswith("/upload"):
            return await _refuse(403, "This app takes no files: uploads are refused.", scope, receive, send)
        if not (path.endswith("/queue/join") or "/call/" in path or "/run/" in path):
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.MAX_BODY:
                return await _refuse(413, f"A request may hold at most {self.MAX_BODY >> 20} MB.", scope, receive, send)
        where = _file_reference(body)
        if where is not None:
            return await _refuse(
                400, f"Input {where} is a file reference: this app takes no files.", scope, receive, send
            )
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _file_reference(body: bytes) -> int | None:
    """The index in the event's data of the first value that is (or holds) a Gradio file reference."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list):
        return None

    def holds(value) -> bool:
        if isinstance(value, dict):
            return validate.is_file_reference(value) or any(holds(v) for v in value.values())
        if isinstance(value, list):
            return any(holds(v) for v in value)
        return False

    return next((i for i, value in enumerate(data) if holds(value)), None)


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


def default_job(device: str) -> dict:
    """What the worker runs before it takes jobs: the default Generate, and on a GPU the default ladder."""
    from .settings import defaults

    d = defaults(device, {"dtype": models.default_dtype()})
    s = RunSettings(prompt=d["prompt"], new_tokens=d["new_tokens"], dtype=d["dtype"])
    return {"settings": s, "ladder": device == "cuda"}


def runner(warm: bool, log: Callable[[str], None] = print):
    """The runner for this machine: jobs in a worker process, or under ZeroGPU in the platform's GPU calls."""
    if zero_gpu():
        import spaces

        from . import jobs

        wrapped = {kind: spaces.GPU(duration=zero_gpu_duration)(fn) for kind, fn in jobs.JOBS.items()}
        return InlineRunner(lambda fn, job: wrapped[job.kind])
    r = ProcessRunner(warm=default_job(models.device().type) if warm else None, log=log)
    r.start(wait=True)
    return r


def app(default_model: str, offered, downloads: bool, *, warm: bool = True, log=print):
    """(the page, the options its launch takes, its runner). Starts the job worker and, with `warm`, waits
    for its warm-up."""
    r = runner(warm, log)
    device = "cuda" if zero_gpu() else models.device().type
    warmed = getattr(r, "warm", None)  # what the worker's warm-up ran, and so compiled
    if warmed:
        estimate.compiled(device, estimate.generation_keys(warmed["settings"]))
        if warmed["ladder"]:
            estimate.compiled(device, estimate.ladder_keys(warmed["settings"]))
    header = ZERO_GPU_HEADER if zero_gpu() else r.info.get("header", "")
    ctx = handlers.Context(r, models.Policy(default_model, offered, downloads), device)
    return ui.build(ctx, header), launch_options(), r
