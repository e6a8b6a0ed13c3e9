"""Every lesson is whole: each file its descriptor lists exists and is filled in, each exercise section
is a heading of both lesson texts, it catalogues a mistake, its notebook builds, and the README's
syllabus table is the one the descriptors generate. The last test adds a lesson with
``python -m course new-lesson`` in a copy of the repository and fills its skeleton.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import warm_python
from course.checks import LESSONS
from course.checks.assignments import build_source
from course.layout import GENERATED_FILES, lesson_files
from course.cli import syllabus_table
from course.implementations import REPO_ROOT
from course.scaffold import AUTHOR_TODO

LESSON_LIST = [lesson for _, lesson in sorted(LESSONS.items())]
by_id = pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.lesson_id)


@by_id
def test_every_listed_file_exists_and_is_filled_in(lesson):
    """Every file the descriptor lists but the notebooks ``python -m course release`` generates."""
    files = {role: path for role, path in lesson.files().items() if role not in GENERATED_FILES}
    missing = [role for role, path in files.items() if not path.is_file()]
    assert not missing, f"lesson {lesson.lesson_id} lacks {missing}: {[str(files[r]) for r in missing]}"
    unfilled = [role for role, path in files.items() if AUTHOR_TODO in path.read_text(encoding="utf-8")]
    assert not unfilled, f"lesson {lesson.lesson_id}: {AUTHOR_TODO} left in {unfilled}"


@by_id
def test_every_exercise_section_is_a_heading_of_both_texts(lesson):
    files = lesson.files()
    for role in ("lesson text (en)", "lesson text (zh)"):
        headings = {m.group(1) for m in re.finditer(r"(?m)^#{2,4} (\d+(?:\.\d+)*)[. ]",
                                                    files[role].read_text(encoding="utf-8"))}
        for exercise in lesson.exercises:
            number = exercise.section_number
            assert number in headings, f"{role}: no heading for {exercise.name}'s section §{number}"


@by_id
def test_the_lesson_catalogues_a_mistake_a_hidden_check_catches(lesson):
    assert lesson.mistakes, f"lesson {lesson.lesson_id} catalogues no mistake (MISTAKES in {lesson.files()['mistakes']})"
    if lesson.files()["notebook"].is_file():
        mistake = next((m for m in lesson.mistakes if m.name == lesson.notebook_mistake), None)
        assert mistake is not None, (f"notebook_mistake {lesson.notebook_mistake!r} is not in lesson "
                                     f"{lesson.lesson_id}'s catalogue {[m.name for m in lesson.mistakes]}")
        check = next(c for c in lesson.checks if c.name == mistake.caught_by)
        assert check.hidden, f"{mistake.name} is caught by {check.name}, a visible check: the autograde test needs a hidden one"


@by_id
def test_every_objective_is_graded_and_every_core_exercise_has_a_core_check(lesson):
    """The core tier is the lesson's objectives (the descriptor lists them): a check names the one it grades."""
    assert lesson.objectives, f"lesson {lesson.lesson_id} lists no objectives"
    assert lesson.tier_gaps() == [], f"lesson {lesson.lesson_id}: " + "; ".join(lesson.tier_gaps())


@by_id
def test_the_notebook_source_builds(lesson, tmp_path):
    """One solution cell per exercise and grade cells consistent with the points (no nbgrader needed)."""
    assert build_source(lesson, tmp_path).is_file()


def test_readme_syllabus_is_the_generated_table():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    assert syllabus_table() in readme, (
        "README.md's syllabus table differs from the descriptors: paste the output of `python -m course syllabus`\n"
        f"EXPECTED:\n{syllabus_table()}")


# --- adding a lesson ------------------------------------------------------------------------------

NEW_LESSON = lesson_files("90", "doubling", "doubling")   # python -m course new-lesson 90 doubling
FILLED = {
    "reference": '''"""Lesson 90 reference solutions: Doubling."""
from __future__ import annotations


def first_exercise(x):
    """The reference solution of lesson 90 §1.1."""
    return 2 * x
''',
    "test": '''"""Lesson 90 beyond its checks."""
from course.checks import get_lesson


def test_lesson90_has_one_exercise():
    assert [e.name for e in get_lesson("90").exercises] == ["first_exercise"]
''',
    "mistakes": '''"""Lesson 90's mistake catalogue."""
from __future__ import annotations

from ..catalogue import equivalent, mistake
from .checks import first_exercise_keeps_integers_integers, first_exercise_matches_the_oracle

MISTAKES = [
    mistake("adds_instead", "x + 2 instead of 2 * x", "first_exercise", "return 2 * x", "return x + 2",
            first_exercise_matches_the_oracle),
    mistake("float_factor", "2.0 * x: an int becomes a float", "first_exercise", "return 2 * x", "return 2.0 * x",
            first_exercise_keeps_integers_integers),
]
EQUIVALENTS = [equivalent("sum", "x + x is 2 * x", "first_exercise", "return 2 * x", "return x + x")]
''',
}
CHECK_BODY = '''    """first_exercise doubles its input."""
    for x in (0, 1, -3, 2.5):
        expect_equal(f"first_exercise({x})", impl.first_exercise(x), 2 * x)


@check("first_exercise", objective="first_objective", hidden=True)
def first_exercise_keeps_integers_integers(impl):
    """An int comes back as an int."""
    expect_equal("type(first_exercise(3))", type(impl.first_exercise(3)).__name__, "int")
'''


