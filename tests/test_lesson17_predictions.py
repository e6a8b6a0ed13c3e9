"""Lesson 17 §4.1 asks six predictions; lesson §6.4 runs labs/lesson17_predictions.py, and the answers text's §4.1
(``python -m course answer 17 4.1``) shows its printout. The printout in both answers texts must be what the lab
prints now, the lesson texts must ask without answering, and the lab's numbers must follow from the rules the
lesson states (upstream's mask: the think block, the answer and the end marker; the merged newline; a truncated
span to the end; strict=False loading nothing; weights 1 / (K n_k) and 1 / N), computed here independently of the
lab."""
from __future__ import annotations

import re

import pytest
from prediction_labs import answers_texts, lab_command, lesson_texts, printout_tests, text_id

from course.lesson_texts import section_text
from course.minimind.sft import EMPTY_THINK_BLOCK
from course.runs import session_model
from course.runs.sft import upstream_tokenizer

COMMAND = lab_command("17")
ANSWERS = ("1/288", "15.9", "[1, 1388, 570, 811, 1925]", "3 different prompts")
lab_output, test_answers_print_what_the_lab_prints = printout_tests("17", "answers §4.1")


@pytest.mark.parametrize("lesson", lesson_texts("17"), ids=text_id)
def test_the_lesson_asks_the_predictions_and_runs_the_lab_without_answering(lesson, lab_output):
    """§4.1 asks before the exercises, §6.4 runs the lab's command after them and points at the answers; no line of
    the lab's printout and none of its answers stands in the lesson text."""
    text = lesson.read_text(encoding="utf-8")
    asked, checked = section_text(lesson, "4.1"), section_text(lesson, "6.4")
    assert text.index('<a id="l17-predictions"></a>') < text.index("### 5.1 ") < \
        text.index('<a id="l17-check-predictions"></a>'), "§4.1 asks before the exercises, §6.4 checks after them"
    assert "torch.compile" in asked and re.search(r"(?m)^6\. ", asked), "§4.1 must ask all six predictions"
    assert f"```bash\n{COMMAND}\n```" in checked and "python -m course answer 17 4.1" in checked, checked
    shown = [line.strip() for line in lab_output.splitlines() if re.search(r"\d", line) and line.strip() in text]
    given = [answer for answer in ANSWERS if answer in text]
    assert not shown and not given and "<details>" not in text, (
        f"{text_id(lesson)} gives the lab's answers away: lines {shown}, answers {given}")


@pytest.mark.parametrize("answers", answers_texts("17"), ids=text_id)
def test_the_answers_show_the_printout_under_the_section_that_asks(answers):
    """``python -m course answer 17 4.1`` prints the lab's command, its printout and the reasoning of each of the
    six predictions."""
    section = section_text(answers, "4.1")
    assert section is not None, f"{text_id(answers)} has no section 4.1"
    missing = [answer for answer in ANSWERS if answer not in section]
    assert f"```bash\n{COMMAND}\n```" in section and not missing, f"section 4.1 lacks {missing}:\n{section[:500]}"
    explained = section[section.rindex("```"):]
    assert re.search(r"(?m)^6\. ", explained), "the section must explain all six predictions after the printout"


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
