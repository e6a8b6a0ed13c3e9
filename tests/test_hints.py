"""The hint ladder: ``python -m course hint NN EXERCISE`` shows one hint more each time (the idea, where to look,
the rule, a near-solution), remembers it in a local file, and ``check`` reports how many were used; the notebook
names the hint command (and the answer command) under each exercise."""
from __future__ import annotations

import json

import pytest

from course.checks import LESSONS, get_lesson, hints
from course.checks.assignments import build_source
from course.cli import main


@pytest.fixture
def hints_file(tmp_path, monkeypatch):
    path = tmp_path / "hints.json"
    monkeypatch.setenv(hints.HINTS_FILE_VARIABLE, str(path))
    return path


def test_each_call_shows_the_next_hint_and_remembers_it(hints_file, capsys):
    ladder = get_lesson("14").hints["cosine_lr"]
    for level in range(1, len(hints.LEVELS) + 2):   # one call past the last hint keeps showing the last
        assert main(["hint", "14", "cosine_lr"]) == 0
        out = capsys.readouterr().out
        shown = min(level, len(hints.LEVELS))
        assert f"hint {shown} of {len(hints.LEVELS)} ({hints.LEVELS[shown - 1]})" in out, out
        assert ladder[shown - 1][:60] in " ".join(out.split()), out
    assert json.loads(hints_file.read_text())["14"]["cosine_lr"] == len(hints.LEVELS)
    assert main(["hint", "14", "cosine_lr", "--reset"]) == 0
    assert hints.used("14") == {}


def test_again_repeats_and_the_report_counts_hints(hints_file, capsys):
    main(["hint", "14", "should_step_optimizer"])
    main(["hint", "14", "should_step_optimizer"])
    capsys.readouterr()
    main(["hint", "14", "should_step_optimizer", "--again"])
    assert "hint 2 of 4" in capsys.readouterr().out
    assert main(["check", "14", "--impl", "reference", "--only", "should_step_optimizer"]) == 0
    out = capsys.readouterr().out
    assert "hints used: should_step_optimizer 2/4" in out, out
    main(["check", "14", "--impl", "reference", "--only", "should_step_optimizer", "--json"])
    assert json.loads(capsys.readouterr().out)["hints_used"] == {"should_step_optimizer": 2}


def test_unknown_exercise_and_broken_file_are_clear_errors(hints_file, capsys):
    assert main(["hint", "14", "no_such_exercise"]) == 2
    assert "exercise must be one of" in capsys.readouterr().err
    hints_file.write_text("not json")
    assert main(["hint", "14", "cosine_lr"]) == 2
    err = capsys.readouterr().err
    assert str(hints_file) in err and "delete it" in err, err


def test_a_ladder_needs_every_level():
    with pytest.raises(ValueError, match="needs 4 hints"):
        hints.validate("14", {"cosine_lr": ("only the idea",)}, get_lesson("14").exercises)
    with pytest.raises(ValueError, match="not one of its exercises"):
        hints.validate("14", {"nope": ("a", "b", "c", "d")}, get_lesson("14").exercises)


@pytest.mark.parametrize("lesson", sorted(LESSONS.values(), key=lambda l: l.lesson_id), ids=lambda l: l.lesson_id)
def test_the_notebook_points_to_the_hints_and_the_answer_under_each_exercise(lesson, tmp_path):
    import nbformat
    nb = nbformat.read(build_source(lesson, tmp_path), as_version=4)
    ids = [cell.id for cell in nb.cells]
    for exercise, ladder in lesson.hints.items():
        position = ids.index(f"hints-{exercise}")
        assert ids[position - 1] == exercise, f"the hints of {exercise} should follow its cell, not {ids[position - 1]}"
        text = nb.cells[position].source
        section = lesson.exercise(exercise).section_number
        for command in (f"python -m course hint {lesson.lesson_id} {exercise}",
                        f"python -m course answer {lesson.lesson_id} {section}"):
            assert command in text, f"ACTUAL {text!r}\nEXPECTED it to name `{command}`"
        assert not any(hint in text for hint in ladder), f"a hint stands in the notebook's markdown: {text!r}"


@pytest.mark.parametrize("lesson", sorted(LESSONS.values(), key=lambda l: l.lesson_id), ids=lambda l: l.lesson_id)
def test_every_exercise_has_a_ladder(lesson):
    """Every exercise of every lesson, optional extensions included, has its four hints: what moved out of the
    stub docstrings (the formula, the order, the trick) must be reachable one level at a time."""
    missing = [e.name for e in lesson.exercises if e.name not in lesson.hints]
    assert not missing, f"lesson {lesson.lesson_id}: no hint ladder for {missing} (HINTS in its hints.py)"
    hints.validate(lesson.lesson_id, lesson.hints, lesson.exercises)
