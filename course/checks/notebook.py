"""Grade cells of the nbgrader notebooks: the same check functions as pytest and the CLI.

A notebook's functions live in its globals, so a grade cell hands ``globals()`` over and names the
checks it runs. Anything short of PASS raises ``AssertionError`` (nbgrader then gives the cell 0
points) with each such check's name and ACTUAL vs EXPECTED message, so the student sees why.

nbgrader also gives a grade cell 0 points when anything reaches its stderr (``nbgrader.utils.determine_grade``):
a warning torch or the student's code emits while the checks run (a deprecated ``torch.cuda.amp`` call, say)
is shown on stdout instead, once, and never costs the points.
"""
from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from . import get_lesson
from .framework import PASS
from .results import describe, grade_exercises


STATUS_LINE = re.compile(r"^(PASS|FAIL|TODO)  (\w+)  \(", re.MULTILINE)   # what run_checks prints per check


def statuses_printed(text: str) -> dict[str, str]:
    """check -> status of the checks a grade cell's printed output reports (``run_checks``'s lines)."""
    return {check: status for status, check in STATUS_LINE.findall(text)}


def run_checks(namespace: dict, lesson_id: str, *check_names: str) -> None:
    """Run ``check_names`` of lesson ``lesson_id`` on the functions defined in ``namespace``."""
    lesson = get_lesson(lesson_id)
    needed = [name for check in lesson.checks if check.name in check_names for name in (check.exercise, *check.uses)]
    undefined = [name for name in dict.fromkeys(needed) if name not in namespace]
    if undefined:   # its cell was not run, or raised (a NameError, say) before it defined the function
        raise AssertionError(f"{', '.join(undefined)} is not defined in this notebook: run its exercise cell above; "
                             f"if that cell shows an error, fix it first (the checks need what it defines)")
    notebook = SimpleNamespace(**{k: v for k, v in namespace.items() if isinstance(k, str)})
    with contextlib.redirect_stderr(sys.stdout):   # what the student's code prints there is no verdict either
        results = grade_exercises(lesson, notebook, check_names=check_names)
    checks = [r for e in results for r in e.checks]
    for message in dict.fromkeys(w for r in checks for w in r.warnings):
        print(f"warning (not graded): {message}")
    for result in checks:
        print(f"{result.status:<4}  {result.check}  ({result.seconds:.1f} s)")   # STATUS_LINE reads it
    problems = [describe(r) for r in checks if r.status != PASS]
    if problems:
        raise AssertionError("\n\n".join(problems))


def notebook_module_source(path: Path) -> str:
    """The Python a notebook defines, as one module: its setup cell, its exercise (solution) cells and the code
    cells a student added, in order (what ``python -m course check NN --notebook PATH`` grades). The course's
    other locked cells (figures, grade and check cells) are left out, and so are IPython's ``%`` and ``!`` lines."""
    try:
        cells = json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--notebook {str(path)!r} is not a readable notebook: {exc}") from None
    parts = []
    for cell in cells:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        nbgrader = cell.get("metadata", {}).get("nbgrader", {})
        if nbgrader and not nbgrader.get("solution") and nbgrader.get("grade_id") != "setup":
            continue
        source = cell.get("source", "")
        source = "".join(source) if isinstance(source, list) else str(source)
        parts.append("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    return "\n\n".join(parts) + "\n"
