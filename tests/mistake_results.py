"""One grading of each catalogued mistake per test session: the mistake-catalogue test and the tests that read
its failure message (hints naming the cause or the rule) share it instead of grading the mistake again."""
from __future__ import annotations

import functools

from course.checks import get_lesson
from course.checks.catalogue import Mistake
from course.checks.framework import CheckResult, run_check


@functools.lru_cache(maxsize=None)
def mistake_result(mistake: Mistake) -> CheckResult:
    """The check that must catch ``mistake``, run on the reference with the mistake's edit."""
    lesson = get_lesson(mistake.lesson)
    check = next((c for c in lesson.checks if c.name == mistake.caught_by), None)
    assert check is not None, f"{mistake.name}: no check named {mistake.caught_by!r} in lesson {mistake.lesson}"
    return run_check(check, mistake.build())
