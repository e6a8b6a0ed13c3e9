"""Lesson 14 beyond its checks (those run in tests/test_lesson_checks.py): the alignment report that
``python -m course align 14`` prints, for each implementation, the hints of failure messages and the host-sync
counter."""
from __future__ import annotations

import pytest
import torch

from mistake_results import mistake_result

from course.checks import get_lesson
from course.checks.framework import expect_equal
from course.checks.host_syncs import count_host_syncs
from course.checks.lesson14.loop_hints import aux_backward_hint, loss_hint, norm_hint, update_hint
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
    message = failure_message(mistake_name)
    assert hint in message, f"{mistake_name}\n  ACTUAL: {message}\n  EXPECTED: ...{hint}..."


def failure_message(mistake_name: str) -> str:
    mistake = next(m for m in LESSON.mistakes if m.name == mistake_name)
    check = next(c for c in LESSON.checks if c.name == mistake.caught_by)
    result = mistake_result(mistake)
    assert result.status == "FAIL", f"{mistake_name}: {check.name} says {result.status}"
    return result.message


@pytest.mark.parametrize("mistake_name, rule", [
    ("clip_before_unscale", "clipping the still-scaled gradients: unscale first"),
    ("no_tail_flush", "the tail flush is missing"),
    ("tail_flush_from_iters", "never from iters"),
    ("skipped_update_not_closed", "a skipped update still closes its window"),
    ("overflow_never_reported", "report overflow_skipped=True there"),
    ("tail_overflow_not_reported", "in the tail flush too"),
    ("overflow_on_scale_growth", "a scale that grows (after growth_interval clean updates) is no skip"),
    ("lr_only_at_optimizer_steps", "at EVERY micro-step"),
    ("schedule_ignores_epoch", "the schedule restarts every epoch"),
    ("ignores_start_step", "micro-steps continue after a resume"),
    ("lr_in_first_group_only", "EVERY optimizer.param_groups entry"),
    ("scaler_none_enabled", "scaler=None means a DISABLED GradScaler"),
    ("tail_flush_not_marked", "tail_flush=True"),
    ("grad_norm_zero_without_update", "grad_norm is None where no update closed"),
    ("zero_grad_keeps_zeros", "every .grad is None, not a tensor of zeros"),
    ("k_checked_by_scale_loss", "check every argument before touching the loader"),
    ("off_by_one_step", "a window closes on its K-th micro-step"),
    ("flush_ignores_start_step", "this call ran no micro-step"),
    ("flush_counts_windows_from_start_step", "windows count from micro-step 1 of the epoch"),
    ("hardcoded_base_lr", "proportional to the caller's base_lr"),
    ("skipped_norm_recorded_finite", "a skipped update records inf or nan"),
    ("tail_flush_on_last_boundary", "never a window closed on its K-th micro-step"),
    ("clip_first_group_only", "not one param group's"),
    ("host_copy_every_micro_step", "a host copy (cpu) per micro-step"),
    ("numpy_every_micro_step", "a host copy (numpy) per micro-step"),
    ("scaler_none_for_cuda", "the loop emits no warnings"),
])
def test_a_broken_rule_is_named(mistake_name, rule):
    """Each catalogued mistake of an ordering or bookkeeping rule fails with a hint that names the rule it
    breaks (the docstrings state rules, not recipes: the failure must point back at the rule)."""
    message = failure_message(mistake_name)
    assert rule in message, f"{mistake_name}\n  ACTUAL: {message}\n  EXPECTED: ...{rule}..."


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


def test_host_copies_are_counted_but_a_move_to_the_training_device_is_not():
    """.cpu() and .numpy() count on any tensor (graded on the CPU, they copy from an accelerator on a GPU); a .to()
    that leaves a CPU tensor on the CPU (.to(device) of a batch) does not; each method is restored afterwards."""
    calls = []
    with count_host_syncs(calls):
        loss = torch.tensor(2.0)
        loss.cpu(), loss.numpy(), loss.to("cpu"), loss.to(torch.float64), loss.item()
    assert calls == ["cpu", "numpy", "item"], calls
    loss.cpu()
    assert calls == ["cpu", "numpy", "item"], "the counter must stop counting when the block ends"
