"""Lesson 14 beyond its checks (those run in tests/test_lesson_checks.py): the alignment report that
``python -m course align 14`` prints, for each implementation."""
from __future__ import annotations

import pytest

from course.checks import get_lesson
from course.checks.framework import expect_equal

LESSON = get_lesson("14")
# MiniMind's get_lr minus cosine_lr at six steps of a 20-step run, loss 8 over K=4, K=4 over 8 micro-steps.
EXPECTED_REPORT = [f"lr_step_{s}_diff=0.000000000000" for s in (0, 1, 5, 10, 19, 20)] + [
    "scaled_loss=2.000000", "optimizer_step_micro_steps=[4, 8]"]


def test_alignment_report(impl_module, impl_name):
    """Zero lr differences from get_lr, scaled_loss 2.0, optimizer steps at [4, 8]."""
    try:
        lines = LESSON.report(impl_module(LESSON))
    except NotImplementedError as exc:
        if impl_name == "reference":
            raise
        pytest.skip(f"TODO: {exc}")
    expect_equal("alignment report lines", lines, EXPECTED_REPORT)