def in_copy(copy: Path, role: str) -> Path:
    return copy / NEW_LESSON[role].relative_to(REPO_ROOT)


def run_in(copy: Path, *args: str) -> subprocess.CompletedProcess:
    return warm_python.run(list(args), cwd=copy, env=dict(os.environ, PYTHONPATH=str(copy)), timeout=600)


def fill_skeleton(copy: Path) -> None:
    """What an author does after new-lesson: write the solution, a check, the mistakes, the texts, the README row."""
    for role, text in FILLED.items():
        in_copy(copy, role).write_text(text, encoding="utf-8")
    checks = in_copy(copy, "checks")
    source = checks.read_text(encoding="utf-8").replace("import check\n", "import check, expect_equal\n")
    source = source[:source.index('    """TODO(author): what this check proves')] + CHECK_BODY
    checks.write_text(source.replace(AUTHOR_TODO, "Doubling"), encoding="utf-8")
    descriptor = in_copy(copy, "descriptor")
    descriptor.write_text(descriptor.read_text(encoding="utf-8").replace(
        '"TODO(author): a catalogued mistake that only a hidden check catches"', '"float_factor"'), encoding="utf-8")
    for role in ("descriptor", "stub", "notebook", "lesson text (en)", "lesson text (zh)", "answers (en)",
                 "answers (zh)", "notes (en)", "notes (zh)", "hints"):
        path = in_copy(copy, role)
        path.write_text(path.read_text(encoding="utf-8").replace(AUTHOR_TODO, "Return twice x"), encoding="utf-8")
    table = run_in(copy, "-m", "course", "syllabus").stdout.strip()
    readme = copy / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace(syllabus_table(), table), encoding="utf-8")


def test_new_lesson_then_filling_the_skeleton_makes_the_lesson_complete(tmp_path):
    copy = tmp_path / "repo"
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    for relative in tracked.stdout.split():
        if (REPO_ROOT / relative).is_file():
            (copy / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / relative, copy / relative)
    made = run_in(copy, "-m", "course", "new-lesson", "90", "doubling")
    assert made.returncode == 0, made.stdout + made.stderr
    written = len(set(NEW_LESSON) - set(GENERATED_FILES))
    assert made.stdout.count("wrote ") == written, f"ACTUAL {made.stdout.count('wrote ')} files, EXPECTED {written}:\n{made.stdout}"
    again = run_in(copy, "-m", "course", "new-lesson", "90", "doubling")
    assert again.returncode == 2 and "would overwrite" in again.stderr, again.stderr

    tests = ["tests/test_lessons_complete.py", "tests/test_lesson_checks.py", "tests/test_mistakes.py",
             "tests/test_signatures.py", "tests/test_lesson90_doubling.py",
             "--impl", "reference", "-q", "-p", "no:cacheprovider"]
    before = run_in(copy, "-m", "pytest", *tests, "-k", "90 and not new_lesson")
    assert before.returncode == 1, f"the bare skeleton must not pass:\n{before.stdout[-3000:]}"
    for complaint in (AUTHOR_TODO, "catalogues no mistake", "test_lesson90_beyond_the_checks"):
        assert complaint in before.stdout, f"the skeleton's failures should mention {complaint!r}:\n{before.stdout[-3000:]}"

    fill_skeleton(copy)
    # One pytest run: the lesson's tests and the README's syllabus table, which now lists lesson 90.
    syllabus = test_readme_syllabus_is_the_generated_table.__name__
    after = run_in(copy, "-m", "pytest", *tests, "-k", f"(90 or {syllabus}) and not new_lesson", "-rA")
    assert after.returncode == 0, f"the filled lesson should be complete:\n{after.stdout[-3000:]}"
    assert f"PASSED tests/test_lessons_complete.py::{syllabus}" in after.stdout, (
        f"the README's syllabus table was not checked:\n{after.stdout[-3000:]}")
    check = run_in(copy, "-m", "course", "check", "90", "--impl", "reference")
    assert check.returncode == 0 and "1/1 passed" in check.stdout, check.stdout + check.stderr
