"""The nbgrader notebooks: they run, they release cleanly, and autograde scores them like the checks do.

Everything happens in a temporary course directory built from the repo's jupytext sources, so the
repo is never modified. Expected scores come from the points written in the notebook metadata and
from which check a catalogued mistake is known to break, never from a grading run.
"""
from __future__ import annotations

import ast
import csv
import getpass
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.checks import get_lesson
from course.checks.mistakes import MISTAKES
from course.notebooks import NOTEBOOKS, NOTEBOOKS_DIR, build_source, generate_release

pytestmark = pytest.mark.notebooks

ASSIGNMENT_NOTEBOOKS = sorted(NOTEBOOKS.values(), key=lambda n: n.lesson_id)
# In the test course, cells a student added (no nbgrader metadata) get a short limit so the hanging
# submission costs seconds; the notebook's own cells keep a limit no busy machine reaches.
TEST_TIMEOUTS = """
def cell_timeout(cell):
    return 600 if "nbgrader" in cell.metadata else 8


c.Execute.timeout_func = cell_timeout
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def nbgrader(course_dir: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course_dir, capture_output=True,
                          text=True, timeout=900)
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
    for notebook in ASSIGNMENT_NOTEBOOKS:
        build_source(notebook, root)
        generate_release(notebook, root)
    return root


def read(path: Path):
    return nbformat.read(path, as_version=4)


@pytest.mark.parametrize("notebook", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.assignment)
def test_grade_cells_run_every_check_of_the_lesson(notebook, course_dir):
    """Grading identical to the CLI: each exercise's grade cells together run exactly its checks."""
    lesson = get_lesson(notebook.lesson_id)
    source = read(notebook.source_path(course_dir))
    called: dict[str, list[str]] = {}
    for cell in source.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade"):
            assert meta.get("points", 0) > 0, f"grade cell {meta['grade_id']} states no points"
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


@pytest.mark.parametrize("notebook", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.assignment)
def test_committed_release_is_up_to_date(notebook, course_dir):
    committed = notebook.release_path(NOTEBOOKS_DIR)
    assert committed.is_file(), f"{committed} is missing: run `python -m course release`"
    assert committed.read_text(encoding="utf-8") == notebook.release_path(course_dir).read_text(encoding="utf-8"), (
        f"{committed.relative_to(NOTEBOOKS_DIR.parent)} is stale: run `python -m course release` and commit it")


@pytest.mark.parametrize("notebook", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.assignment)
def test_release_holds_no_solution_and_no_hidden_test(notebook, course_dir):
    source = read(notebook.source_path(course_dir))
    source_text = "\n".join(c.source for c in source.cells)
    release = read(notebook.release_path(course_dir))
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


