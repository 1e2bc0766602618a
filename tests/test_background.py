"""Decoding on its own thread: the reader gets every item in order, in batches, without pausing the
producer; errors reach the reader; stopping ends the producer after the item in progress."""

import itertools
import time

import pytest

from explorer.app.background import Background


def timed(n, every_s=0.0):
    """n items, each with the time it was produced."""
    for i in range(n):
        time.sleep(every_s)
        yield i, time.monotonic()


def test_a_slow_reader_gets_every_item_in_order_and_never_pauses_the_producer():
    worker = Background(timed(40, 0.001))
    time.sleep(0.5)  # the page busy with an update: nothing reads
    reading = time.monotonic()
    got = []
    for batch in worker.batches(0.05):
        got += batch
        time.sleep(0.05)
    worker.stop()
    assert [i for i, _ in got] == list(range(40))
    assert max(t for _, t in got) < reading  # every item was made while nothing read


def test_the_first_item_and_an_urgent_one_come_at_once():
    def items():
        yield "first"
        time.sleep(0.05)
        yield "urgent"
        time.sleep(1.0)
        yield "late"

    worker = Background(items())
    t0 = time.monotonic()
    batches = worker.batches(10.0, urgent=lambda item: item == "urgent")
    assert next(batches) == ["first"] and time.monotonic() - t0 < 0.5
    assert next(batches) == ["urgent"] and time.monotonic() - t0 < 0.5  # not held for the 10 s interval
    assert next(batches) == ["late"]
    worker.stop()


def test_an_error_in_the_producer_is_raised_to_the_reader():
    def failing():
        yield 1
        raise RuntimeError("out of memory, say")

    worker = Background(failing())
    with pytest.raises(RuntimeError, match="out of memory, say"):
        list(worker.batches(0.0))
    worker.stop()


def test_stop_ends_an_endless_producer_after_the_item_in_progress_and_closes_it():
    closed = []

    def endless():
        try:
            for i in itertools.count():
                time.sleep(0.01)
                yield i
        finally:
            closed.append(True)

    worker = Background(endless())
    next(worker.batches(0.0))
    t0 = time.monotonic()
    worker.stop()
    assert time.monotonic() - t0 < 1.0 and closed == [True]
