"""A lesson's job: run it for the device at hand, then its explanation and chart."""

from __future__ import annotations

from .. import lessons, views
from .base import Control


def run(payload: dict, control: Control):
    name = payload["lesson"]
    result = lessons.run(name)
    lesson = lessons.LESSONS[name]
    figure = views.figure_json(lesson.figure(result))
    yield {"text": lessons.live_markdown(result), "plot": figure, "ran_s": result.seconds}
