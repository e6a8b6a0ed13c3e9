"""Every check of every lesson, for each implementation: the reference must pass; the student's impl/
is skipped as TODO while a stub is untouched and fails for real once written (tests/conftest.py).

    python -m pytest tests/test_lesson_checks.py -k lesson14 --impl student
"""
from __future__ import annotations

import pytest

from course.checks import LESSONS

LESSON_CHECKS = [(lesson, check.name) for _, lesson in sorted(LESSONS.items()) for check in lesson.checks]


@pytest.mark.parametrize("lesson,check_name", LESSON_CHECKS,
                         ids=[f"lesson{lesson.lesson_id}-{name}" for lesson, name in LESSON_CHECKS])
def test_check(graded, lesson, check_name):
    graded(lesson, check_name)
