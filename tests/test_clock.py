"""The decoder keeps no time: generate() marks a clock it is handed, and the measure layer reads the marks."""

import pickle
import time

import pytest

from explorer.measure.clock import Clock, TimedStep, timed
from explorer.model.generate import generate
from tests.test_graphs import random_model

KW = dict(max_new_tokens=5, eos_token_id=-1, warmup=False)


def test_without_a_clock_generate_yields_what_ran_and_no_time(device):
    model = random_model(device).with_backend("torch")
    steps = list(generate(model, [[1, 2, 3]], **KW))
    assert len(steps) == 5 and all(s.marks == () and s.setup_marks == () for s in steps)
    assert not any(hasattr(s, name) for s in steps for name in ("latency_ms", "timer", "wall_s", "warmup_ms"))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_each_step_is_timed_between_its_own_marks(device, backend):
    model = random_model(device).with_backend(backend)
    t0 = time.perf_counter()
    steps = list(timed(model, [[1, 2, 3], [4]], **KW))
    took_ms = (time.perf_counter() - t0) * 1e3
    plain = list(generate(model, [[1, 2, 3], [4]], **KW))
    assert [s.token_ids for s in steps] == [s.token_ids for s in plain]  # timing changes nothing it runs
    assert all(isinstance(s, TimedStep) and s.marks == () for s in steps)  # the marks stay with the clock
    assert all(0 < s.latency_ms for s in steps) and sum(s.latency_ms for s in steps) < took_ms
    walls = [s.wall_s for s in steps]
    assert walls == sorted(walls) and walls[-1] * 1e3 < took_ms
    assert steps[0].warmup_ms == 0 and all(s.warmup_ms == 0 for s in steps[2:])  # no warm-up asked for
    assert steps[1].warmup_ms == 0 or device.type == "cuda"  # a GPU captures its decode graph before step 1
    if device.type == "cpu":
        ran = "Triton interpreter" if backend == "triton" else "PyTorch on CPU"
        assert {s.timer for s in steps} == {f"cpu perf_counter ({ran})"}
        assert all(s.peak_memory_bytes is None for s in steps)
    else:
        assert all(s.peak_memory_bytes > 0 for s in steps)


def test_the_warm_up_is_timed_apart_and_reported_with_the_first_step(device):
    model = random_model(device).with_backend("torch")
    steps = list(timed(model, [[1, 2, 3]], **(KW | dict(warmup=True))))
    assert steps[0].warmup_ms > 0 and all(s.warmup_ms == 0 for s in steps[2:])


def test_a_timed_step_crosses_a_process_boundary(device):
    """The worker sends its steps to the server: with the clock's events left behind, a step pickles."""
    model = random_model(device).with_backend("torch")
    step = next(timed(model, [[1, 2]], **KW))
    back = pickle.loads(pickle.dumps(step))
    assert back == step and back.latency_ms == step.latency_ms


def test_a_clock_reads_host_spans_and_steps_on_its_own_device(device):
    clock = Clock(device, "torch")
    start = clock.begin()
    time.sleep(0.01)
    end = clock.mark()
    assert Clock.host_ms((start, end)) >= 10 and Clock.host_ms(()) == 0
    assert clock.step_ms((start, end)) > 0 and clock.started is start
