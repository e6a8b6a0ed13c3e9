"""Per-exercise results: the one place check results become PASS / FAIL / TODO / SKIP per exercise.

``python -m course check`` (table and ``--json``), the notebooks' grade cells and pytest only format what
``grade_exercises`` returns, and ``describe`` is how each of them shows a check that did not pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Optional, Sequence

from .framework import CORE, FAIL, HARDENING, OPTIONAL, PASS, TODO, CheckResult, Exercise, Lesson
from .parallel import run_checks

SKIP = "SKIP"   # an extension or a hardening tier this run did not grade


@dataclass
class ExerciseResult:
    exercise: Exercise
    status: str                  # PASS, FAIL, TODO or SKIP
    checks: list[CheckResult]    # the checks that ran, in the lesson's order (none when SKIP)
    tier: str = CORE             # CORE (the exit code, points), HARDENING or OPTIONAL (graded by --all only)

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
    """Run the lesson's checks on ``module`` and roll them up per exercise and tier, in the lesson's order.

    A core exercise gives its CORE result and, when it has hardening checks, a HARDENING result after it; an
    extension gives one OPTIONAL result. ``include_optional`` (``check --all``): grade the hardening tiers and
    the extensions too; otherwise they come back SKIP, unrun (an extension named in ``only`` is graded).
    ``only``: grade just these exercises. ``check_names``: run just these checks (a notebook cell); only the
    results they belong to come back. ``jobs``: worker processes to share the checks out to
    (``course.checks.parallel``; 1 runs them in-process)."""
    named = set(only or ())
    for name in named:
        lesson.exercise(name)   # a ValueError naming the lesson's exercises
    if check_names is not None:
        known = [c.name for c in lesson.checks]
        if not check_names or any(name not in known for name in check_names):
            raise ValueError(f"check_names must be checks of lesson {lesson.lesson_id} {sorted(known)}, "
                             f"got {list(check_names)}")
    graded = []   # (exercise, tier, its checks to run, or None when it is skipped)
    for exercise in lesson.exercises:
        if named and exercise.name not in named:
            continue
        for tier in ((OPTIONAL,) if exercise.optional else (CORE, HARDENING)):
            checks = [c for c in lesson.tier_checks(exercise.name, tier)
                      if check_names is None or c.name in check_names]
            if not checks and (check_names is not None or tier == HARDENING):
                continue
            skipped = tier != CORE and not (include_optional or check_names is not None
                                            or (tier == OPTIONAL and exercise.name in named))
            graded.append((exercise, tier, None if skipped else checks))
    ran = iter(run_checks([c for *_, checks in graded if checks for c in checks], module, jobs))
    return [ExerciseResult(exercise, SKIP, [], tier) if checks is None
            else _rolled_up(exercise, [next(ran) for _ in checks], tier) for exercise, tier, checks in graded]


def _rolled_up(exercise: Exercise, results: list[CheckResult], tier: str) -> ExerciseResult:
    return ExerciseResult(exercise, exercise_status(results), results, tier)
