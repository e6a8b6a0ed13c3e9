"""A lesson's "predict, then verify" lab: what it prints, and the printout its answers text shows for it (the
lesson asks the predictions; the answers, ``python -m course answer NN SECTION``, show what the lab measured). The
lessons' prediction tests (tests/test_lessonNN_predictions.py) compare the two and recompute the answers."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from course.checks import get_lesson
from course.doc_outputs import mismatches
from course.implementations import REPO_ROOT, load_module


def prediction_lab(lesson_id: str):
    """The lesson's lab module, labs/lessonNN_predictions.py."""
    return load_module(REPO_ROOT / "labs" / f"lesson{lesson_id}_predictions.py", f"lesson{lesson_id}_predictions_lab")


def lab_command(lesson_id: str) -> str:
    """The lab's command as the lessons show it."""
    return f"python labs/lesson{lesson_id}_predictions.py"


def printout(lab) -> str:
    """What the lab's main() prints, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        lab.main()
    return out.getvalue()


def lesson_texts(lesson_id: str) -> list[Path]:
    files = get_lesson(lesson_id).files()
    return [files["lesson text (en)"], files["lesson text (zh)"]]


def answers_texts(lesson_id: str) -> list[Path]:
    files = get_lesson(lesson_id).files()
    return [files["answers (en)"], files["answers (zh)"]]


def printed_output(lesson: Path, command: str) -> str:
    """The ```text block that follows the lab's ```bash command in ``lesson`` (a lesson's answers text)."""
    text = lesson.read_text(encoding="utf-8")
    after = text[text.index(f"```bash\n{command}\n```"):]
    start = after.index("```text\n") + len("```text\n")
    return after[start:after.index("```", start)]


def assert_shows_the_printout(lesson: Path, command: str, printout: str, section: str) -> None:
    """Every line the lab prints is shown, its numbers within course/doc_outputs.py's tolerances."""
    shown = printed_output(lesson, command)
    problems = mismatches(shown.splitlines(), printout, complete=True)
    assert not problems, (f"{lesson.relative_to(REPO_ROOT)} {section} is stale:\n" + "\n".join(problems)
                          + f"\n  ACTUAL (lab):\n{printout}\n  EXPECTED (lesson):\n{shown}")


def text_id(lesson: Path) -> str:
    return lesson.relative_to(REPO_ROOT / "course" / "lessons").as_posix()


def printout_tests(lesson_id: str, section: str):
    """A prediction test module's module fixture ``lab_output`` (the lab's printout, made once) and its test
    that both answers texts (en, zh) show that printout after the lab's command, in ``section``."""
    lab, command = prediction_lab(lesson_id), lab_command(lesson_id)

    @pytest.fixture(scope="module")
    def lab_output() -> str:
        return printout(lab)

    @pytest.mark.parametrize("lesson", answers_texts(lesson_id), ids=text_id)
    def test_lesson_prints_what_the_lab_prints(lab_output, lesson):
        assert_shows_the_printout(lesson, command, lab_output, section)
    return lab_output, test_lesson_prints_what_the_lab_prints
