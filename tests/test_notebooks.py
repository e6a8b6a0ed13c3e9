"""The nbgrader notebooks: they release cleanly, and autograde scores them like the checks do.

Everything happens in a temporary course directory built from the repo's jupytext sources, so the
repo is never modified. Expected scores come from the points written in the notebook metadata and
from which check a catalogued mistake is known to break, never from a grading run.

Executing a notebook is the expensive part, so the instructor's grading round runs once for every
lesson (``grading_round``): one ``nbgrader autograde`` of all submissions, one ``generate_feedback``,
one ``export``. The tests read what they assert from that round: the reference submission runs top to
bottom, draws its figures and scores full points (what ``nbgrader validate`` of the source showed);
in lesson 14 the untouched release scores 0 in every grade cell (what ``validate --invert`` showed) and a
flawed submission loses exactly the cells of its flaws (every lesson's stubs and flawed module are graded by
the checks, without a notebook). One real ``nbgrader validate`` remains, the student's command
of the README.
"""
from __future__ import annotations

import csv
import getpass
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

import warm_kernel
import warm_python
from doc_runs import run_documented
from stub_copies import untouched_impl

from course.checks.assignments import (NOTEBOOKS_DIR, build_source, checks_called, generate_release, holds_work,
                                       nbgrader_invocation, notebook_lessons, release_path, scored_cells, source_path)
from course.checks.framework import PASS, expect_equal
from course.checks.hints import notebook_cell
from course.checks.results import grade_exercises
from course.classroom.simulate import answered
from course.implementations import REPO_ROOT, module_from_source

pytestmark = pytest.mark.notebooks

ASSIGNMENT_NOTEBOOKS = notebook_lessons()
# In the test course, cells a student added (no nbgrader metadata) get a short limit so the hanging
# submission costs seconds; the notebook's own cells keep a limit no busy machine reaches.
TEST_TIMEOUTS = """
def cell_timeout(cell):
    return 600 if "nbgrader" in cell.metadata else 3


c.Execute.timeout_func = cell_timeout
"""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EVERY_ASSIGNMENT = "*"   # nbgrader globs the assignment id: one command grades every lesson
RELEASE_COMMAND = "python -m course release"   # the README's


def run_nbgrader(course_dir: Path, *args: str, timeout: float, kernels: Optional[dict] = None):
    """``nbgrader ARGS`` as the course runs it, in a fork of a Python that has imported nbgrader
    (tests/warm_python.py): the same command, 2.5 s less each; ``kernels``: the environment of
    tests/warm_kernel.py's kernels."""
    python_args, env = nbgrader_invocation(*args)
    return warm_python.run(python_args, cwd=course_dir, env={**env, **(kernels or {})}, timeout=timeout,
                           preload=("nbgrader.apps",))


def nbgrader(course_dir: Path, *args: str, kernels: Optional[dict] = None) -> str:
    proc = run_nbgrader(course_dir, *args, timeout=1800, kernels=kernels)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nbgrader {' '.join(args)} exited {proc.returncode}:\n{output[-3000:]}"
    return output


def grade_cells(nb) -> dict[str, int]:
    """grade_id -> points of every grade cell."""
    return {c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]["points"]
            for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")}


# The committed releases as this checkout holds them, read before any test runs: the README's
# `python -m course release` (run once, below) rewrites them in place.
COMMITTED_RELEASES = {lesson.name: release_path(lesson, NOTEBOOKS_DIR).read_text(encoding="utf-8")
                      for lesson in ASSIGNMENT_NOTEBOOKS if release_path(lesson, NOTEBOOKS_DIR).is_file()}


@dataclass(frozen=True)
class Release:
    """The test course directory and how ``python -m course release`` built it."""
    course_dir: Path
    returncode: int
    output: str
    gradebook_untouched: bool   # notebooks/gradebook.db as before the rebuild of every notebook (or still absent)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Release:
    """Every lesson's source and release, built by the README's ``python -m course release`` (tests/doc_runs.py
    runs it once, by the venv's python called by path with nbgrader's helper programs off PATH, and its docs
    test reads the same run), copied into a test course directory with short limits for added cells."""
    root = tmp_path_factory.mktemp("course")
    gradebook = _gradebook_bytes(NOTEBOOKS_DIR)
    proc = run_documented(RELEASE_COMMAND)
    config = (NOTEBOOKS_DIR / "nbgrader_config.py").read_text(encoding="utf-8")
    (root / "nbgrader_config.py").write_text(config + TEST_TIMEOUTS, encoding="utf-8")
    for folder in ("source", "release"):
        if (NOTEBOOKS_DIR / folder).is_dir():
            shutil.copytree(NOTEBOOKS_DIR / folder, root / folder)
    unchanged = _gradebook_bytes(NOTEBOOKS_DIR) == gradebook   # the rebuild of every notebook gives no lesson
    if proc.returncode == 0:   # the test course gives every lesson: its gradebook registers them all
        generate_release(EVERY_ASSIGNMENT, root)
    return Release(root, proc.returncode, proc.stdout + proc.stderr, unchanged)


