"""Guided lessons: one click sets the app's controls, runs a job sized for the device at hand and explains
what it measured, next to the same lesson recorded on a GPU.

A lesson is a module with a LESSON (base.Lesson); the app, the /lesson endpoint, the ?lesson= link and
scripts/record_lessons.py all read this registry, so a new lesson is a module and one line in MODULES below.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from .. import estimate as cost
from .. import models
from ..friendly import friendly
from . import base, recorded
from .base import Lesson, Result, size

# Each lesson's name and its module here, in teaching order.
MODULES = {
    "memory": "memory",
    "decode-step": "decode_step",
    "kv-cache": "kv_cache",
    "tiling": "tiling",
    "cuda-graphs": "launches",
    "prefill-decode": "prefill_decode",
    "fusion": "fusion",
    "blocks": "blocks",
    "sms": "sms",
}


class Registry(Mapping[str, Lesson]):
    """The lessons by name, in teaching order: a lesson's module is imported the first time it is asked for, so
    that a name checked against the registry (a link's ?lesson=, the /lesson endpoint) costs no lesson its import."""

    def __init__(self, modules: dict[str, str]):
        self._modules = modules

    def __getitem__(self, name: str) -> Lesson:
        return importlib.import_module(f"{__name__}.{self._modules[name]}").LESSON

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)


LESSONS: Mapping[str, Lesson] = Registry(MODULES)


def names() -> list[str]:
    return list(LESSONS)


def choices() -> list[tuple[str, str]]:
    """(label, name) pairs, numbered in teaching order."""
    return [(f"{i}. {lesson.title}", name) for i, (name, lesson) in enumerate(LESSONS.items(), 1)]


def run(name: str, size_: str | None = None) -> Result:
    """Run the lesson's job for this device (or for `size_`: "cpu" | "gpu"); a failure is one message."""
    lesson = LESSONS[name]
    try:
        return base.run(lesson, lesson.settings(size_ or size()))
    except Exception as e:
        raise friendly(e) from None


def forget_models() -> None:
    """Drop the models the lessons build for themselves (GPT-2 small's shape, the blocks lesson's pair) and the
    decode graphs each keeps: the next lesson builds and captures them again, as a fresh server's first would
    (scripts/record_lessons.py, before each lesson's first run)."""
    base._gpt2_shape.cache_clear()
    importlib.import_module(f"{__name__}.blocks").pair.cache_clear()


# A lesson's compilation on a GPU when no recording says how long it took.
COMPILE_S = 20.0
# A recorded lesson's time is its job's; through the server its figures take about this much more to reach the
# page.
SERVED_S = 0.15


def estimate(
    name: str, compiled: set[str] | frozenset[str] = frozenset(), size_: str | None = None, folder=None
) -> float:
    """Seconds the lesson's job should take on this device, before it runs. On a GPU, the recorded run
    (scripts/record_lessons.py) when there is one: its time once compiled, plus what its first run in a server
    adds. That is its setup (its model built, its CUDA graphs captured: the recording's run with every kernel
    compiled but the models built anew), until a lesson on the same model has run in this server, and its
    compilation (each lesson compiles kernels of its own: the cache-off runs' lengths, the ladder's rungs, the
    tile sweep's configs). Where the recording names the kernel specializations its first run compiled (in a
    process fresh from the worker's warm-up, whichever lessons ran before), only those not yet in `compiled`
    (the worker's, kernels.compiled) count, until the lesson has run in this server (then its kernels are
    compiled, whatever their names: a recording made before a kernel's specialisation changed names keys
    today's code never compiles): each by the seconds its compilation and first launch took there (a
    launcher of a signature the warm-up did not meet is built then), or, in a recording that did not time them,
    an equal share of the first run's extra seconds. Otherwise all, until the lesson has run in this server.
    size_: "cpu" | "gpu" (this device's by default); folder: where the recordings are (recordings.FOLDER by
    default)."""
    lesson, size_ = LESSONS[name], size_ or size()
    modeled = lesson.estimate(lesson.settings(size_))
    if size_ != "gpu":
        return cost.lesson_seconds(name, modeled)
    rec = recorded.latest(folder)
    r = rec.results.get(name) if rec else None
    warm = r.seconds if r else modeled
    first = max(r.first_s if r and r.first_s else warm + COMPILE_S, warm)  # warm <= rebuilt <= first
    rebuilt = min(max(r.rebuilt_s or warm, warm), first) if r else warm
    own, *built = compiles(name, size_)
    fresh = bool(cost.missing("cuda", [own]))  # the lesson has not run in this server
    unbuilt = bool(cost.missing("cuda", built))  # nor another lesson on its model
    if r and r.kernels and fresh:
        missing = [k for k in r.kernels if k not in compiled]
        if r.compile_s:
            compiling = sum(r.compile_s.get(k, 0.0) for k in missing)
        else:
            compiling = (first - rebuilt) * len(missing) / len(r.kernels)
    else:
        compiling = first - rebuilt if fresh else 0.0
    return SERVED_S + warm + (rebuilt - warm if unbuilt else 0.0) + compiling


