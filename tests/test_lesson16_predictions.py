"""Lesson 16 asks its predictions in §4.0 and answers them in its answers text (§4.0), which shows what
labs/lesson16_predictions.py prints: that output must be what the lab prints now, and its numbers must follow
from the rules the lesson states (weights 1 / (K n_k) and 1 / N, ceil(samples / global) updates normalised by
their own targets, resume at the last update boundary or at the next epoch, a skipped update advances nothing),
computed here independently."""
from __future__ import annotations

import math
import re

import pytest
from prediction_labs import answers_texts, lab_command, lesson_texts, prediction_lab, printout_tests, text_id

from course.runs import masked_micro_batches

LAB = prediction_lab("16")
COMMAND = lab_command("16")
LESSONS = lesson_texts("16")
ANSWERS = answers_texts("16")
lab_output, test_lesson_prints_what_the_lab_prints = printout_tests("16", "answers §4.0")
# lines of the lab's answers that neither lesson text may show: the lesson asks, the answers text answers
GIVEAWAYS = ("1/60", "normalization_units [120, 120, 60]", "dropped_microsteps 2", "scale=512.0")


@pytest.mark.parametrize("lesson", LESSONS, ids=text_id)
def test_the_lesson_asks_the_predictions_and_gives_no_answer(lesson):
    text = lesson.read_text(encoding="utf-8")
    asked, checked = text.index('<a id="l16-predictions"></a>'), text.index('<a id="l16-check-predictions"></a>')
    assert asked < text.index("### 4.1 ") < checked, "§4.0 asks before the exercises, §6.1 runs the lab after them"
    assert "python -m course answer 16 4.0" in text[asked:text.index("### 4.1 ")], "§4.0 points at its answers"
    assert COMMAND in text[checked:], "§6.1 runs the lab"
    for answer in GIVEAWAYS:
        assert answer not in text, f"{lesson.name} gives away {answer!r}: answers belong in the answers text"


@pytest.mark.parametrize("answers", ANSWERS, ids=text_id)
def test_the_answers_text_answers_them_under_4_0(answers):
    text = answers.read_text(encoding="utf-8")
    section = re.search(r"(?ms)^## 4\.0 .*?(?=^## )", text)
    assert section, f"{answers.name}: no '## 4.0' section"
    for answer in GIVEAWAYS:
        assert answer in section.group(0), f"{answers.name} §4.0 lacks {answer!r}"


def legacy_resume(step: int, batch_size: int = 6, accum: int = 4, samples: int = 100, epoch: int = 0) -> str:
    """Lesson 16 §5.4's rule: the epoch's end resumes at the next epoch, any other step at its last boundary."""
    global_batch = batch_size * accum
    if step == math.ceil(samples / batch_size):
        epoch, update, dropped = epoch + 1, 0, 0
    else:
        update, dropped = step // accum, step % accum
    return (f"step {step}: global_batch_size {global_batch}, epoch {epoch}, update_step_in_epoch {update}, "
            f"sample_position {update * global_batch}, dropped_microsteps {dropped}")


def test_answers_follow_the_rules_of_the_lesson(lab_output):
    counts = [int((b.labels[..., 1:] != -100).sum()) for b in masked_micro_batches(LAB.PREDICTION_CUTS)]
    k, n = len(counts), sum(counts)
    updates = math.ceil(20 / 8)
    samples = [min(8, 20 - 8 * u) for u in range(updates)]
    expected_lines = [
        f"K = {k} micro-batches holding {counts[0]} and {counts[1]} valid targets:",
        f"N = {n}",
        f"loss / K: weight of one target = 1/{k * counts[0]} (micro-batch 1), 1/{k * counts[1]} (micro-batch 2); "
        f"ratio {counts[0] // counts[1]}",
        f"token-weighted: weight of one target = 1/{n} (micro-batch 1), 1/{n} (micro-batch 2); ratio 1",
        "loss / K: equals one global-batch backward (atol 1e-6) False",
        "token-weighted: equals one global-batch backward (atol 1e-6) True, cosine 1.0000",
        f"updates {updates}: samples {samples}, micro-steps {[math.ceil(s / 2) for s in samples]}, "
        f"normalization_units {[15 * s for s in samples]}",
        f"optimizer_step after the epoch {updates}",
        *(legacy_resume(step) for step in (10, 16, 17)),
        "update 1: parameters_updated=True overflow_skipped=False optimizer_step=1 scale=1024.0 weights unchanged False",
        "update 2: parameters_updated=False overflow_skipped=True optimizer_step=1 scale=512.0 weights unchanged True",
        "update 3: parameters_updated=True overflow_skipped=False optimizer_step=2 scale=512.0 weights unchanged False",
        "after_update ran after updates [1, 3]",
    ]
    assert (k, counts) == (2, [30, 2]), counts
    missing = [line for line in expected_lines if line not in lab_output]
    assert not missing, f"lab output lacks\n  EXPECTED: {missing}\n  ACTUAL:\n{lab_output}"