def _gradebook_bytes(course_dir: Path) -> Optional[bytes]:
    """A course's gradebook as it stands (None: it has none)."""
    path = course_dir / "gradebook.db"
    return path.read_bytes() if path.is_file() else None


@pytest.fixture(scope="module")
def course_dir(release) -> Path:
    assert release.returncode == 0, f"python -m course release exited {release.returncode}:\n{release.output[-3000:]}"
    return release.course_dir


def read(path: Path):
    # nbformat is imported where it is used: importing it costs ~2 s (jsonschema's format checkers build a parser),
    # which the pytest-xdist worker that runs no notebook test would pay collecting this module
    import nbformat
    return nbformat.read(path, as_version=4)


def test_release_works_with_an_unactivated_venv_python(release):
    """``python -m course release`` with nbgrader's helper programs off PATH built every lesson, and registered
    none in the gradebook: no lesson was given (``nbgrader export`` would list a 0 for each)."""
    assert release.returncode == 0, f"ACTUAL exit {release.returncode}, EXPECTED 0\n{release.output[-3000:]}"
    for lesson in ASSIGNMENT_NOTEBOOKS:
        assert release_path(lesson, release.course_dir).is_file(), release.output
    assert release.gradebook_untouched, ("ACTUAL the rebuild wrote notebooks/gradebook.db, EXPECTED it untouched "
                                         "(likely cause: generate_assignment without --no-db)")


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
    assert lesson.name in COMMITTED_RELEASES, f"{committed} is missing: run `python -m course release`"
    if holds_work(committed):   # a student did the exercises in the release itself: their work, not a stale file
        pytest.skip(f"{committed.relative_to(NOTEBOOKS_DIR.parent)} holds your work: `python -m course workspace "
                    f"{lesson.lesson_id}` copies it to notebooks/workspace/, where no command regenerates files")
    assert COMMITTED_RELEASES[lesson.name] == release_path(lesson, course_dir).read_text(encoding="utf-8"), (
        f"{committed.relative_to(NOTEBOOKS_DIR.parent)} differs from what the notebook source, the stubs and the "
        f"reference generate (instructors: `python -m course release {lesson.lesson_id}`, then commit it)")


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_release_holds_no_solution_and_no_hidden_test(lesson, course_dir):
    source = read(source_path(lesson, course_dir))
    source_text = "\n".join(c.source for c in source.cells)
    release = read(release_path(lesson, course_dir))
    # Each exercise's hint cell names the hint and answer commands (neither stands in the notebook), and the
    # release holds no solution line.
    hint_cells = {c.id: c.source for c in release.cells if c.id.startswith("hints-")}
    assert hint_cells == {f"hints-{name}": notebook_cell(lesson.lesson_id, name, lesson.exercise(name).section_number)
                          for name in lesson.hints}, f"hint cells differ from the lesson's: {sorted(hint_cells)}"
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


# --- the grading round -------------------------------------------------------------------------

