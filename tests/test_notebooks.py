"""The nbgrader notebooks: they run, they release cleanly, and autograde scores them like the checks do.

Everything happens in a temporary course directory built from the repo's jupytext sources, so the
repo is never modified. Expected scores come from the points written in the notebook metadata and
from which check a catalogued mistake is known to break, never from a grading run.
"""
from __future__ import annotations

import ast
import csv
import getpass
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.checks.assignments import (NOTEBOOKS_DIR, build_source, generate_release, nbgrader as run_nbgrader,
                                       notebook_lessons, release_path, source_path)
from course.checks.framework import expect_equal

pytestmark = pytest.mark.notebooks

ASSIGNMENT_NOTEBOOKS = notebook_lessons()
# In the test course, cells a student added (no nbgrader metadata) get a short limit so the hanging
# submission costs seconds; the notebook's own cells keep a limit no busy machine reaches.
TEST_TIMEOUTS = """
def cell_timeout(cell):
    return 600 if "nbgrader" in cell.metadata else 8


c.Execute.timeout_func = cell_timeout
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def nbgrader(course_dir: Path, *args: str) -> str:
    proc = run_nbgrader(course_dir, *args, timeout=900)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} exited {proc.returncode}:\n{output[-3000:]}"
    return output


def grade_cells(nb) -> dict[str, int]:
    """grade_id -> points of every grade cell."""
    return {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}


def checks_called(cell_source: str) -> list[str]:
    """Check names passed to run_checks(globals(), lesson, *names) in a grade cell."""
    return [arg.value for node in ast.walk(ast.parse(cell_source)) if isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "run_checks" for arg in node.args[2:]]


@pytest.fixture(scope="module")
def course_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("course")
    config = (NOTEBOOKS_DIR / "nbgrader_config.py").read_text(encoding="utf-8")
    (root / "nbgrader_config.py").write_text(config + TEST_TIMEOUTS, encoding="utf-8")
    for lesson in ASSIGNMENT_NOTEBOOKS:
        build_source(lesson, root)
        generate_release(lesson, root)
    return root


def read(path: Path):
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_grade_cells_run_every_check_of_the_lesson(lesson, course_dir):
    """Grading identical to the CLI: each exercise's grade cells together run exactly its checks."""
    source = read(source_path(lesson, course_dir))
    called: dict[str, list[str]] = {}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        optional = meta.get("grade_id", "").startswith("check_")   # an extension's check cell: no points
        if optional:
            assert meta.get("locked") and not meta.get("grade") and "points" not in meta, meta
        if meta.get("grade") or optional:
            assert optional or meta.get("points", 0) > 0, f"grade cell {meta['grade_id']} states no points"
            names = checks_called(cell.source)
            exercises = {c.exercise for c in lesson.checks if c.name in names}
            assert len(exercises) == 1, f"grade cell {meta['grade_id']} mixes exercises {sorted(exercises)}"
            called.setdefault(exercises.pop(), []).extend(names)
    for exercise in lesson.exercises:
        expected = sorted(c.name for c in lesson.checks if c.exercise == exercise.name)
        assert sorted(set(called.get(exercise.name, []))) == expected, (
            f"{exercise.name}: checks run by grade cells\n  ACTUAL:   {sorted(set(called.get(exercise.name, [])))}"
            f"\n  EXPECTED: {expected}")
    solution_ids = [c.metadata["nbgrader"]["grade_id"] for c in source.cells
                    if c.metadata.get("nbgrader", {}).get("solution")]
    assert solution_ids == [e.name for e in lesson.exercises], "one solution cell per exercise, in order"
    expected_points = {f"test_{e.name}": e.points for e in lesson.core_exercises}
    expected_points.update({f"hidden_{e.name}": e.hidden_points for e in lesson.core_exercises if e.hidden_points})
    expect_equal("points per grade cell (from the descriptor's exercises)", grade_cells(source), expected_points)
    expect_equal("the notebook's total points", sum(grade_cells(source).values()), lesson.points)


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_committed_release_is_up_to_date(lesson, course_dir):
    committed = release_path(lesson, NOTEBOOKS_DIR)
    assert committed.is_file(), f"{committed} is missing: run `python -m course release`"
    assert committed.read_text(encoding="utf-8") == release_path(lesson, course_dir).read_text(encoding="utf-8"), (
        f"{committed.relative_to(NOTEBOOKS_DIR.parent)} is stale: run `python -m course release` and commit it")


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_release_holds_no_solution_and_no_hidden_test(lesson, course_dir):
    source = read(source_path(lesson, course_dir))
    source_text = "\n".join(c.source for c in source.cells)
    release = read(release_path(lesson, course_dir))
    release_text = "\n".join(c.source for c in release.cells)
    # Every non-trivial line between the solution markers of the source is gone from the release.
    solution_lines = {line.strip() for c in source.cells for part in c.source.split("### BEGIN SOLUTION")[1:]
                      for line in part.split("### END SOLUTION")[0].splitlines() if len(line.strip()) > 25}
    assert len(solution_lines) > 20, f"expected the reference solutions in the source, found {len(solution_lines)} lines"
    leaked = sorted(line for line in solution_lines if line in release_text)
    assert not leaked, f"solution lines left in the release: {leaked[:5]}"
    for marker in ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"):
        assert marker in source_text and marker not in release_text, marker
    hidden = {name for c in source.cells
              for part in c.source.split("### BEGIN HIDDEN TESTS")[1:] for name in checks_called(part.split("### END")[0])}
    assert hidden and not any(name in release_text for name in hidden), f"hidden checks visible: {hidden}"
    for cell in release.cells:
        if cell.metadata.get("nbgrader", {}).get("solution"):
            assert "raise NotImplementedError()" in cell.source, cell.source


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_source_executes_top_to_bottom_and_draws_its_figures(lesson, course_dir, tmp_path):
    from nbclient import NotebookClient

    workdir = tmp_path / lesson.name
    workdir.mkdir()
    nb = read(source_path(lesson, course_dir))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"cells raised: {[(e.ename, e.evalue) for e in errors]}"
    warnings = [o.text for c in nb.cells for o in c.get("outputs", [])
                if o.output_type == "stream" and "Warning" in o.text]
    assert not warnings, f"cells printed warnings: {warnings}"
    saved = {p.name for p in (workdir / "figures").glob("*.png")}
    expected = {f"{c.metadata['nbgrader']['grade_id'].removeprefix('plot_')}.png" for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("plot_")}
    assert {f"{lesson.lesson_id}_{name}" for name in expected} == saved, f"figures saved: {sorted(saved)}"
    for name in saved:
        data = (workdir / "figures" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, f"{name}: {len(data)} bytes, not a real PNG"
    inline = sum(any("image/png" in o.get("data", {}) for o in c.get("outputs", [])) for c in nb.cells)
    assert inline == len(expected), f"cells showing a figure inline: {inline}, expected {len(expected)}"


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_validate_passes_the_source_and_inverted_fails_the_release(lesson, course_dir):
    out = nbgrader(course_dir, "validate", str(source_path(lesson, course_dir)))
    assert "Success! Your notebook passes all the tests." in out, out[-3000:]
    out = nbgrader(course_dir, "validate", "--invert", str(release_path(lesson, course_dir)))
    assert "Success! The notebook does not pass any tests." in out, out[-3000:]


# --- autograde ---------------------------------------------------------------------------------

def submission(release, solved, extra_cells=()):
    """The release with every solution cell answered as in ``solved`` and ``extra_cells`` added
    after the setup cell (students may add cells)."""
    answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in solved.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    nb = nbformat.from_dict(release)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = answers[grade_id]
    setup = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    nb.cells[setup + 1:setup + 1] = [nbformat.v4.new_code_cell(src) for src in extra_cells]
    return nb


# A test-writing exercise answered with a test that asserts nothing: its grade cell must score 0.
NO_OP_TEST = "test_asserts_nothing"


def grade_cell_running(solved, check_name: str) -> str:
    """grade_id of the grade cell of ``solved`` that runs the check ``check_name``."""
    return next(c.metadata["nbgrader"]["grade_id"] for c in solved.cells
                if c.metadata.get("nbgrader", {}).get("grade") and check_name in checks_called(c.source))


HANG_CELL = "import time\ntime.sleep(3600)  # a student's endless loop"
RAISE_CELL = "raise RuntimeError('a student cell that crashes')"
# The hanging and the crashing student cell cost a cell timeout each run: lesson 14 carries them.
BROKEN_CELLS_IN = "14"


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_autograde_scores_reference_untouched_and_mistaken_submissions(lesson, course_dir, tmp_path):
    """Full marks, zero, and exactly one failing cell for a submission with a typical mistake; in
    lesson 14 that submission also has a cell that hangs and one that raises: grading goes on past
    both (one execution covers both cases). Where the lesson has a test-writing exercise, a submission
    whose test asserts nothing scores 0 on that exercise's cell only."""
    from nbgrader.api import Gradebook

    # The lesson's notebook_mistake is caught by a hidden check only, so exactly one grade cell fails.
    typical_mistake = next(m for m in lesson.mistakes if m.name == lesson.notebook_mistake)
    broken_cells = [HANG_CELL, RAISE_CELL] if lesson.lesson_id == BROKEN_CELLS_IN else []
    release = read(release_path(lesson, course_dir))
    solved = read(source_path(lesson, course_dir))
    mistaken = read(build_source(lesson, tmp_path, reference_source=typical_mistake.source()))
    students = {
        "reference": submission(release, solved),
        "untouched": release,
        "mistake": submission(release, mistaken, broken_cells),
    }
    if lesson.optional_exercises:
        # Core exercises solved, extensions left as released: their check cells fail, the score stays full.
        core_only = submission(release, solved)
        optional = {e.name for e in lesson.optional_exercises}
        released = {c.metadata["nbgrader"]["grade_id"]: c.source for c in release.cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") in optional}
        for cell in core_only.cells:
            if cell.metadata.get("nbgrader", {}).get("grade_id") in optional:
                cell.source = released[cell.metadata["nbgrader"]["grade_id"]]
        students["core_only"] = core_only
    no_op_test = next((m for m in lesson.mistakes if m.name == NO_OP_TEST), None)
    if no_op_test is not None:
        no_op = read(build_source(lesson, tmp_path / NO_OP_TEST, reference_source=no_op_test.source()))
        students["no_op_test"] = submission(release, no_op)
    for student, nb in students.items():
        path = course_dir / "submitted" / student / lesson.name / f"{lesson.name}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    nbgrader(course_dir, "autograde", lesson.name)

    points = grade_cells(solved)
    # The mistake breaks one check; the grade cell that runs it is the one that must score 0.
    failing = grade_cell_running(solved, typical_mistake.caught_by)
    expected = {
        "reference": points,
        "untouched": {cell: 0 for cell in points},
        "mistake": {cell: 0 if cell == failing else p for cell, p in points.items()},
    }
    if "core_only" in students:
        expected["core_only"] = points
    if no_op_test is not None:
        accepted_no_op = grade_cell_running(solved, no_op_test.caught_by)
        expected["no_op_test"] = {cell: 0 if cell == accepted_no_op else p for cell, p in points.items()}
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gradebook:
        for student, want in expected.items():
            graded = gradebook.find_submission_notebook(lesson.name, lesson.name, student)
            got = {g.name: g.score for g in graded.grades}
            assert got == want, f"{student}: scores per grade cell\n  ACTUAL:   {got}\n  EXPECTED: {want}"
    assert failing.startswith("hidden_"), "the typical mistake is meant to be caught by a hidden test"

    # The rest of the instructor's round (README): feedback per student, then grades.csv.
    nbgrader(course_dir, "generate_feedback", lesson.name)
    for student in students:
        html = course_dir / "feedback" / student / lesson.name / f"{lesson.name}.html"
        assert html.is_file() and html.stat().st_size > 0, f"no feedback for {student} at {html}"
    nbgrader(course_dir, "export")
    with open(course_dir / "grades.csv", newline="", encoding="utf-8") as handle:
        # export lists every student of the gradebook; other lessons' tests add some that have no submission here
        exported = {row["student_id"]: float(row["score"]) for row in csv.DictReader(handle)
                    if row["assignment"] == lesson.name and row["student_id"] in students}
    want = {student: float(sum(cells.values())) for student, cells in expected.items()}
    assert exported == want, f"grades.csv totals\n  ACTUAL:   {exported}\n  EXPECTED: {want}"
    if "core_only" in students:
        graded_nb = read(course_dir / "autograded" / "core_only" / lesson.name / f"{lesson.name}.ipynb")
        failed = {c.metadata["nbgrader"]["grade_id"] for c in graded_nb.cells
                  if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("check_")
                  and any(o.output_type == "error" for o in c.get("outputs", []))}
        assert failed == {f"check_{e.name}" for e in lesson.optional_exercises}, (
            f"unsolved extensions' check cells should fail (and score nothing): {sorted(failed)}")
    if broken_cells:
        broken = read(course_dir / "autograded" / "mistake" / lesson.name / f"{lesson.name}.ipynb")
        errors = {c.source: [o.ename for o in c.outputs if o.output_type == "error"]
                  for c in broken.cells if c.cell_type == "code"}
        assert "CellTimeoutError" in errors[HANG_CELL] and errors[RAISE_CELL] == ["RuntimeError"], (
            f"the broken cells should fail on their own: {errors[HANG_CELL]}, {errors[RAISE_CELL]}")


def test_exchange_round_trip_release_fetch_submit_collect(course_dir, tmp_path):
    """The README's hand-out and hand-in commands through a local nbgrader exchange directory:
    release_assignment -> (student) fetch_assignment, submit -> collect lands in submitted/."""
    lesson = ASSIGNMENT_NOTEBOOKS[0]
    exchange = f"--Exchange.root={tmp_path / 'exchange'}"
    (tmp_path / "exchange").mkdir()
    nbgrader(course_dir, "release_assignment", lesson.name, exchange)
    student_home = tmp_path / "student"
    student_home.mkdir()
    fetch = run_nbgrader(student_home, "fetch_assignment", lesson.name, "--course=minimind-course", exchange,
                         timeout=300)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    fetched = student_home / lesson.name / f"{lesson.name}.ipynb"
    assert fetched.is_file(), f"fetch_assignment did not write {fetched}"
    submit = run_nbgrader(student_home, "submit", lesson.name, "--course=minimind-course", exchange, timeout=300)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    nbgrader(course_dir, "collect", lesson.name, exchange)
    # The exchange names the submitter after the OS user; the autograde test's students are others.
    collected = course_dir / "submitted" / getpass.getuser() / lesson.name / f"{lesson.name}.ipynb"
    assert collected.is_file(), f"collect did not write {collected}"


def test_release_works_with_an_unactivated_venv_python(tmp_path):
    """The venv's python called by path (IDEs, cron, CI images): its bin directory is not on PATH, yet
    nbgrader shells out to helpers there (alembic). ``python -m course release`` must still work."""
    course_dir = tmp_path / "course"
    course_dir.mkdir()
    shutil.copy(NOTEBOOKS_DIR / "nbgrader_config.py", course_dir)
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and not shutil.which("alembic", path=d))
    assert not shutil.which("alembic", path=path), "the test PATH should hide nbgrader's helper programs"
    proc = subprocess.run([sys.executable, "-m", "course", "release", "16", "--course-dir", str(course_dir)],
                          cwd=NOTEBOOKS_DIR.parent, env=dict(os.environ, PATH=path), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"ACTUAL exit {proc.returncode}, EXPECTED 0\n{(proc.stdout + proc.stderr)[-3000:]}"
    assert release_path(ASSIGNMENT_NOTEBOOKS[-1], course_dir).is_file(), proc.stdout
