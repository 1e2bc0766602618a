"""The estimate shown before a long job: grows with the job, labelled as an estimate, timed by the last
run on this device once there is one."""

import pytest

from explorer.app import actions, estimate, ui


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(estimate, "_measured", {})
    monkeypatch.setattr(estimate, "_compiled", set())


def test_cost_grows_with_the_job():
    steps = lambda **kw: estimate.layer_steps(**{"model": "bundled", "prompt": 8, "new_tokens": 8, "cache": True} | kw)
    assert steps(new_tokens=64) > 4 * steps(new_tokens=8)
    assert steps(cache=False, new_tokens=64) > steps(new_tokens=64)  # every cache-off step runs the whole sequence
    assert steps(model="gpt2") == pytest.approx(6 * steps())  # twice the layers, three times the width
    assert steps(profiled=3) > steps() > steps(warmup=False)


def test_the_note_says_it_is_an_estimate_and_where_its_rate_comes_from():
    units = estimate.layer_steps("bundled", 8, 200, True)
    note = estimate.note(estimate.seconds("cpu", "triton", units), "cpu")
    assert note.startswith("*Estimate: about ") and "on this CPU (a conservative guess" in note
    estimate.record("cpu", "triton", units, wall_s=units * 0.01)
    assert estimate.seconds("cpu", "triton", units) == pytest.approx(units * 0.01)
    assert "from the last run here" in estimate.note(estimate.seconds("cpu", "triton", units), "cpu")
    assert estimate.note(0.2, "cpu") == "*Estimate: under a second on this CPU.*"
    assert "min on this GPU" in estimate.note(600, "cuda")


def test_generate_and_compare_notes_follow_their_controls():
    note = lambda tokens: ui.generate_estimate("bundled", "def f(x):", 0, tokens, 1, "triton", True)
    assert note(8).startswith("*Estimate: about ")
    if actions.device().type == "cpu":
        assert "min on this CPU" in note(400)
        seconds = lambda text: float(text.split("about ")[1].split(" s ")[0])
        assert seconds(note(60)) > 3 * seconds(note(8))
    assert ui.generate_estimate("bundled", "x", 0, "many", 1, "triton", True) == ""  # a bad value: no note
    assert ui.compare_estimate("bundled", 8, True, "8") != ui.compare_estimate("bundled", 8, True, "8, 64, 256")
    assert ui.compare_estimate("bundled", 8, True, "eight") == ""


def test_a_finished_generation_times_the_next_estimate():
    list(actions.run_generation(actions.RunSettings(prompt="x = 1", new_tokens=2, backend="torch")))
    assert estimate._measured[(actions.device().type, "torch")] > 0
