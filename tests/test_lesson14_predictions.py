"""Lesson 14 §3 asks six predictions; lesson §6.5 runs labs/lesson14_predictions.py, and the answers text's §3
(``python -m course answer 14 3``) shows its printout. The printout in both answers texts must be what the lab
prints now, the lesson texts must ask without answering (no printout line, no answer block, none of the
conditions and formulas the exercises ask for), and the lab's update positions and rates must follow from the
rules the lesson states (1-based windows of K, the tail flush, the schedule of get_lr), computed here
independently."""
from __future__ import annotations

import math
import re

import pytest
from prediction_labs import answers_texts, lab_command, lesson_texts, printout_tests, text_id

from course.lesson_texts import section_text


COMMAND = lab_command("14")
lab_output, test_answers_print_what_the_lab_prints = printout_tests("14", "answers §3")

# What the exercises ask the student to derive, as a lesson text would give it away: the update and flush
# conditions (s mod K, step % K), the schedule's coefficients, the disabled scaler of §5.5's question.
SOLUTION_EXPRESSIONS = re.compile(r"\\bmod|\bmod K\b|%\s*(?:K|args\.accumulation_steps|accumulation_steps)\b"
                                  r"|0\.45|enabled=False")


def cosine(s: int, total: int, base_lr: float = 5e-4) -> float:
    return base_lr * (0.1 + 0.45 * (1 + math.cos(math.pi * s / total)))


@pytest.mark.parametrize("lesson", lesson_texts("14"), ids=text_id)
def test_the_lesson_asks_the_predictions_and_runs_the_lab_without_answering(lesson, lab_output):
    """§3 asks, §6.5 runs the lab's command and points at the answers; no line of the lab's printout, no answer
    block and no solution expression stands in the lesson text."""
    asked, checked = section_text(lesson, "3"), section_text(lesson, "6.5")
    assert "`start_step = iters = 6`" in asked and "1.1439" in asked, "§3 must ask predictions 3 and 6"
    assert "python -m course answer 14 3" in asked, "§3 must point at its answers"
    assert f"```bash\n{COMMAND}\n```" in checked and "python -m course answer 14 3" in checked, checked
    text = lesson.read_text(encoding="utf-8")
    shown = [line.strip() for line in lab_output.splitlines() if re.search(r"\d", line) and line.strip() in text]
    assert not shown, f"{text_id(lesson)} shows the lab's answers: {shown}"
    assert "<details>" not in text, f"{text_id(lesson)} holds an answer block"
    given_away = [m.group() for m in SOLUTION_EXPRESSIONS.finditer(text)]
    assert not given_away, f"{text_id(lesson)} states what an exercise asks for: {given_away}"


@pytest.mark.parametrize("answers", answers_texts("14"), ids=text_id)
def test_the_answers_show_the_printout_under_the_section_that_asks(answers):
    """``python -m course answer 14 3`` prints the lab's command, its printout and the six answers."""
    section = section_text(answers, "3")
    assert section is not None, f"{text_id(answers)} has no section 3"
    assert f"```bash\n{COMMAND}\n```" in section and "updates close at micro-steps" in section, section[:500]
    assert re.search(r"(?m)^6\. ", section), "the section must answer all six predictions"


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


def test_clipping_before_unscaling_answers_follow_section_1_5(lab_output):
    """Prediction 6: clipping the still-scaled gradients records scale x the true norm, and the step then uses
    a gradient of norm grad_clip / scale (§1.5's reasoning, computed here from the lab's own numbers)."""
    numbers = re.search(r"scale ([\d.]+)\n.*unscale -> clip: norm recorded ([\d.]+), norm the step uses ([\d.]+)\n"
                        r".*clip -> unscale: norm recorded ([\d.]+), norm the step uses ([\d.e+-]+)", lab_output)
    assert numbers, lab_output
    scale, true_norm, right_step, wrong_recorded, wrong_step = map(float, numbers.groups())
    assert scale == 65536.0 and true_norm > 1.0, "the scenario should clip in the right order too"
    assert right_step == pytest.approx(1.0, rel=1e-4)
    assert wrong_recorded == pytest.approx(scale * true_norm, rel=1e-4)   # true_norm is printed to 4 decimals
    assert wrong_step == pytest.approx(1.0 / scale, rel=1e-3)
