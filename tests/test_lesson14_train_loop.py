"""Lesson 14 beyond its checks (those run in tests/test_lesson_checks.py): the alignment report that
``python -m course align 14`` prints, for each implementation, and the hints of failure messages."""
from __future__ import annotations

import pytest

from course.checks import get_lesson
from course.checks.framework import expect_equal, run_check
from course.checks.lesson14.loop import aux_backward_hint, loss_hint, norm_hint, update_hint
from course.runs.scenarios import LOOP_BASE

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


@pytest.mark.parametrize("mistake_name, hint", [
    ("zero_grad_every_micro_step", "are gradients zeroed every micro-step"),
    ("records_scaled_loss", "record the unscaled loss"),
    ("loss_loses_graph", "did the scaled loss lose its graph"),
    ("empty_epoch_crashes", "return [] early"),
    ("forgets_aux_loss", "the aux loss is not in the loss"),
    ("aux_not_in_backward", "the aux loss is not in the backward"),
    ("stale_lr_in_tail_flush", "a stale lr in the tail flush"),
    ("no_clipping", "no clipping to grad_clip"),
    ("host_sync_every_micro_step", "convert them once at its end"),
    ("epochs_checked_by_epoch", "check epochs itself"),
])
def test_failures_hint_at_the_likely_cause(mistake_name, hint):
    """Numeric failures whose numbers point at a known cause say so (the mistake is built from the reference,
    the message from the check; neither computes the other)."""
    mistake = next(m for m in LESSON.mistakes if m.name == mistake_name)
    check = next(c for c in LESSON.checks if c.name == mistake.caught_by)
    result = run_check(check, mistake.build())
    assert hint in result.message, f"{mistake_name}\n  ACTUAL: {result.message}\n  EXPECTED: ...{hint}..."


def test_no_hint_when_the_ratio_points_nowhere():
    """A norm off by an unrelated factor, or K = 1, gets no guess."""
    assert norm_hint(1.0, 1.1, 4) == "" and norm_hint(0.25, 1.0, 1) == "" and loss_hint(None, 8.0, 4) == ""
    assert "zeroed" in norm_hint(0.3, 1.0, 4) and "divided by K" in norm_hint(4.0, 1.0, 4)


def test_no_cause_named_where_nothing_points_at_one():
    """No aux loss in the run, or a large difference: no aux guess; no tail flush before and no clipped update:
    no update guess."""
    dense = [{"aux_loss": 0.0}]
    moe = [{"aux_loss": 1e-3}]
    assert aux_backward_hint(1.001, 1.0, dense) == "" and aux_backward_hint(1.5, 1.0, moe) == ""
    assert "not in the backward" in aux_backward_hint(1.001, 1.0, moe)
    unclipped = [{"epoch": 0, "step": 4, "update_closed": True, "tail_flush": False, "grad_norm": 0.5}]
    assert update_hint(LOOP_BASE, unclipped, 1) == "" and update_hint(LOOP_BASE, unclipped, 0) == ""
    assert "no clipping" in update_hint(LOOP_BASE.with_(grad_clip=0.1), unclipped, 1)
