"""Grading: one registry of lessons, each with its exercises and check functions."""
from . import lesson14, lesson15, lesson16
from .framework import FAIL, PASS, TODO, CheckFailure, Lesson, grade, load_impl, run_check

LESSONS: dict[str, Lesson] = {
    lesson14.LESSON.lesson_id: lesson14.LESSON,
    lesson15.LESSON.lesson_id: lesson15.LESSON,
    lesson16.LESSON.lesson_id: lesson16.LESSON,
}


def get_lesson(lesson_id: str) -> Lesson:
    if lesson_id not in LESSONS:
        raise ValueError(f"lesson must be one of {sorted(LESSONS)}, got {lesson_id!r}")
    return LESSONS[lesson_id]


__all__ = ["LESSONS", "get_lesson", "Lesson", "CheckFailure", "grade", "load_impl", "run_check",
           "PASS", "FAIL", "TODO"]
