"""Start the app in this process on a free port, for tests that drive it like a visitor would: the same
page, runner and job worker as app.py, without the warm-up."""

import contextlib
import os
import socket


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def fresh_estimates():
    """The estimates' learned state (this device's rates and fixed part, the kinds of work compiled) as a new
    server starts with it, and put back after: what other tests in this process ran, on a machine busy or not,
    does not move this one's estimates (a learned CPU speed twice the reference would refuse a job that a fresh
    server admits)."""
    from explorer.app import estimate

    learned = (estimate._measured, estimate._compiled, estimate._fixed)
    saved = [type(kept)(kept) for kept in learned]
    for kept in learned:
        kept.clear()
    try:
        yield
    finally:
        for kept, was in zip(learned, saved, strict=True):
            kept.clear()
            kept.update(was)


@contextlib.contextmanager
def running_app(queue_size: int = 8, models=("distilgpt2", "gpt2"), with_runner: bool = False):
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from explorer.app import serve

    with fresh_estimates():
        demo, launch, runner = serve.app("bundled", models, False, warm=False, log=lambda line: None)
        demo.queue(default_concurrency_limit=1, max_size=queue_size)
        _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **launch)
        try:
            yield (url, runner) if with_runner else url
        finally:
            demo.close()
            runner.close()
