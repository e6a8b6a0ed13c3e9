"""The grader: one ``Lesson`` descriptor per ``lessonNN`` package here, discovered, never listed by hand.

Each ``course/checks/lessonNN/__init__.py`` is the lesson's complete descriptor ``LESSON`` (texts, stub,
reference, exercises, notebook points, labs): its checks are the ``@check`` functions of the package's
check modules (``checks_in``), its mistakes and accepted equivalents the ``mistake(...)`` /
``equivalent(...)`` entries of ``mistakes.py``. ``Lesson.files()`` spells every path of a lesson.
"""
from __future__ import annotations

import importlib
import pkgutil
import re

from .framework import FAIL, PASS, TODO, CheckFailure, Lesson, run_check

LESSON_MODULE = re.compile(r"^lesson(\d+)$")


def _discover() -> dict[str, Lesson]:
    lessons = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        match = LESSON_MODULE.match(info.name)
        if match:
            lesson = importlib.import_module(f"{__name__}.{info.name}").LESSON
            if lesson.lesson_id != match.group(1):
                raise ValueError(f"course/checks/{info.name}/ describes lesson {lesson.lesson_id!r}, "
                                 f"expected {match.group(1)!r}")
            lessons[lesson.lesson_id] = lesson
    return lessons


LESSONS: dict[str, Lesson] = _discover()


def get_lesson(lesson_id: str) -> Lesson:
    if lesson_id not in LESSONS:
        raise ValueError(f"lesson must be one of {sorted(LESSONS)}, got {lesson_id!r}")
    return LESSONS[lesson_id]


__all__ = ["LESSONS", "get_lesson", "Lesson", "CheckFailure", "run_check", "PASS", "FAIL", "TODO"]
