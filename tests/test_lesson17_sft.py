"""Lesson 17: what the checks cannot show (every check already runs for the student and the reference
in tests/test_lesson_checks.py): the oracle pieces this lesson adds, its labs, its stage assembly."""
from __future__ import annotations

from course.checks import get_lesson

LESSON = get_lesson("17")


def test_lesson17_beyond_the_checks():
    """TODO(author): a test that can fail, e.g. the oracle against upstream numbers, or a lab's output."""
    raise NotImplementedError("TODO(author): write the lesson's own tests")
