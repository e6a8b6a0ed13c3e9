"""Lesson 14 §6.5 answers §3's predictions with labs/lesson14_predictions.py: the output printed in both
lesson texts must be what the lab prints now, and its update positions and rates must follow from the
rules the lesson states (s mod K, the tail flush, the cosine formula), computed here independently."""
from __future__ import annotations

import contextlib
import io
import math

import pytest

from course.implementations import REPO_ROOT, load_module

LAB = load_module(REPO_ROOT / "labs" / "lesson14_predictions.py", "predictions_lab")
COMMAND = "python labs/lesson14_predictions.py"
LESSONS = [REPO_ROOT / "course" / "lessons" / "14_lr_grad_accum_amp.md",
           REPO_ROOT / "course" / "lessons" / "zh" / "14_lr_grad_accum_amp.md"]


@pytest.fixture(scope="module")
def lab_output() -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        LAB.main()
    return out.getvalue()


def printed_output(lesson) -> str:
    """The ```text block that follows the lab's ```bash command in ``lesson``."""
    text = lesson.read_text(encoding="utf-8")
    after = text[text.index(f"```bash\n{COMMAND}\n```"):]
    start = after.index("```text\n") + len("```text\n")
    return after[start:after.index("```", start)]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.parent.name + "/" + p.name)
def test_lesson_prints_what_the_lab_prints(lab_output, lesson):
    assert printed_output(lesson) == lab_output, (
        f"{lesson.relative_to(REPO_ROOT)} §6.5 is stale\n  ACTUAL (lab):\n{lab_output}\n  EXPECTED (lesson):\n"
        f"{printed_output(lesson)}")


def cosine(s: int, total: int, base_lr: float = 5e-4) -> float:
    return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * s / total)))


def test_answers_follow_the_rules_of_the_lesson(lab_output):
    updates_of_10 = [s for s in range(1, 11) if s % 4 == 0] + ([10] if 10 % 4 else [])
    expected_lines = [
        f"the loop's micro-steps run s = 1..20: first lr {cosine(1, 20):.8f}, last lr {cosine(20, 20):.8f}",
        f"updates close at micro-steps {updates_of_10} (tail flush at [10]); AdamW step count {len(updates_of_10)}",
        "micro-steps run 0, optimizer steps 0, weights unchanged True",
        f"scale 65536.0 -> {65536.0 / 2}; weights unchanged True; AdamW step count 0",
        f"epoch 0 update at micro-step 4: lr {cosine(4, 12):.8f}",
        f"epoch 0 update at micro-step 6: lr {cosine(6, 12):.8f}",
    ]
    missing = [line for line in expected_lines if line not in lab_output]
    assert not missing, f"lab output lacks\n  EXPECTED: {missing}\n  ACTUAL:\n{lab_output}"
