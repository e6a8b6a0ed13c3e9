"""Lesson 16 §7 counts the mistake catalogue per tier and objective instead of listing its rules (a student sees a
mistake's rule when it is theirs, or when they ask): both texts' tables must hold the catalogue's counts as they
are, a row per objective of the descriptor and one for the hardening tier."""
from __future__ import annotations

import re
from collections import Counter

import pytest
from prediction_labs import lesson_texts, text_id

from course.checks import get_lesson

LESSON = get_lesson("16")
ROW = re.compile(r"(?m)^\| [^|]+ \| (`\w+`|§4\.5) \| (\d+)")


def catalogue_counts() -> dict[str, int]:
    """Catalogued mistakes per objective of the check that catches them ("hardening" for a hardening check)."""
    objective = {c.name: c.objective or "hardening" for c in LESSON.checks}
    counts = Counter(objective[m.caught_by] for m in LESSON.mistakes)
    return {name: counts[name] for name in [*LESSON.objectives, "hardening"]}


@pytest.mark.parametrize("lesson", lesson_texts("16"), ids=text_id)
def test_section_7_counts_the_catalogue_per_objective(lesson):
    text = lesson.read_text(encoding="utf-8")
    section = text[text.index('<a id="l16-mistakes"></a>'):text.index('<a id="l16-commands"></a>')]
    shown = {("hardening" if key == "§4.5" else key.strip("`")): int(count) for key, count in ROW.findall(section)}
    assert shown == catalogue_counts(), (f"{lesson.name} §7\n  ACTUAL:   {shown}\n  EXPECTED: {catalogue_counts()}\n"
                                         "  (a mistake was catalogued or moved: update the table in both texts)")
