"""The mistake catalogue: each typical wrong implementation FAILS the check named for it, with an
ACTUAL vs EXPECTED message; each accepted equivalent form PASSES every check of its lesson."""
from __future__ import annotations

import pytest

from course.checks import LESSONS, get_lesson
from course.checks.framework import FAIL, PASS, grade, run_check

MISTAKES = [m for _, lesson in sorted(LESSONS.items()) for m in lesson.mistakes]
EQUIVALENTS = [m for _, lesson in sorted(LESSONS.items()) for m in lesson.equivalents]


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.lesson}-{m.name}")
def test_mistake_is_caught(mistake):
    lesson = get_lesson(mistake.lesson)
    check = next((c for c in lesson.checks if c.name == mistake.caught_by), None)
    assert check is not None, f"{mistake.name}: no check named {mistake.caught_by!r} in lesson {mistake.lesson}"
    result = run_check(check, mistake.build())
    assert result.status == FAIL, (
        f"{mistake.name} ({mistake.description}) should FAIL {check.name}\n"
        f"  ACTUAL:   {result.status} {result.message[:500]}\n  EXPECTED: FAIL")
    assert "ACTUAL" in result.message and "EXPECTED" in result.message, (
        f"{mistake.name}: the failure message should show ACTUAL vs EXPECTED, got:\n{result.message}")


@pytest.mark.parametrize("equivalent", EQUIVALENTS, ids=lambda m: f"{m.lesson}-{m.name}")
def test_equivalent_form_passes(equivalent):
    results = grade(get_lesson(equivalent.lesson), equivalent.build())
    failed = [f"{r.check}: {r.message[:400]}" for r in results if r.status != PASS]
    assert not failed, f"{equivalent.name} ({equivalent.description}) is algebraically equivalent but failed:\n" + \
        "\n".join(failed)
