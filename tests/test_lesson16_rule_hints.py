"""Lesson 16's failure messages name the rule a catalogued mistake breaks: each mistake fails its check with a
``hint:`` line (a computed cause, or the rule the stub's docstring states), so a student who fails a check
learns which stated rule to reread, not only that ACTUAL differs from EXPECTED."""
from __future__ import annotations

import pytest

from mistake_results import mistake_result

from course.checks import get_lesson
from course.checks.framework import FAIL, CheckFailure
from course.checks.lesson16.checks import rule

LESSON = get_lesson("16")


@pytest.mark.parametrize("mistake", LESSON.mistakes, ids=lambda m: m.name)
def test_failure_names_the_broken_rule(mistake):
    check = next(c for c in LESSON.checks if c.name == mistake.caught_by)
    result = mistake_result(mistake)
    assert result.status == FAIL, f"{mistake.name} should fail {check.name}, got {result.status}"
    hint = next((line.strip() for line in result.message.splitlines() if line.strip().startswith("hint:")), None)
    assert hint and len(hint) > len("hint: ") + 20, (
        f"{mistake.name} ({mistake.description}) fails {check.name} without naming the rule:\n{result.message}")


def test_rule_adds_its_text_once_and_keeps_a_computed_hint():
    with pytest.raises(CheckFailure) as plain:
        with rule("the rule text"):
            raise CheckFailure("what\n  ACTUAL:   1\n  EXPECTED: 2")
    assert str(plain.value).endswith("hint: the rule: the rule text")
    with pytest.raises(CheckFailure) as computed:
        with rule("the rule text"):
            raise CheckFailure("what\n  ACTUAL:   1\n  EXPECTED: 2\n  hint: a computed cause")
    assert "the rule text" not in str(computed.value) and "a computed cause" in str(computed.value)
