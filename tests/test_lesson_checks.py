"""Every check of every lesson, for each implementation: the reference must pass; the student's impl/
is skipped as TODO while a stub is untouched and fails for real once written (tests/conftest.py).

A test id is ``test_check[IMPL-lessonNN-EXERCISE-CHECK]`` (IMPL: student, reference, or dir for ``--impl-dir``),
so ``-k`` picks a lesson or one exercise's checks; the trailing dash keeps ``warmup_cosine_lr`` out:

    python -m pytest tests/test_lesson_checks.py -k lesson14 --impl student
    python -m pytest tests/test_lesson_checks.py --impl-dir DIR -k "lesson14-cosine_lr-"
"""
from __future__ import annotations

import pytest

from course.checks import LESSONS

LESSON_CHECKS = [(lesson, check) for _, lesson in sorted(LESSONS.items()) for check in lesson.checks]


@pytest.mark.parametrize("lesson,check_name", [(lesson, check.name) for lesson, check in LESSON_CHECKS],
                         ids=[f"lesson{lesson.lesson_id}-{check.exercise}-{check.name}" for lesson, check in LESSON_CHECKS])
def test_check(graded, lesson, check_name):
    graded(lesson, check_name)
