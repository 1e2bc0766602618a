"""A job's items produced on a thread of their own, handed to the page in batches.

The Generate view is a generator that Gradio pulls: each update it yields is sent to the browser, and
until Gradio asks for the next one the generator, and any decoding it does, stands still. On a GPU a
decode step takes a fraction of a millisecond and an update tens of milliseconds, so a generation
decoded inside the view ran at a fraction of the device's pace. Here the decoding runs on its own
thread and never waits for the page; the view takes whatever steps are ready each time it is asked.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Iterator

_END = object()  # the items ran out (or the producer stopped)
_NOTHING = object()  # no item came within the wait


class Background:
    """Run `items` (an iterator, e.g. generate()'s Steps) on a thread; read them with batches()."""

    def __init__(self, items: Iterator):
        self._queue: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, args=(items,), name="explorer-job", daemon=True)
        self._thread.start()

    def _produce(self, items) -> None:
        try:
            for item in items:
                self._queue.put(item)
                if self._stop.is_set():
                    break
        except BaseException as e:  # handed to the reader, who raises it
            self._queue.put(e)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()
            self._queue.put(_END)

    def batches(self, interval: float, urgent: Callable[[object], bool] = lambda item: False) -> Iterator[list]:
        """Lists of the items produced since the last list: the first as soon as there is one, then at
        most one list per `interval` seconds (counted from when the reader asks again), sooner when an
        `urgent` item arrives, and the rest when the items end. An exception in the producer is raised here."""
        pending, last = [], -math.inf
        while True:
            if not pending:
                item = self._queue.get()
            else:
                wait = interval - (time.monotonic() - last)
                try:
                    item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    item = _NOTHING
            if item is _END:
                if pending:
                    yield pending
                return
            if isinstance(item, BaseException):
                raise item
            if item is not _NOTHING:
                pending.append(item)
            if pending and (item is _NOTHING or time.monotonic() - last >= interval or urgent(pending[-1])):
                yield pending
                pending, last = [], time.monotonic()

    def stop(self) -> None:
        """Ask the producer to end after the item in progress, and wait until it has."""
        self._stop.set()
        self._thread.join()
