"""Start the app in this process on a free port, for tests that drive it like a visitor would."""

import contextlib
import os
import socket


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(queue_size: int = 8):
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    from explorer.app import ui

    demo = ui.build()
    demo.queue(default_concurrency_limit=1, max_size=queue_size)
    _, url, _ = demo.launch(prevent_thread_lock=True, server_port=free_port(), quiet=True, theme=ui.THEME, css=ui.CSS)
    try:
        yield url
    finally:
        demo.close()
