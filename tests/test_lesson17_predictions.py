"""Lesson 17 §6.4 answers §4.1's predictions with labs/lesson17_predictions.py: the output printed in both lesson
texts must be what the lab prints now, and its numbers must follow from the rules the lesson states (upstream's
mask: the think block, the answer and the end marker; the merged newline; a truncated span to the end; strict=False
loading nothing; weights 1 / (K n_k) and 1 / N), computed here independently of the lab."""
from __future__ import annotations

import pytest
from prediction_labs import lesson_texts, prediction_lab, printout_tests, text_id

from course.minimind.sft import EMPTY_THINK_BLOCK
from course.runs import session_model
from course.runs.sft import upstream_tokenizer

LAB = prediction_lab("17")
LESSONS = lesson_texts("17")
lab_output, test_lesson_prints_what_the_lab_prints = printout_tests("17", "§6.4")


@pytest.mark.parametrize("lesson", LESSONS, ids=text_id)
def test_predictions_are_asked_before_they_are_answered(lesson):
    text = lesson.read_text(encoding="utf-8")
    asked, answered = text.index('<a id="l17-predictions"></a>'), text.index('<a id="l17-check-predictions"></a>')
    assert asked < text.index("### 5.1 ") < answered, "§4.1 asks before the exercises, §6.4 answers after them"
    for answer in ("1/288", "15.9", "[1, 1388, 570, 811, 1925]", "3 different prompts"):
        assert answer not in text[:text.index("<details>")], f"{lesson.name} gives away {answer!r} before it asks"


def ids(text: str) -> list[int]:
    return upstream_tokenizer()(text, add_special_tokens=False).input_ids


def test_answers_follow_the_rules_of_the_lesson(lab_output):
    think, answer, end = ids(EMPTY_THINK_BLOCK), ids("Red."), ids("<|im_end|>\n")
    keys = len(session_model().state_dict())
    params = len(list(session_model().parameters()))
    counts = [72, 7, 15, 111]
    expected_lines = [
        f"{len(think) + len(answer) + len(end)} targets",
        f"the answer's own text: {len(answer)} of them; the first target id {think[0]}, the last two {end[0]} and "
        f"{end[1]}",
        "removed (upstream: 80 % of samples): 0 targets",
        f"the assistant turn opens with {ids('<|im_start|>assistant')+ ids(chr(10) + ' ')[:1]}",
        "the long question, cut before its answer: 0 targets",
        "loss / K nan",
        f"missing {keys} keys, unexpected {keys}; parameters equal to the file's 0 of {params}, to a fresh model's "
        f"{params}",
        "the model unchanged True",
        f"loss / K: one target weighs {', '.join(f'1/{4 * n}' for n in counts)}; the sparsest's "
        f"{max(counts) / min(counts):.1f} times the densest's",
        f"token-weighted: one target weighs 1/{sum(counts)} in each",
    ]
    missing = [line for line in expected_lines if line not in lab_output]
    assert not missing, f"lab output lacks\n  EXPECTED: {missing}\n  ACTUAL:\n{lab_output}"
