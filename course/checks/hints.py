"""The hint ladder: four hints per exercise, each a step closer to the answer - the idea, where to look in
the oracle, the rule, a near-solution. ``python -m course hint NN EXERCISE`` shows the next one and remembers
how far each exercise went in a local file (``.hints.json`` at the repository root, or the path in
``MINIMIND_COURSE_HINTS``), so ``python -m course check`` can say how many hints were used. The notebooks carry
the same hints in collapsed cells under each exercise.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

from course.implementations import REPO_ROOT

LEVELS = ("the idea", "where to look in the oracle", "the rule", "a near-solution")
HINTS_FILE_VARIABLE = "MINIMIND_COURSE_HINTS"


def hints_file() -> Path:
    return Path(os.environ.get(HINTS_FILE_VARIABLE) or REPO_ROOT / ".hints.json")


def _read() -> dict:
    path = hints_file()
    if not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not the hint ladder's json ({exc}); delete it to start again") from None
    return state if isinstance(state, dict) else {}


def used(lesson_id: str) -> dict[str, int]:
    """How many hints each exercise of the lesson has shown (exercises with none are left out)."""
    return {name: level for name, level in _read().get(lesson_id, {}).items() if level}


def _save(lesson_id: str, exercise: str, level: int) -> None:
    state = _read()
    state.setdefault(lesson_id, {})[exercise] = level
    path = hints_file()
    path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def next_hint(lesson_id: str, hints: Mapping[str, tuple[str, ...]], exercise: str, *,
              again: bool = False) -> tuple[int, str]:
    """(level, text) of the exercise's next hint (1-based; ``again``: the last one shown), remembered."""
    if exercise not in hints:
        raise ValueError(f"exercise must be one of {sorted(hints)} (lesson {lesson_id}'s exercises with hints), "
                         f"got {exercise!r}")
    shown = used(lesson_id).get(exercise, 0)
    level = max(shown, 1) if again else min(shown + 1, len(LEVELS))
    _save(lesson_id, exercise, level)
    return level, hints[exercise][level - 1]


def reset(lesson_id: str, exercise: str) -> None:
    _save(lesson_id, exercise, 0)


def validate(lesson_id: str, hints: Mapping[str, tuple[str, ...]], exercises) -> None:
    """Every exercise with hints has one per level and belongs to the lesson."""
    names = [e.name for e in exercises]
    for exercise, ladder in hints.items():
        if exercise not in names:
            raise ValueError(f"lesson {lesson_id}: hints for {exercise!r}, which is not one of its exercises {names}")
        if len(ladder) != len(LEVELS) or not all(isinstance(h, str) and h.strip() for h in ladder):
            raise ValueError(f"lesson {lesson_id}: {exercise!r} needs {len(LEVELS)} hints ({', '.join(LEVELS)}), "
                             f"got {len(ladder)}")


def notebook_cell(lesson_id: str, exercise: str, section: str) -> str:
    """Markdown of the cell under an exercise: where its hints and, after an attempt, its answer are. Neither
    stands in the notebook, whose markdown a student sees unfolded in its source (the CLI also remembers the
    hints used)."""
    return (f"**Stuck on `{exercise}`?** `python -m course hint {lesson_id} {exercise}` (in a terminal, or a cell "
            f"starting with `!`) shows the next of {len(LEVELS)} hints, one per call: {', '.join(LEVELS)}. Once its "
            f"test cell passes, compare with the reference reasoning: `python -m course answer {lesson_id} {section}`.")
