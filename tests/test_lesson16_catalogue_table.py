"""Lesson 16's notes (§6, "the mistake catalogue, per objective") count the catalogue per tier and objective instead
of listing its rules (a student sees a mistake's rule when it is theirs, or when they ask): both notes texts'
tables must hold the catalogue's counts as they are, a row per objective of the descriptor and one for the
hardening tier (lesson §4.5)."""
from __future__ import annotations

import re
from collections import Counter

import pytest
from prediction_labs import text_id

from course.checks import get_lesson

LESSON = get_lesson("16")
ROW = re.compile(r"(?m)^\| [^|]+ \| (`\w+`|§4\.5) \| (\d+)")


def catalogue_counts() -> dict[str, int]:
    """Catalogued mistakes per objective of the check that catches them ("hardening" for a hardening check)."""
    objective = {c.name: c.objective or "hardening" for c in LESSON.checks}
    counts = Counter(objective[m.caught_by] for m in LESSON.mistakes)
    return {name: counts[name] for name in [*LESSON.objectives, "hardening"]}


NOTES = [LESSON.files()["notes (en)"], LESSON.files()["notes (zh)"]]


@pytest.mark.parametrize("notes", NOTES, ids=text_id)
def test_the_notes_count_the_catalogue_per_objective(notes):
    text = notes.read_text(encoding="utf-8")
    start = text.index('<a id="l16-notes-catalogue"></a>')
    section = text[start:text.index('<a id="l16-notes-', start + 1)]
    shown = {("hardening" if key == "§4.5" else key.strip("`")): int(count) for key, count in ROW.findall(section)}
    assert shown == catalogue_counts(), (f"{notes.name} catalogue\n  ACTUAL:   {shown}\n"
                                         f"  EXPECTED: {catalogue_counts()}\n"
                                         "  (a mistake was catalogued or moved: update the table in both notes texts)")
