"""The mistake catalogue: each typical wrong implementation FAILS the check named for it, with an
ACTUAL vs EXPECTED message; each accepted equivalent form PASSES every check that can run what it edits; and
``python -m course mistakes NN --verify`` reports an entry whose edit no longer applies."""
from __future__ import annotations

import dataclasses

import pytest

from mistake_results import mistake_result

from course import cli
from course.checks import LESSONS, get_lesson
from course.checks.catalogue import Mistake, verify
from course.checks.framework import FAIL, PASS
from course.checks.mutants import exercises_reaching
from course.checks.results import grade_exercises

MISTAKES = [m for _, lesson in sorted(LESSONS.items()) for m in lesson.mistakes]
EQUIVALENTS = [m for _, lesson in sorted(LESSONS.items()) for m in lesson.equivalents]


@pytest.mark.parametrize("mistake", MISTAKES, ids=lambda m: f"{m.lesson}-{m.name}")
def test_mistake_is_caught(mistake):
    lesson = get_lesson(mistake.lesson)
    check = next((c for c in lesson.checks if c.name == mistake.caught_by), None)
    assert check is not None, f"{mistake.name}: no check named {mistake.caught_by!r} in lesson {mistake.lesson}"
    result = mistake_result(mistake)
    assert result.status == FAIL, (
        f"{mistake.name} ({mistake.description}) should FAIL {check.name}\n"
        f"  ACTUAL:   {result.status} {result.message[:500]}\n  EXPECTED: FAIL")
    assert "ACTUAL" in result.message and "EXPECTED" in result.message, (
        f"{mistake.name}: the failure message should show ACTUAL vs EXPECTED, got:\n{result.message}")


@pytest.mark.parametrize("equivalent", EQUIVALENTS, ids=lambda m: f"{m.lesson}-{m.name}")
def test_equivalent_form_passes(equivalent):
    """Graded on the checks of every exercise whose code can run the edited function (course/checks/mutants.py's
    exercises_reaching): the other checks run none of the edited code."""
    lesson = get_lesson(equivalent.lesson)
    reaching = exercises_reaching(lesson, lesson.files()["reference"].read_text(encoding="utf-8"),
                                  equivalent.function)
    exercises = grade_exercises(lesson, equivalent.build(), only=reaching, include_optional=True)
    assert any(e.checks for e in exercises), f"{equivalent.name}: no check runs {equivalent.function}"
    failed = [f"{r.check}: {r.message[:400]}" for e in exercises for r in e.checks if r.status != PASS]
    assert not failed, f"{equivalent.name} ({equivalent.description}) is algebraically equivalent but failed:\n" + \
        "\n".join(failed)


@pytest.mark.parametrize("lesson", sorted(LESSONS), ids=lambda lesson_id: f"lesson{lesson_id}")
def test_verify_finds_every_entry_applies(lesson, capsys):
    """Cheap (the edits are made, nothing is graded): every real entry still applies to its function."""
    entries = [*get_lesson(lesson).mistakes, *get_lesson(lesson).equivalents]
    assert verify(entries) == [], "\n".join(verify(entries))
    assert cli.main(["mistakes", lesson, "--verify"]) == 0
    assert capsys.readouterr().out == f"OK: {len(entries)} entries apply\n"


def test_verify_reports_a_stale_entry_with_the_nearest_line_and_exits_1(monkeypatch, capsys):
    """An entry whose 'old' snippet is not in its function (here: the right line, misspelled) is reported with
    its name, its function and the reference line nearest to what it looks for."""
    lesson = get_lesson("14")
    stale = Mistake("stale_entry", "looks for a line the reference no longer has", "should_step_optimizer",
                    "return step % accumulation_step == 0", "return True", lesson.mistakes[0].caught_by)
    with_stale = dataclasses.replace(lesson, mistakes=(*lesson.mistakes, stale))
    monkeypatch.setattr(cli, "get_lesson", lambda lesson_id: with_stale)
    assert cli.main(["mistakes", "14", "--verify"]) == 1
    out, err = capsys.readouterr()
    [line] = out.splitlines()
    expected = ("mistake 'stale_entry'", "should_step_optimizer", "nearest line",
                "return step % accumulation_steps == 0")
    assert all(part in line for part in expected), f"ACTUAL:   {line!r}\nEXPECTED: a line with {expected}"
    assert "1 of" in err, err


def test_mistakes_listing_names_the_function_each_entry_edits(capsys):
    lesson = get_lesson("15")
    assert cli.main(["mistakes", "15"]) == 0
    out = capsys.readouterr().out
    for entry in lesson.mistakes:
        expected = f"edits {entry.function}, caught by {entry.caught_by}"
        assert expected in out, f"{entry.name}: EXPECTED {expected!r} in the listing, ACTUAL:\n{out}"
