"""A failure leads to its own rule: for every catalogued mistake of the core tier that states its ``rule``, the
failure message of the check that catches it has a ``hint:`` containing those words. A hint that names another
mistake's cause sends a student the wrong way (an lr one micro-step late told to "write the lr into every
param group"); every core mistake must state its rule (tests/test_lessons_complete.py could not see a hint)."""
from __future__ import annotations

import pytest

from mistake_results import mistake_result

from course.checks import LESSONS
from course.checks.framework import CORE, FAIL

CORE_MISTAKES = [m for _, lesson in sorted(LESSONS.items()) for m in lesson.mistakes
                 if next(c for c in lesson.checks if c.name == m.caught_by).tier == CORE
                 and not lesson.exercise(next(c for c in lesson.checks if c.name == m.caught_by).exercise).optional]


@pytest.mark.parametrize("mistake", CORE_MISTAKES, ids=lambda m: f"{m.lesson}-{m.name}")
def test_a_core_mistake_gets_the_hint_of_its_own_rule(mistake):
    assert mistake.rule, f"{mistake.name} ({mistake.description}) states no rule= for its hint to name"
    result = mistake_result(mistake)
    assert result.status == FAIL, f"{mistake.name} should fail {mistake.caught_by}: ACTUAL {result.status}"
    hints = [line.strip() for line in result.message.splitlines() if line.strip().startswith("hint:")]
    assert any(mistake.rule.lower() in hint.lower() for hint in hints), (
        f"{mistake.name} ({mistake.description}) fails {mistake.caught_by}\n  ACTUAL hints: {hints}\n"
        f"  EXPECTED a hint naming: {mistake.rule!r}\n  message:\n{result.message[:1500]}")
