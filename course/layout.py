"""Where every file of a lesson lives: the one place a lesson's layout is spelled. The grader's ``Lesson.files()``,
the scaffold (``python -m course new-lesson``, before the lesson exists), the notebooks and the syllabus read it."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from course.implementations import REFERENCE_DIR, REPO_ROOT, STUDENT_DIR

NOTEBOOKS_DIR = REPO_ROOT / "notebooks"   # the nbgrader course directory
# A student's notebooks (``python -m course workspace``): git-ignored, and no command regenerates a file there.
WORKSPACE_DIR = NOTEBOOKS_DIR / "workspace"
GRADER_DIR = REPO_ROOT / "course" / "checks"   # one package per lesson: lessonNN/
LESSON_TEXTS = REPO_ROOT / "course" / "lessons"   # the lesson texts; answers/ and notes/ beside them, zh/ their twins
# Besides the lesson itself (the why, each exercise as a question): its answers (``python -m course answer``, read
# after an attempt) and its notes (engineering detail), each in its own folder.
TEXT_KINDS = ("answers", "notes")

# Roles of ``lesson_files`` that ``python -m course release`` generates: nobody writes them by hand.
GENERATED_FILES = ("notebook source", "notebook release")


def lesson_files(lesson_id: str, slug: str, module: str, labs: Sequence[str] = ()) -> dict[str, Path]:
    """Every file of a lesson, by role, as absolute paths: the one place a lesson's layout is spelled (the
    scaffold writes these before the lesson exists, the notebooks and the syllabus read them)."""
    name = f"{lesson_id}_{slug}"
    package = GRADER_DIR / f"lesson{lesson_id}"
    return {
        "lesson text (en)": REPO_ROOT / "course" / "lessons" / f"{name}.md",
        "lesson text (zh)": REPO_ROOT / "course" / "lessons" / "zh" / f"{name}.md",
        **{f"{kind} ({language})": LESSON_TEXTS / where / kind / f"{name}.md"
           for kind in TEXT_KINDS for language, where in (("en", "."), ("zh", "zh"))},
        "stub": STUDENT_DIR / f"{module}.py",
        "reference": REFERENCE_DIR / f"{module}.py",
        "descriptor": package / "__init__.py",
        "checks": package / "checks.py",
        "mistakes": package / "mistakes.py",
        "equivalent mutants": package / "equivalent_mutants.py",
        "hints": package / "hints.py",
        "test": REPO_ROOT / "tests" / f"test_lesson{lesson_id}_{module}.py",
        "notebook": NOTEBOOKS_DIR / "lessons" / f"{name}.py",
        "notebook source": NOTEBOOKS_DIR / "source" / name / f"{name}.ipynb",
        "notebook release": NOTEBOOKS_DIR / "release" / name / f"{name}.ipynb",
        **{f"lab {lab}": REPO_ROOT / "labs" / lab for lab in labs},
    }


def lesson_ids() -> list[str]:
    """The lessons that have a grader package (``course/checks/lessonNN/``), in order, without importing them."""
    return sorted(path.name[len("lesson"):] for path in GRADER_DIR.glob("lesson[0-9]*")
                  if (path / "__init__.py").is_file())