def ran(name: str, seconds: float | None) -> None:
    """A lesson's run here took `seconds` (None: it did not finish): its next estimate on this device."""
    if seconds and size() != "gpu":
        cost.record_lesson(name, seconds)


def compiles(name: str, size_: str | None = None) -> list:
    """What the lesson's first run in a server leaves behind (estimate.compiled): its own kernels, and the
    model it builds, which later lessons on the same model find built (GPT-2 small's shape serves six)."""
    s = LESSONS[name].settings(size_ or size())
    return [("lesson", name)] + ([("lesson model", str(s["model"]), s["dtype"])] if "model" in s else [])


def describe(s: dict) -> str:
    """What a lesson's job runs, in a line."""
    if "shape" in s:
        shape = ", ".join(f"{k}={v}" for k, v in s["shape"].items())
        count = 1
        for values in s["grid"].values():
            count *= len(values)
        return f"the {s['kernel']} kernel at {shape} in {s['dtype']}, {count} tile shapes"
    if "tile_choices" in s:
        ways = f"at the {' and '.join(s['rungs'])} rungs, each at {len(s['tile_choices'])} tile choices"
        model = base.MODEL_LABELS[s["model"]]
        if "arch" not in s:
            return f"{model} in {s['dtype']}: one decode step at context {s['context']} {ways}, stamped on every SM"
        return f"{model} in {s['dtype']}: one decode step {ways}, compiled for sm_{s['arch']}'s SMs, not run"
    if "context" in s:
        where = base.on_what(s, "the GPU" if size() == "gpu" else "CPU")
        model = base.MODEL_LABELS[s["model"]]
        return f"{model} in {s['dtype']} ({where}): one decode step at context {s['context']} per rung, and on PyTorch"
    runs = f"prompt of {s['prompt_tokens']} tokens and {s['new_tokens']} new tokens"
    where = base.on_what(s, "the GPU" if size() == "gpu" else "CPU")  # no CUDA call: ZeroGPU has none outside a run
    return f"{base.MODEL_LABELS[s['model']]} in {s['dtype']} ({where}): a {runs}"


def intro(name: str) -> str:
    """The lesson's title, what it runs here and how long that should take."""
    lesson = LESSONS[name]
    s = lesson.settings(size())
    backends = [s.get("backend", "triton")]
    note = cost.note(estimate(name), models.device().type, backends, name)
    return f"### {lesson.title}\n{lesson.summary}\n\nRuns {describe(s)}. {note}"


def live_markdown(result: Result) -> str:
    lesson = LESSONS[result.lesson]
    where = base.on_what(result.settings, result.device)
    return (
        f"#### {lesson.title}, measured just now on {where}, in {result.seconds:.1f} s\n\n{lesson.explain(result)}\n\n"
        f"**What to try next:** {lesson.try_next}"
    )


def recorded_view(name: str, folder=None):
    """(markdown, figure or None): the lesson as recorded on a GPU (the newest recording in `folder`,
    recordings.FOLDER by default), shown where there is none."""
    if size() == "gpu":
        return "", None
    rec = recorded.latest(folder)
    if rec is None:
        return recorded.NONE_YET, None
    result, lesson = rec.results.get(name), LESSONS[name]
    if result is None:
        return f"The GPU recording ({rec.label}) has no lesson {name!r}: it was made before the lesson existed.", None
    head = (
        f"#### {lesson.title}, {rec.label_of(name)}\n{base.on_what(result.settings, result.device)}; "
        f"{rec.versions_of(name)}"
    )
    try:
        return f"{head}\n\n{lesson.explain(result)}", lesson.figure(result)
    except (KeyError, TypeError, ValueError, AttributeError):  # facts or tables this version no longer reads
        return (
            f"The GPU recording ({rec.label_of(name)}) of this lesson was made by an earlier version of it, whose "
            "numbers this one cannot read: run `python scripts/record_lessons.py` on a GPU again.",
            None,
        )


__all__ = [
    "LESSONS",
    "Lesson",
    "Result",
    "choices",
    "estimate",
    "compiles",
    "intro",
    "live_markdown",
    "names",
    "recorded_view",
    "run",
    "size",
]
