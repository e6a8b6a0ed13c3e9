"""The grader's other error rate: correct code written by someone else must pass.

``tests/corpus/lessonNN/AUTHOR/<module>.py`` are complete, correct solutions written from the lesson text and
the stubs alone, by authors who never saw the reference, the checks or the tests, each in a style of its own
(loop shapes, helper classes, conversions after the loop, the validation a careful engineer adds, or none).
Each must pass every core exercise through the CLI (``python -m course check NN --impl-dir``), with nothing on
stderr, and pass every check a scored grade cell of the notebook runs (graded once: the grade cells run the same
checks on the same functions). Their hardening tiers are not graded here: conventions beyond the objectives may
fail. The false-fail rate (README) is the share of these that fail.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from course.checks import LESSONS
from course.checks.assignments import scored_cells
from course.cli import main
from course.implementations import REPO_ROOT

CORPUS = REPO_ROOT / "tests" / "corpus"
MINIMUM = 8   # solutions per lesson


def solutions(lesson) -> list[Path]:
    folder = CORPUS / f"lesson{lesson.lesson_id}"
    return sorted(p for p in folder.iterdir() if (p / lesson.module_file).is_file()) if folder.is_dir() else []


CASES = [(lesson, path) for _, lesson in sorted(LESSONS.items()) for path in solutions(lesson)]


@pytest.mark.parametrize("lesson", [lesson for _, lesson in sorted(LESSONS.items())], ids=lambda l: l.lesson_id)
def test_every_lesson_has_its_independent_solutions(lesson):
    assert len(solutions(lesson)) >= MINIMUM, (
        f"lesson {lesson.lesson_id}: ACTUAL {len(solutions(lesson))} independent solutions under "
        f"{(CORPUS / f'lesson{lesson.lesson_id}').relative_to(REPO_ROOT)}, EXPECTED at least {MINIMUM}")


def case_id(case) -> str:
    lesson, path = case
    return f"{lesson.lesson_id}-{path.name}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_correct_solution_passes_the_core_and_gets_every_notebook_point(case):
    """Graded once, through the CLI: exit 0, every core check passed, nothing on stderr; and every check that a
    scored grade cell of the notebook runs is among the passed ones (the grade cells run the same checks on the
    same functions through ``run_checks``; that adapter is tested on the reference by tests/test_notebooks.py)."""
    lesson, path = case
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", lesson.lesson_id, "--impl-dir", str(path), "--json", "--jobs", "1"])
    report = json.loads(out.getvalue())
    failed = {e["exercise"]: e["message"][:600] for e in report["exercises"] if e["tier"] == "core"
              and e["status"] != "PASS"}
    assert code == 0 and not failed, f"{path.relative_to(REPO_ROOT)}: correct code failed the core:\n{failed}"
    assert not err.getvalue(), f"the CLI wrote to stderr: {err.getvalue()[-2000:]}"
    passed = {c["check"] for e in report["exercises"] for c in e["checks"] if c["status"] == "PASS"}
    lost = {grade_id: sorted(set(names) - passed) for grade_id, _, names in scored_cells(lesson)
            if set(names) - passed}
    assert not lost, f"{path.relative_to(REPO_ROOT)}: grade cells that would score 0 (checks not passed): {lost}"
