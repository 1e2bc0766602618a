"""Every lesson's chart drawn from a GPU's numbers (the shipped H200 recording) and from a CPU's (the same
run with every time stretched so that the longest takes seconds, as in the Triton interpreter): each time
axis is in the unit, µs, ms or s, in which its numbers read plainly, never 2M µs or 0.0002 ms. No lesson
is run here."""

import copy
import math
from collections import defaultdict

import pytest

from explorer.app import lessons, recordings
from explorer.app.lessons import recorded

H200 = recorded.load(recordings.FOLDER / "lessons_h200.json")
INTERPRETER_LONGEST_MS = 5000.0  # the interpreter's slowest step, or tile shape in the sweep
TIME_COLUMNS = ("latency_ms", "kernel_ms", "step_ms", "us", "t_us")
UNITS = ("µs", "ms", "s")


def _on_cpu(r):
    """The recorded GPU run as if the interpreter had run it: every time in its tables and facts longer, by
    as much as takes its longest to seconds."""
    r = copy.deepcopy(r)
    longest = max(
        t[c].max() / (1e3 if c.endswith("us") else 1) for t in r.tables.values() for c in TIME_COLUMNS if c in t
    )
    slower = INTERPRETER_LONGEST_MS / longest
    for table in r.tables.values():
        for column in TIME_COLUMNS:
            if column in table:
                table[column] = table[column] * slower
    r.facts = {k: v * slower if isinstance(v, float) and k.endswith(("_ms", "_us")) else v for k, v in r.facts.items()}
    r.device = "CPU"
    return r


def _number(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _time_axes(fig):
    """{axis: (its layout, the values drawn on it, the bar labels on it)} for every axis whose title
    starts with a unit of time."""
    values, labels = defaultdict(list), defaultdict(list)
    for t in fig.data:
        if t.type not in ("bar", "scatter"):
            continue
        horizontal = t.orientation == "h"
        drawn = [(t.xaxis or "x", t.x), (t.yaxis or "y", t.y)] if t.type == "scatter" else []
        if t.type == "bar":  # a bar's length is its value; its other axis names it
            drawn = [(t.xaxis or "x", t.x)] if horizontal else [(t.yaxis or "y", t.y)]
        for ref, data in drawn:  # a scatter of times may draw them on either axis (a timeline: across)
            name = f"{ref[0]}axis{ref[1:]}"
            values[name] += [float(v) for v in data if _number(v)]
            labels[name] += list(t.text or []) if t.type == "bar" else []
    out = {}
    for name, drawn in values.items():
        axis = fig.layout[name]
        title = axis.title.text or ""
        if title.split(" ")[0] in UNITS:
            out[name] = (axis, drawn, labels[name])
    return out


# The SMs lesson times nothing in the interpreter (its kernels are compiled for a GPU and placed, not run): its
# timeline chart is drawn from a GPU's numbers only.
RESULTS = [(name, size) for name in H200.results for size in ("gpu", "cpu") if size == "gpu" or name != "sms"]


@pytest.mark.parametrize("name, size", RESULTS)
def test_a_time_axis_reads_in_plain_numbers_on_a_gpu_and_in_the_interpreter(name, size):
    r = H200.results[name] if size == "gpu" else _on_cpu(H200.results[name])
    fig = lessons.LESSONS[name].figure(r)
    axes = _time_axes(fig)
    bytes_only = name in ("memory", "blocks")  # charts of bytes: no time axis to read
    assert bool(axes) == (not bytes_only), f"{name}: every chart of times names their unit on its axis"
    for axis, drawn, labels in axes.values():
        if axis.type == "log":
            middle = math.sqrt(min(drawn) * max(drawn))
            assert 1 <= middle < 1000, (name, axis.title.text, min(drawn), max(drawn))
            assert axis.exponentformat == "none"  # 0.001 and 1000, not 1m and 1k
        else:
            assert 1 <= max(drawn) < 1000, (name, axis.title.text, max(drawn))
        for label in labels:  # a bar's label is a number in the axis's unit
            assert float(label.replace(",", "")) < 1000, (name, label)
