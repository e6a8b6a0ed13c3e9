"""Lesson 15 §4.1 asks four predictions; lesson §6.5 runs labs/lesson15_predictions.py, and the answers text's
§4.1 (``python -m course answer 15 4.1``) shows its printout. The printout in both answers texts must be what the
lab prints now, the lesson texts must ask without answering, and the lab's answers must follow from the rules
the lesson states (batches of the epoch minus the skipped ones, the floored rescale, DistributedSampler's
round-robin shards, fp16's 11 significant bits, the atomic save), computed here independently."""
from __future__ import annotations

import math
import re

import pytest
from prediction_labs import answers_texts, lab_command, lesson_texts, printout_tests, text_id

from course.lesson_texts import section_text


COMMAND = lab_command("15")
lab_output, test_answers_print_what_the_lab_prints = printout_tests("15", "answers §4.1")


@pytest.mark.parametrize("lesson", lesson_texts("15"), ids=text_id)
def test_the_lesson_asks_the_predictions_and_runs_the_lab_without_answering(lesson, lab_output):
    """§4.1 asks, §6.5 runs the lab's command and points at the answers; no line of the lab's printout, no answer
    block, stands in the lesson text."""
    asked, checked = section_text(lesson, "4.1"), section_text(lesson, "6.5")
    assert "SkipBatchSampler(range(11), batch_size=4, skip_batches=s)" in asked, "§4.1 must ask prediction 1"
    assert f"```bash\n{COMMAND}\n```" in checked and "python -m course answer 15 4.1" in checked, checked
    text = lesson.read_text(encoding="utf-8")
    shown = [line.strip() for line in lab_output.splitlines()
             if re.search(r"\d", line) and line.strip() in text]
    assert not shown, f"{text_id(lesson)} shows the lab's answers: {shown}"
    assert "[[8, 9, 10]]" not in text and "<details>" not in text


@pytest.mark.parametrize("answers", answers_texts("15"), ids=text_id)
def test_the_answers_show_the_printout_under_the_section_that_asks(answers):
    """``python -m course answer 15 4.1`` prints the lab's command, its printout and the reasoning."""
    section = section_text(answers, "4.1")
    assert section is not None, f"{text_id(answers)} has no section 4.1"
    assert f"```bash\n{COMMAND}\n```" in section and "[[8, 9, 10]]" in section, section[:500]
    assert re.search(r"(?m)^4\. ", section), "the section must answer all four predictions"


def epoch_minus_skip(n: int, batch_size: int, skip: int):
    batches = [list(range(start, min(start + batch_size, n))) for start in range(0, n, batch_size)]
    return batches[skip:] if skip <= len(batches) else None


def test_sampler_and_rescale_answers_follow_the_rules(lab_output):
    expected = []
    for skip in (2, 3, 4):
        batches = epoch_minus_skip(11, 4, skip)
        expected.append(f"s = {skip}: ValueError (skip_batches)" if batches is None
                        else f"s = {skip}: {batches}, len {len(batches)}")
    per_rank = 2
    for saved, step, world in ((2, 6, 3), (2, 3, 4)):
        new_step = step * saved // world
        # round-robin shards of one shuffled order: step s on W ranks consumed its first s * W * bs samples
        twice = step * saved * per_rank - new_step * world * per_rank
        expected.append(f"saved at step {step} by {saved} ranks, loaded on {world}: step {new_step}; "
                        f"samples trained twice {twice}, never trained 0")
    missing = [line for line in expected if line not in lab_output]
    assert not missing, f"lab output lacks\n  EXPECTED: {missing}\n  ACTUAL:\n{lab_output}"


def test_fp16_answer_is_a_rounding_that_stays(lab_output):
    at_load, after, exact = map(float, re.search(
        r"interrupted run\| = ([\d.e+-]+)\n.*uninterrupted\| = ([\d.e+-]+) \(the fp32 checkpoint: ([\d.e+-]+)\)",
        lab_output).groups())
    assert exact == 0.0
    # fp16 keeps 11 significant bits: rounding moves a weight in [1, 2) by at most half its spacing 2 ** -10
    assert 0.0 < at_load <= 2.0 ** -11, at_load
    assert after == pytest.approx(at_load, rel=0.05), "the gap neither closes nor grows much (answers §4.1, 3)"


def test_crash_answers(lab_output):
    reference = re.search(r"save_checkpoint \(reference\)\s+files \['resume.pth'\], (\d+) of (\d+) bytes, "
                          r"unchanged True, loads yes", lab_output)
    direct = re.search(r"torch.save onto the path\s+files \['resume.pth'\], (\d+) of (\d+) bytes, unchanged False, "
                       r"loads no", lab_output)
    assert reference and direct, lab_output
    assert reference.group(1) == reference.group(2) == direct.group(2)
    assert int(direct.group(1)) < int(direct.group(2)) / 1000, "no tensor bytes were written before the crash"
    assert math.isclose(int(direct.group(2)) / 1e6, 4.55, abs_tol=0.005), "the 4.55 MB checkpoint of lesson §4.1"