@pytest.mark.parametrize("notebook", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.assignment)
def test_source_executes_top_to_bottom_and_draws_its_figures(notebook, course_dir, tmp_path):
    from nbclient import NotebookClient

    workdir = tmp_path / notebook.assignment
    workdir.mkdir()
    nb = read(notebook.source_path(course_dir))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"cells raised: {[(e.ename, e.evalue) for e in errors]}"
    warnings = [o.text for c in nb.cells for o in c.get("outputs", [])
                if o.output_type == "stream" and "Warning" in o.text]
    assert not warnings, f"cells printed warnings: {warnings}"
    saved = {p.name for p in (workdir / "figures").glob("*.png")}
    expected = {f"{c.metadata['nbgrader']['grade_id'].removeprefix('plot_')}.png" for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("plot_")}
    assert {f"{notebook.lesson_id}_{name}" for name in expected} == saved, f"figures saved: {sorted(saved)}"
    for name in saved:
        data = (workdir / "figures" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, f"{name}: {len(data)} bytes, not a real PNG"
    inline = sum(any("image/png" in o.get("data", {}) for o in c.get("outputs", [])) for c in nb.cells)
    assert inline == len(expected), f"cells showing a figure inline: {inline}, expected {len(expected)}"


@pytest.mark.parametrize("notebook", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.assignment)
def test_validate_passes_the_source_and_inverted_fails_the_release(notebook, course_dir):
    out = nbgrader(course_dir, "validate", str(notebook.source_path(course_dir)))
    assert "Success! Your notebook passes all the tests." in out, out[-3000:]
    out = nbgrader(course_dir, "validate", "--invert", str(notebook.release_path(course_dir)))
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


HANG_CELL = "import time\ntime.sleep(3600)  # a student's endless loop"
RAISE_CELL = "raise RuntimeError('a student cell that crashes')"
# One typical mistake per lesson, each caught by a hidden test only, so exactly one grade cell fails.
TYPICAL_MISTAKES = {"14": "clip_before_unscale", "15": "non_atomic_write", "16": "clip_before_unscale"}
# The hanging and the crashing student cell cost a cell timeout each run: lesson 14 carries them.
BROKEN_CELLS_IN = "14"


@pytest.mark.parametrize("notebook", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.assignment)
def test_autograde_scores_reference_untouched_and_mistaken_submissions(notebook, course_dir, tmp_path):
    """Full marks, zero, and exactly one failing cell for a submission with a typical mistake; in
    lesson 14 that submission also has a cell that hangs and one that raises: grading goes on past
    both (one execution covers both cases)."""
    from nbgrader.api import Gradebook

    typical_mistake = next(m for m in MISTAKES
                           if m.lesson == notebook.lesson_id and m.name == TYPICAL_MISTAKES[notebook.lesson_id])
    broken_cells = [HANG_CELL, RAISE_CELL] if notebook.lesson_id == BROKEN_CELLS_IN else []
    release = read(notebook.release_path(course_dir))
    solved = read(notebook.source_path(course_dir))
    mistaken = read(build_source(notebook, tmp_path, reference_source=typical_mistake.source()))
    students = {
        "reference": submission(release, solved),
        "untouched": release,
        "mistake": submission(release, mistaken, broken_cells),
    }
    for student, nb in students.items():
        path = course_dir / "submitted" / student / notebook.assignment / f"{notebook.assignment}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
    nbgrader(course_dir, "autograde", notebook.assignment)

    points = grade_cells(solved)
    # The mistake breaks one check; the grade cell that runs it is the one that must score 0.
    failing = next(c.metadata["nbgrader"]["grade_id"] for c in solved.cells
                   if c.metadata.get("nbgrader", {}).get("grade")
                   and typical_mistake.caught_by in checks_called(c.source))
    expected = {
        "reference": points,
        "untouched": {cell: 0 for cell in points},
        "mistake": {cell: 0 if cell == failing else p for cell, p in points.items()},
    }
    with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gradebook:
        for student, want in expected.items():
            graded = gradebook.find_submission_notebook(notebook.assignment, notebook.assignment, student)
            got = {g.name: g.score for g in graded.grades}
            assert got == want, f"{student}: scores per grade cell\n  ACTUAL:   {got}\n  EXPECTED: {want}"
    assert failing.startswith("hidden_"), "the typical mistake is meant to be caught by a hidden test"

    # The rest of the instructor's round (README): feedback per student, then grades.csv.
    nbgrader(course_dir, "generate_feedback", notebook.assignment)
    for student in students:
        html = course_dir / "feedback" / student / notebook.assignment / f"{notebook.assignment}.html"
        assert html.is_file() and html.stat().st_size > 0, f"no feedback for {student} at {html}"
    nbgrader(course_dir, "export")
    with open(course_dir / "grades.csv", newline="", encoding="utf-8") as handle:
        exported = {row["student_id"]: float(row["score"]) for row in csv.DictReader(handle)
                    if row["assignment"] == notebook.assignment}
    want = {student: float(sum(cells.values())) for student, cells in expected.items()}
    assert exported == want, f"grades.csv totals\n  ACTUAL:   {exported}\n  EXPECTED: {want}"
    if broken_cells:
        broken = read(course_dir / "autograded" / "mistake" / notebook.assignment / f"{notebook.assignment}.ipynb")
        errors = {c.source: [o.ename for o in c.outputs if o.output_type == "error"]
                  for c in broken.cells if c.cell_type == "code"}
        assert "CellTimeoutError" in errors[HANG_CELL] and errors[RAISE_CELL] == ["RuntimeError"], (
            f"the broken cells should fail on their own: {errors[HANG_CELL]}, {errors[RAISE_CELL]}")


def test_exchange_round_trip_release_fetch_submit_collect(course_dir, tmp_path):
    """The README's hand-out and hand-in commands through a local nbgrader exchange directory:
    release_assignment -> (student) fetch_assignment, submit -> collect lands in submitted/."""
    notebook = ASSIGNMENT_NOTEBOOKS[0]
    exchange = f"--Exchange.root={tmp_path / 'exchange'}"
    (tmp_path / "exchange").mkdir()
    nbgrader(course_dir, "release_assignment", notebook.assignment, exchange)
    student_home = tmp_path / "student"
    student_home.mkdir()
    fetch = subprocess.run([sys.executable, "-m", "nbgrader", "fetch_assignment", notebook.assignment,
                            "--course=minimind-course", exchange], cwd=student_home, capture_output=True,
                           text=True, timeout=300)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    fetched = student_home / notebook.assignment / f"{notebook.assignment}.ipynb"
    assert fetched.is_file(), f"fetch_assignment did not write {fetched}"
    submit = subprocess.run([sys.executable, "-m", "nbgrader", "submit", notebook.assignment,
                             "--course=minimind-course", exchange], cwd=student_home, capture_output=True,
                            text=True, timeout=300)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    nbgrader(course_dir, "collect", notebook.assignment, exchange)
    # The exchange names the submitter after the OS user; the autograde test's students are others.
    collected = course_dir / "submitted" / getpass.getuser() / notebook.assignment / f"{notebook.assignment}.ipynb"
    assert collected.is_file(), f"collect did not write {collected}"