def unsolved_extensions(nb, release, lesson):
    """``nb`` with every optional exercise's cell put back as released."""
    optional = {e.name for e in lesson.optional_exercises}
    released = {c.metadata["nbgrader"]["grade_id"]: c.source for c in release.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") in optional}
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") in optional:
            cell.source = released[cell.metadata["nbgrader"]["grade_id"]]
    return nb


# A test-writing exercise answered with a test that asserts nothing: its grade cell must score 0.
NO_OP_TEST = "test_asserts_nothing"


def grade_cell_running(lesson, check_name: str) -> str:
    """grade_id of the scored grade cell of ``lesson``'s notebook that runs the check ``check_name`` (the source
    notebook's cells are these: test_grade_cells_run_every_check_of_the_lesson)."""
    return next(grade_id for grade_id, _, names in scored_cells(lesson) if check_name in names)


HANG_CELL = "import time\ntime.sleep(3600)  # a student's endless loop"
RAISE_CELL = "raise RuntimeError('a student cell that crashes')"
# The flawed submission carries every partial answer (executing a notebook is what the round costs): the lesson's
# typical mistake, caught by one hidden cell; where the lesson has a test-writing exercise, that test answered with
# one that asserts nothing, whose cell must score 0; the extensions left as released, which score nothing either
# way; a cell that hangs and one that raises. Each loses points in its own cell. The round executes it for lesson
# 14, whose flaws are of every kind; which cells each lesson's flaws break is graded without a notebook
# (test_a_flawed_module_loses_exactly_the_cells_its_flaws_break).
FLAWED = "flawed"
UNTOUCHED = "untouched"
FLAWED_IN = "14"   # the lesson whose round also executes the flawed and the untouched notebooks


def flaws(lesson):
    """(the lesson's typical mistake, its test that asserts nothing or None)."""
    return (next(m for m in lesson.mistakes if m.name == lesson.notebook_mistake),
            next((m for m in lesson.mistakes if m.name == NO_OP_TEST), None))


def flawed_source(typical_mistake, no_op_test) -> str:
    """The reference module with the lesson's flaws."""
    source = typical_mistake.source()
    return no_op_test.source(source) if no_op_test is not None else source


@dataclass(frozen=True)
class GradingRound:
    course_dir: Path
    expected: dict          # lesson name -> student -> grade cell -> points the round must give
    failing: dict           # lesson name -> the grade cell the typical mistake fails
    autograde_log: str      # what nbgrader autograde printed


def submissions(lesson, course_dir: Path, scratch: Path) -> tuple[dict, dict, str]:
    """(student -> notebook, student -> expected points per grade cell, the mistake's failing cell)."""
    typical_mistake, no_op_test = flaws(lesson)
    release = read(release_path(lesson, course_dir))
    solved = read(source_path(lesson, course_dir))
    points = grade_cells(solved)
    # The lesson's notebook_mistake is caught by a hidden check only, so exactly one grade cell fails.
    failing = grade_cell_running(lesson, typical_mistake.caught_by)
    students = {"reference": answered(release, solved)}
    expected = {"reference": points}
    if lesson.lesson_id == FLAWED_IN:
        students[UNTOUCHED] = release
        expected[UNTOUCHED] = {cell: 0 for cell in points}
        flawed = read(build_source(lesson, scratch / FLAWED,
                                   reference_source=flawed_source(typical_mistake, no_op_test)))
        no_op_cell = grade_cell_running(lesson, no_op_test.caught_by)
        students[FLAWED] = unsolved_extensions(answered(release, flawed, [HANG_CELL, RAISE_CELL]), release, lesson)
        expected[FLAWED] = {cell: 0 if cell in (failing, no_op_cell) else p for cell, p in points.items()}
    return students, expected, failing


@pytest.fixture(scope="module")
def grading_round(course_dir, tmp_path_factory) -> GradingRound:
    """The README's round on simulated submissions of every lesson: autograde, feedback, export."""
    import nbformat
    expected, failing = {}, {}
    for lesson in ASSIGNMENT_NOTEBOOKS:
        students, expected[lesson.name], failing[lesson.name] = submissions(
            lesson, course_dir, tmp_path_factory.mktemp(lesson.name))
        for student, nb in students.items():
            path = course_dir / "submitted" / student / lesson.name / f"{lesson.name}.ipynb"
            path.parent.mkdir(parents=True)
            nbformat.write(nb, path)
    with warm_kernel.kernel_environment(tmp_path_factory.mktemp("kernels")) as kernels:
        log = nbgrader(course_dir, "autograde", EVERY_ASSIGNMENT, kernels=kernels)
    nbgrader(course_dir, "generate_feedback", EVERY_ASSIGNMENT)
    nbgrader(course_dir, "export")
    return GradingRound(course_dir, expected, failing, log)


def autograded(grading: GradingRound, student: str, lesson) -> Path:
    return grading.course_dir / "autograded" / student / lesson.name / f"{lesson.name}.ipynb"


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_reference_submission_executes_top_to_bottom_and_draws_its_figures(lesson, grading_round):
    """Graded, the reference solutions raise nothing, warn nothing and draw every figure of the notebook."""
    path = autograded(grading_round, "reference", lesson)
    nb = read(path)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors, f"cells raised: {[(e.ename, e.evalue) for e in errors]}"
    warnings = [o.text for c in nb.cells for o in c.get("outputs", [])
                if o.output_type == "stream" and "Warning" in o.text]
    assert not warnings, f"cells printed warnings: {warnings}"
    saved = {p.name for p in (path.parent / "figures").glob("*.png")}
    expected = {f"{c.metadata['nbgrader']['grade_id'].removeprefix('plot_')}.png" for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("plot_")}
    assert {f"{lesson.lesson_id}_{name}" for name in expected} == saved, f"figures saved: {sorted(saved)}"
    for name in saved:
        data = (path.parent / "figures" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, f"{name}: {len(data)} bytes, not a real PNG"
    inline = sum(any("image/png" in o.get("data", {}) for o in c.get("outputs", [])) for c in nb.cells)
    assert inline == len(expected), f"cells showing a figure inline: {inline}, expected {len(expected)}"


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_autograde_scores_reference_untouched_and_mistaken_submissions(lesson, grading_round):
    """Full marks for the reference and, in lesson 14, zero in every grade cell for the untouched release and for
    the flawed submission exactly the cells its flaws break: the typical mistake's (hidden) cell and that of a
    test that asserts nothing. Each student gets feedback, and grades.csv holds every total."""
    from nbgrader.api import Gradebook

    expected = grading_round.expected[lesson.name]
    with Gradebook(f"sqlite:///{grading_round.course_dir / 'gradebook.db'}") as gradebook:
        for student, want in expected.items():
            graded = gradebook.find_submission_notebook(lesson.name, lesson.name, student)
            got = {g.name: g.score for g in graded.grades}
            assert got == want, f"{student}: scores per grade cell\n  ACTUAL:   {got}\n  EXPECTED: {want}"
    assert grading_round.failing[lesson.name].startswith("hidden_"), (
        "the typical mistake is meant to be caught by a hidden test")

    for student in expected:
        html = grading_round.course_dir / "feedback" / student / lesson.name / f"{lesson.name}.html"
        assert html.is_file() and html.stat().st_size > 0, f"no feedback for {student} at {html}"
    with open(grading_round.course_dir / "grades.csv", newline="", encoding="utf-8") as handle:
        # export lists every student of the gradebook, also those with no submission of this lesson
        exported = {row["student_id"]: float(row["score"]) for row in csv.DictReader(handle)
                    if row["assignment"] == lesson.name and row["student_id"] in expected}
    want = {student: float(sum(cells.values())) for student, cells in expected.items()}
    assert exported == want, f"grades.csv totals\n  ACTUAL:   {exported}\n  EXPECTED: {want}"


def test_autograde_warns_of_a_changed_checksum_for_the_hidden_cells_only(grading_round):
    """The README's explanation of autograde's "Attribute 'checksum' for cell ... has changed!": it names exactly
    the hidden grade cells (released without their hidden tests), of every lesson, and no other cell."""
    import re
    named = set(re.findall(r"Attribute 'checksum' for cell (\S+) has changed!", grading_round.autograde_log))
    hidden = {grade_id for lesson in ASSIGNMENT_NOTEBOOKS for grade_id in grade_cells(read(source_path(
        lesson, grading_round.course_dir))) if grade_id.startswith("hidden_")}
    assert named == hidden, (f"cells autograde warned of\n  ACTUAL:   {sorted(named)}\n  EXPECTED: {sorted(hidden)} "
                             "(the hidden grade cells)")


def test_autograde_goes_on_past_unsolved_extensions_a_hang_and_a_crash(grading_round):
    """Lesson 14's flawed submission: its extensions, left as released, fail their check cells (and score
    nothing); its cell that hangs times out and its cell that raises fails, each on its own."""
    lesson = next(lesson for lesson in ASSIGNMENT_NOTEBOOKS if lesson.lesson_id == FLAWED_IN)
    graded_nb = read(autograded(grading_round, FLAWED, lesson))
    failed = {c.metadata["nbgrader"]["grade_id"] for c in graded_nb.cells
              if c.metadata.get("nbgrader", {}).get("grade_id", "").startswith("check_")
              and any(o.output_type == "error" for o in c.get("outputs", []))}
    # The test that asserts nothing may also fail its exercise's hardening cell; that cell scores nothing either way.
    failed -= {f"check_{flaws(lesson)[1].function}_hardening"}
    assert lesson.optional_exercises and failed == {f"check_{e.name}" for e in lesson.optional_exercises}, (
        f"unsolved extensions' check cells should fail (and score nothing): {sorted(failed)}")
    errors = {c.source: [o.ename for o in c.outputs if o.output_type == "error"]
              for c in graded_nb.cells if c.cell_type == "code"}
    assert "CellTimeoutError" in errors[HANG_CELL] and errors[RAISE_CELL] == ["RuntimeError"], (
        f"the broken cells should fail on their own: {errors[HANG_CELL]}, {errors[RAISE_CELL]}")


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_a_flawed_module_loses_exactly_the_cells_its_flaws_break(lesson):
    """Every lesson's flawed submission without executing its notebook: its module, graded by the checks the
    scored grade cells run, fails exactly the typical mistake's cell, a hidden one, and, where the lesson has
    a test-writing exercise, the cell of the test that asserts nothing (another one). The round shows nbgrader
    scoring such cells on lesson 14's notebook."""
    typical_mistake, no_op_test = flaws(lesson)
    module = module_from_source(flawed_source(typical_mistake, no_op_test), f"flawed_{lesson.lesson_id}",
                                f"<flawed {lesson.name}>")
    passed = {r.check for e in grade_exercises(lesson, module) for r in e.checks if r.status == PASS}
    lost = {grade_id for grade_id, _, names in scored_cells(lesson) if not set(names) <= passed}
    breaking = [typical_mistake] + ([no_op_test] if no_op_test is not None else [])
    expected = [grade_cell_running(lesson, m.caught_by) for m in breaking]
    assert expected[0].startswith("hidden_") and len(set(expected)) == len(expected), (
        f"the typical mistake should lose a hidden cell, the no-op test another: {expected}")
    assert lost == set(expected), f"grade cells the flaws lose\n  ACTUAL:   {sorted(lost)}\n  EXPECTED: {expected}"


@pytest.mark.parametrize("lesson", ASSIGNMENT_NOTEBOOKS, ids=lambda n: n.name)
def test_the_untouched_stubs_lose_every_scored_cell(lesson, tmp_path):
    """Every lesson's untouched release without executing its notebook: the stubs, graded by the checks the scored
    grade cells run, pass none of them, so every scored cell scores 0. The round shows nbgrader scoring the
    untouched notebook of lesson 14."""
    stubs = untouched_impl(tmp_path / "impl") / lesson.module_file
    module = module_from_source(stubs.read_text(encoding="utf-8"), f"untouched_{lesson.lesson_id}",
                                f"<untouched {lesson.name}>")
    passed = {r.check for e in grade_exercises(lesson, module) for r in e.checks if r.status == PASS}
    scoring = {grade_id: names for grade_id, _, names in scored_cells(lesson)}
    kept = sorted(grade_id for grade_id, names in scoring.items() if set(names) <= passed)
    assert scoring and not kept, f"scored cells the stubs pass: ACTUAL {kept}, EXPECTED none"


def test_grade_class_scores_every_cell_like_autograde(grading_round, tmp_path):
    """``python -m course grade-class --every-cell`` on the round's lesson-14 submissions (the reference, the
    untouched release and the flawed one with its hanging and raising cells), in a copy of the course whose
    gradebook forgot autograde's results: the same score in every grade cell as ``nbgrader autograde`` gave, and
    the same cells showing a figure or an error (what the feedback shows); ``nbgrader generate_feedback`` and
    ``nbgrader export`` then work on it unchanged."""
    from nbgrader.api import Gradebook

    lesson = next(lesson for lesson in ASSIGNMENT_NOTEBOOKS if lesson.lesson_id == FLAWED_IN)
    students = sorted(grading_round.expected[lesson.name])
    course = shutil.copytree(grading_round.course_dir, tmp_path / "course",
                             ignore=shutil.ignore_patterns("autograded", "feedback", "grades.csv"))

    def scores(course_dir: Path) -> dict:
        with Gradebook(f"sqlite:///{course_dir / 'gradebook.db'}") as gradebook:
            return {student: {g.name: g.score for g in gradebook.find_submission_notebook(
                lesson.name, lesson.name, student).grades} for student in students}

    autograde = scores(grading_round.course_dir)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for student in students:
            gradebook.remove_submission(lesson.name, student)
    done = subprocess.run([sys.executable, "-m", "course", "grade-class", lesson.lesson_id, str(course / "submitted"),
                           "--jobs", "2", "--every-cell"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0 and not done.stderr, (
        f"grade-class exited {done.returncode}:\n{done.stdout}{done.stderr}")
    ours = scores(course)
    assert ours == autograde, (f"scores per grade cell\n  ACTUAL (grade-class): {ours}\n  EXPECTED (autograde): "
                               f"{autograde}\nlikely cause: a cell grade-class skips or times out differently")
    for student in students:   # --every-cell: the feedback has what autograde's has, figures and check cells
        shown = {where: _shown(read(where / "autograded" / student / lesson.name / f"{lesson.name}.ipynb"))
                 for where in (course, grading_round.course_dir)}
        assert shown[course] == shown[grading_round.course_dir], (
            f"{student}: cells showing a figure / an error\n  ACTUAL (grade-class): {shown[course]}\n  EXPECTED "
            f"(autograde): {shown[grading_round.course_dir]}")
    nbgrader(course, "generate_feedback", lesson.name)
    nbgrader(course, "export")
    for student in students:
        assert (course / "feedback" / student / lesson.name / f"{lesson.name}.html").is_file(), student
    with open(course / "grades.csv", newline="", encoding="utf-8") as handle:
        exported = {row["student_id"]: float(row["score"]) for row in csv.DictReader(handle)
                    if row["assignment"] == lesson.name and row["student_id"] in students}
    assert exported == {s: sum(cells.values()) for s, cells in autograde.items()}, exported


def _shown(nb) -> tuple[list, list]:
    """(cells showing a figure, cells showing an error) of an autograded notebook, by index."""
    outputs = [c.get("outputs", []) for c in nb.cells]
    return ([i for i, cell in enumerate(outputs) if any("image/png" in o.get("data", {}) for o in cell)],
            [i for i, cell in enumerate(outputs) if any(o.output_type == "error" for o in cell)])


def test_validate_tells_a_student_the_solved_notebook_passes(grading_round, tmp_path):
    """The README's ``nbgrader validate FILE.ipynb`` on a solved notebook, as a student runs it before
    handing in (one lesson: autograde already scored every lesson's reference submission in full)."""
    lesson = ASSIGNMENT_NOTEBOOKS[1]
    solved = grading_round.course_dir / "submitted" / "reference" / lesson.name / f"{lesson.name}.ipynb"
    student_copy = tmp_path / solved.name
    shutil.copy(solved, student_copy)
    out = nbgrader(grading_round.course_dir, "validate", str(student_copy))
    assert "Success! Your notebook passes all the tests." in out, out[-3000:]


def test_exchange_round_trip_release_fetch_submit_collect(course_dir, tmp_path):
    """The README's hand-out and hand-in commands through a local nbgrader exchange directory:
    release_assignment -> (student) fetch_assignment, submit -> collect lands in submitted/. It runs in a
    copy of the course so that the grading round never grades the collected notebook."""
    lesson = ASSIGNMENT_NOTEBOOKS[0]
    course = shutil.copytree(course_dir, tmp_path / "course",
                             ignore=shutil.ignore_patterns("submitted", "autograded", "feedback"))
    exchange = f"--Exchange.root={tmp_path / 'exchange'}"
    (tmp_path / "exchange").mkdir()
    nbgrader(course, "release_assignment", lesson.name, exchange)
    student_home = tmp_path / "student"
    student_home.mkdir()
    fetch = run_nbgrader(student_home, "fetch_assignment", lesson.name, "--course=minimind-course", exchange,
                         timeout=300)
    assert fetch.returncode == 0, fetch.stdout + fetch.stderr
    fetched = student_home / lesson.name / f"{lesson.name}.ipynb"
    assert fetched.is_file(), f"fetch_assignment did not write {fetched}"
    submit = run_nbgrader(student_home, "submit", lesson.name, "--course=minimind-course", exchange, timeout=300)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    nbgrader(course, "collect", lesson.name, exchange)
    # The exchange names the submitter after the OS user.
    collected = course / "submitted" / getpass.getuser() / lesson.name / f"{lesson.name}.ipynb"
    assert collected.is_file(), f"collect did not write {collected}"
