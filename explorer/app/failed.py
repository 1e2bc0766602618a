"""A job refused or failed, as the page shows it: its status line says what went wrong, and its panels keep the
last good run's (the status says so) or, where the failed run had begun to fill them, are cleared. Never an error
on every output, which is what Gradio shows for an event that raises (a red badge on each panel while the status
line still reads "Done"). API clients get the refusal as an error: their endpoint is the handler itself."""

from __future__ import annotations

import functools

import gradio as gr

KEPT = "Anything shown below is from the last good run."
CLEARED = "What it had shown is cleared."


def status(message: str, cleared: bool) -> str:
    return f"**Failed:** {message} {CLEARED if cleared else KEPT}"


def on_page(handler, count: int, status_at: int, panels: list[int]):
    """`handler` (an async generator of `count` outputs) for the page: when it raises gr.Error, one last update
    puts the message in output `status_at`, and clears the `panels` (indices) if this run had put anything in one,
    leaving the others (the page's state among them) as they were."""

    @functools.wraps(handler)
    async def page(*args):
        filled = False
        try:
            async for out in handler(*args):
                filled = filled or any(not _skipped(out[i]) for i in panels)
                yield out
        except gr.Error as e:
            last = [gr.skip()] * count
            for i in panels if filled else ():
                last[i] = None
            last[status_at] = status(e.message, filled)
            yield tuple(last)

    return page


def _skipped(value) -> bool:
    return isinstance(value, dict) and value == gr.skip()
