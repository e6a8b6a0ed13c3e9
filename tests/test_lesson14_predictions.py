"""Lesson 14 §6.5 answers §3's predictions with labs/lesson14_predictions.py: the output printed in both
lesson texts must be what the lab prints now, and its update positions and rates must follow from the
rules the lesson states (s mod K, the tail flush, the cosine formula), computed here independently."""
from __future__ import annotations

import math
import re

import pytest
from prediction_labs import printout_tests


lab_output, test_lesson_prints_what_the_lab_prints = printout_tests("14", "§6.5")


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
