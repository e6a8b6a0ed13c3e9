"""Grade cells of the nbgrader notebooks: the same check functions as pytest and the CLI.

A notebook's functions live in its globals, so a grade cell hands ``globals()`` over and names the
checks it runs. Anything short of PASS raises ``AssertionError`` (nbgrader then gives the cell 0
points) with the check's ACTUAL vs EXPECTED message, so the student sees why.
"""
from __future__ import annotations

from types import SimpleNamespace

from . import get_lesson
from .framework import PASS, TODO, run_check


def run_checks(namespace: dict, lesson_id: str, *check_names: str) -> None:
    """Run ``check_names`` of lesson ``lesson_id`` on the functions defined in ``namespace``."""
    lesson = get_lesson(lesson_id)
    by_name = {c.name: c for c in lesson.checks}
    unknown = [name for name in check_names if name not in by_name]
    if not check_names or unknown:
        raise ValueError(f"check_names must be checks of lesson {lesson_id} {sorted(by_name)}, "
                         f"got {list(check_names)}")
    notebook = SimpleNamespace(**{k: v for k, v in namespace.items() if isinstance(k, str)})
    problems = []
    for name in check_names:
        result = run_check(by_name[name], notebook)
        print(f"{result.status:<4}  {name}  ({result.seconds:.1f} s)")
        if result.status == TODO:
            problems.append(f"TODO {name}: {result.message} - read lesson {lesson.section_of(result.exercise)}")
        elif result.status != PASS:
            problems.append(f"FAIL {name}:\n{result.message}")
    if problems:
        raise AssertionError("\n\n".join(problems))
