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
def running_app(queue_size: int = 8, models=("distilgpt2", "gpt2"), with_runner: bool = False):
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from explorer.app import serve

    demo, launch, runner = serve.app("bundled", models, False, warm=False, log=lambda line: None)
    demo.queue(default_concurrency_limit=1, max_size=queue_size)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, **launch)
    try:
        yield (url, runner) if with_runner else url
    finally:
        demo.close()
        runner.close()
