"""Lesson 15 §6.5 answers §4.1's predictions with labs/lesson15_predictions.py: the output printed in both
lesson texts must be what the lab prints now, and its answers must follow from the rules the lesson states
(batches of the epoch minus the skipped ones, the floored rescale, DistributedSampler's round-robin shards,
fp16's 11 significant bits, the atomic save), computed here independently."""
from __future__ import annotations

import math
import re

import pytest
from prediction_labs import lab_command, lesson_texts, printout_tests, text_id


COMMAND = lab_command("15")
LESSONS = lesson_texts("15")
lab_output, test_lesson_prints_what_the_lab_prints = printout_tests("15", "§6.5")


@pytest.mark.parametrize("lesson", LESSONS, ids=text_id)
def test_predictions_are_asked_before_they_are_answered(lesson):
    """The answers (the lab's command and its output) come after the predictions, not in the principles."""
    text = lesson.read_text(encoding="utf-8")
    asked = text.index("SkipBatchSampler(range(11)")
    assert asked < text.index(f"```bash\n{COMMAND}\n```"), "the predictions must come before the lab's answers"
    assert "[[8, 9, 10]]" not in text[:text.index(f"```bash\n{COMMAND}\n```")]


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
    assert after == pytest.approx(at_load, rel=0.05), "the gap neither closes nor grows much (§6.5 answer 3)"


def test_crash_answers(lab_output):
    reference = re.search(r"save_checkpoint \(reference\)\s+files \['resume.pth'\], (\d+) of (\d+) bytes, "
                          r"unchanged True, loads yes", lab_output)
    direct = re.search(r"torch.save onto the path\s+files \['resume.pth'\], (\d+) of (\d+) bytes, unchanged False, "
                       r"loads no", lab_output)
    assert reference and direct, lab_output
    assert reference.group(1) == reference.group(2) == direct.group(2)
    assert int(direct.group(1)) < int(direct.group(2)) / 1000, "no tensor bytes were written before the crash"
    assert math.isclose(int(direct.group(2)) / 1e6, 4.55, abs_tol=0.005), "the 4.55 MB checkpoint of §4.1"
