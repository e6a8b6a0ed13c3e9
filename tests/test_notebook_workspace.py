"""The notebook route has no trap (README "Two routes, same grading"): a student works in a copy of the release
that no command regenerates (``python -m course workspace``), ``release`` refuses to write over a release that
holds work, ``check --notebook`` grades a notebook without a browser, and a notebook's failures name their cause
(an exercise not yet done, a cell that did not define its function)."""
from __future__ import annotations

import json
import shutil
import sys
import traceback

import pytest

from course import cli
from course.checks import LESSONS, assignments
from course.checks.assignments import build_source, holds_work, release_all
from course.checks.notebook import notebook_module_source, run_checks
from course.experiments import figures
from course.layout import NOTEBOOKS_DIR

LESSON = LESSONS["14"]


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    folder = tmp_path / "workspace"
    monkeypatch.setattr(assignments, "WORKSPACE_DIR", folder)
    return folder


def test_workspace_copies_the_release_once_and_never_over_a_copy(workspace, capsys):
    assert cli.main(["workspace", "14"]) == 0
    copy = workspace / LESSON.files()["notebook release"].name
    assert copy.read_bytes() == LESSON.files()["notebook release"].read_bytes()
    assert "copied the release to" in capsys.readouterr().out
    copy.write_text("{} my work", encoding="utf-8")
    assert cli.main(["workspace", "14"]) == 0
    assert copy.read_text(encoding="utf-8") == "{} my work", "the workspace copy was overwritten"
    assert "never overwritten" in capsys.readouterr().out


def worked_copy(tmp_path, edit) -> tuple:
    """A course directory whose lesson-14 release went through ``edit`` (a student's work on it)."""
    course_dir = tmp_path / "course"
    release = course_dir / LESSON.files()["notebook release"].relative_to(NOTEBOOKS_DIR)
    release.parent.mkdir(parents=True)
    shutil.copy2(NOTEBOOKS_DIR / "nbgrader_config.py", course_dir)
    notebook = json.loads(LESSON.files()["notebook release"].read_text(encoding="utf-8"))
    edit(notebook)
    release.write_text(json.dumps(notebook), encoding="utf-8")
    return course_dir, release


def run_a_cell(notebook):
    notebook["cells"][1]["execution_count"] = 1


def write_an_exercise(notebook):
    cell = next(c for c in notebook["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    cell["source"] = "def cosine_lr(current_step, total_steps, base_lr):\n    return base_lr\n"


def test_a_generated_release_holds_no_work():
    assert not holds_work(LESSON.files()["notebook release"])


@pytest.mark.parametrize("edit", [run_a_cell, write_an_exercise], ids=lambda e: e.__name__)
def test_release_refuses_to_write_over_work(tmp_path, edit):
    course_dir, release = worked_copy(tmp_path, edit)
    before = release.read_bytes()
    assert holds_work(release)
    with pytest.raises(ValueError, match="hold work .* python -m course workspace copies it"):
        release_all(course_dir, ["14"])
    assert release.read_bytes() == before and not (course_dir / "source").exists(), "something was written"


def test_check_notebook_grades_a_solved_notebook_and_an_untouched_one(tmp_path, capsys):
    shutil.copy2(NOTEBOOKS_DIR / "nbgrader_config.py", tmp_path)
    solved = build_source(LESSON, tmp_path)   # the source notebook: every exercise cell holds the reference
    assert cli.main(["check", "14", "--notebook", str(solved), "--jobs", "1"]) == 0, capsys.readouterr().out
    assert cli.main(["check", "14", "--notebook", str(LESSON.files()["notebook release"]), "--jobs", "1",
                     "--only", "cosine_lr"]) == 1
    printed = capsys.readouterr().out
    assert "cosine_lr" in printed and "TODO" in printed, printed


def test_check_notebook_reports_a_cell_that_raises(tmp_path, capsys):
    _, release = worked_copy(tmp_path, lambda nb: nb["cells"].append(
        {"cell_type": "code", "metadata": {}, "source": "helper = undefined_name\n", "outputs": [],
         "execution_count": None}))
    assert "helper = undefined_name" in notebook_module_source(release)
    assert cli.main(["check", "14", "--notebook", str(release), "--jobs", "1"]) == 1
    printed = capsys.readouterr().out
    assert "cannot import the implementation: NameError: name 'undefined_name' is not defined" in printed, printed


def test_a_grade_cell_names_a_function_its_cell_did_not_define():
    with pytest.raises(AssertionError, match="cosine_lr is not defined in this notebook: run its exercise cell"):
        run_checks({"torch": None}, "14", "cosine_lr_matches_get_lr")


def test_a_figure_cell_names_the_unfinished_exercise(monkeypatch, capsys):
    handlers = {}

    class Shell:
        def set_custom_exc(self, kinds, handler):
            handlers.update(dict.fromkeys(kinds, handler))

    monkeypatch.setattr("IPython.get_ipython", lambda: Shell())
    figures.explain_unfinished_exercises()

    def cosine_lr(current_step, total_steps, base_lr):
        raise NotImplementedError()

    try:
        cosine_lr(0, 10, 1.0)
    except NotImplementedError as error:
        handlers[NotImplementedError](None, NotImplementedError, error, error.__traceback__)
    message = capsys.readouterr().err
    assert "needs `" in message and "cosine_lr`, which still raises NotImplementedError: finish its exercise" in message, \
        message
