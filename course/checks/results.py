"""Per-exercise results: the one place check results become PASS / FAIL / TODO / SKIP per exercise.

``python -m course check`` (table and ``--json``), the notebooks' grade cells and pytest only format what
``grade_exercises`` returns, and ``describe`` is how each of them shows a check that did not pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Optional, Sequence

from .framework import FAIL, PASS, TODO, CheckResult, Exercise, Lesson
from .parallel import run_checks

SKIP = "SKIP"   # an optional extension this run did not grade


@dataclass
class ExerciseResult:
    exercise: Exercise
    status: str                  # PASS, FAIL, TODO or SKIP
    checks: list[CheckResult]    # the checks that ran, in the lesson's order (none when SKIP)

    @property
    def first_problem(self) -> Optional[CheckResult]:
        """The first check whose status is the exercise's (FAIL before TODO); None when it passed or was skipped."""
        return next((r for r in self.checks if r.status == self.status), None) if self.status in (FAIL, TODO) else None


def exercise_status(results: Sequence[CheckResult]) -> str:
    """FAIL if any check failed, else TODO if any stub is still untouched, else PASS."""
    statuses = {r.status for r in results}
    return FAIL if FAIL in statuses else TODO if TODO in statuses else PASS


def describe(result: CheckResult) -> str:
    """A check that did not pass, as every front end shows it: status and check name first, then its message
    (ACTUAL vs EXPECTED for a failure; for a TODO the stub's message, which names the section to read)."""
    return f"{result.status} {result.check}: {result.message}"


def grade_exercises(lesson: Lesson, module: ModuleType, only: Optional[Sequence[str]] = None,
                    include_optional: bool = False, check_names: Optional[Sequence[str]] = None,
                    jobs: int = 1) -> list[ExerciseResult]:
    """Run the lesson's checks on ``module`` and roll them up per exercise, in the lesson's order.

    ``only``: grade just these exercises (optional ones included when named). ``include_optional``: grade the
    optional extensions too; otherwise they come back SKIP, unrun. ``check_names``: run just these checks (a
    notebook grade cell); only the exercises they belong to come back. ``jobs``: worker processes to share
    the checks out to (``course.checks.parallel``; 1 runs them in-process)."""
    named = set(only or ())
    for name in named:
        lesson.exercise(name)   # a ValueError naming the lesson's exercises
    if check_names is not None:
        known = [c.name for c in lesson.checks]
        if not check_names or any(name not in known for name in check_names):
            raise ValueError(f"check_names must be checks of lesson {lesson.lesson_id} {sorted(known)}, "
                             f"got {list(check_names)}")
    graded = []   # (exercise, its checks to run, or None when it is skipped)
    for exercise in lesson.exercises:
        if named and exercise.name not in named:
            continue
        checks = [c for c in lesson.checks
                  if c.exercise == exercise.name and (check_names is None or c.name in check_names)]
        if check_names is not None and not checks:
            continue
        skipped = exercise.optional and not (include_optional or named or check_names is not None)
        graded.append((exercise, None if skipped else checks))
    ran = iter(run_checks([c for _, checks in graded if checks for c in checks], module, jobs))
    return [ExerciseResult(exercise, SKIP, []) if checks is None
            else _rolled_up(exercise, [next(ran) for _ in checks]) for exercise, checks in graded]


def _rolled_up(exercise: Exercise, results: list[CheckResult]) -> ExerciseResult:
    return ExerciseResult(exercise, exercise_status(results), results)
