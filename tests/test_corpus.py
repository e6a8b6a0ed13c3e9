"""The grader's other error rate: correct code written by someone else must pass.

``tests/corpus/lessonNN/AUTHOR/<module>.py`` are complete, correct solutions written from the lesson text and
the stubs alone, by authors who never saw the reference, the checks or the tests, each in a style of its own
(loop shapes, helper classes, conversions after the loop, the validation a careful engineer adds, or none).
Each must pass every core exercise through the CLI (``python -m course check NN --impl-dir``) and get every
point through the notebook route: the grade cells' calls on the solution's functions as a notebook defines
them, with nothing on stderr (nbgrader scores a grade cell that writes to stderr 0). Their hardening tiers
are not graded here: conventions beyond the objectives may fail. The false-fail rate (README) is the share
of these that fail.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from course.checks import LESSONS
from course.checks.assignments import scored_cells
from course.checks.notebook import run_checks
from course.cli import main
from course.implementations import REPO_ROOT, load_module

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
def test_a_correct_solution_passes_the_core_through_the_cli(case):
    lesson, path = case
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["check", lesson.lesson_id, "--impl-dir", str(path), "--json", "--jobs", "1"])
    report = json.loads(out.getvalue())
    failed = {e["exercise"]: e["message"][:600] for e in report["exercises"] if e["tier"] == "core"
              and e["status"] != "PASS"}
    assert code == 0 and not failed, f"{path.relative_to(REPO_ROOT)}: correct code failed the core:\n{failed}"
    assert not err.getvalue(), f"the CLI wrote to stderr: {err.getvalue()[-2000:]}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_a_correct_solution_gets_every_point_through_the_notebook_route(case):
    """Every scored grade cell of the lesson's notebook, run on the solution's functions as a notebook's globals:
    no failure and nothing on stderr."""
    lesson, path = case
    namespace = vars(load_module(path / lesson.module_file, f"corpus_{lesson.lesson_id}_{path.name}"))
    lost = {}
    for grade_id, _, names in scored_cells(lesson):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                run_checks(namespace, lesson.lesson_id, *names)
            except AssertionError as exc:
                lost[grade_id] = str(exc)[:600]
        if err.getvalue():
            lost[grade_id] = f"wrote to stderr: {err.getvalue()[:600]}"
    assert not lost, f"{path.relative_to(REPO_ROOT)}: grade cells that would score 0: {lost}"
